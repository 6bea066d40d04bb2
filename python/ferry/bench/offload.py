"""`ferry bench offload`: a training step whose activations wait in host memory,
ferry.torch.offload_activations beside PyTorch's save_on_cpu and no offload, in one
run (issue 31).

The model: transformers' LlamaForCausalLM built from a LlamaConfig (random weights,
nothing downloaded; SDPA attention), bf16 on cuda:0, SGD. A step: loss =
model(input_ids=ids, labels=ids).loss, backward, optimizer step, on --batch x --seq
random tokens.

Cases (--cases), one after another in this process, on the same model (its weights
and the seed reset before each; the GPU's cache, ferry's pinned pool and PyTorch's
pinned host cache emptied after each, the GPU's peak reset):

  none            no offload
  save_on_cpu     torch.autograd.graph.save_on_cpu(pin_memory=True)
  ferry           ferry.torch.offload_activations(): every eligible saved tensor
  ferry-overhead  offload_activations(max_overhead=0.1): what the link hides

Each case runs --warmup steps (ferry-overhead's first is its calibration, which
offloads nothing), then --repeats timed ones with the GPU synchronized around each:
the median step time (forward + backward + optimizer), its forward, backward and
optimizer parts (CUDA events), the peak GPU memory over the timed steps, bytes
offloaded per step (ferry's stats; "-" for save_on_cpu, which does not say), the
process's RSS growth over the timed steps (/proc/self/status VmRSS) and, for
ferry, the pinned pool's in-use and reserved bytes after them and the growth of
reserved bytes over them.

The link floor: ferry pinned memory <-> GPU rates measured in the same run (256 MiB
each way, best of 3, CUDA events) and the no-offload step's medians:

  floor = max(forward, B / d2h) + max(backward, B / h2d) + optimizer

B being ferry full's bytes offloaded per step: the step time full offload would
take if every copy hid behind its pass's compute. Each case's step time is shown
over it. "act. freed": (peak of none - peak of the case) / (peak of none - the
model's memory), the model's memory being what is allocated once the model and
optimizer are built (SGD: no state), before any step. GB = 1e9 bytes.
"""

from __future__ import annotations

import contextlib
import gc
import time

from ..errors import MeasurementError
from ..measure import median
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, choices_list, int_at_least, missing_module

CASES = ("none", "save_on_cpu", "ferry", "ferry-overhead")
MAX_OVERHEAD = 0.1  # the ferry-overhead case's budget: a tenth of the step
LR = 1e-4  # SGD's step: small, so the random model stays finite over every case's steps
SEED = 1234
RATE_BYTES = 256 << 20  # the pinned link rates' copy size
FLOOR = "link floor"
# Issue 31's targets on the GPU machine.
FLOOR_MAX = 1.15  # full offload: step <= this x the floor
SPEEDUP_MIN = 1.7  # full offload: >= this x faster than save_on_cpu
PEAK_SLACK = 0.05  # full offload: peak <= save_on_cpu's peak + this share of it
OVERHEAD_MAX = 1.10  # ferry-overhead: step <= this x none
FREED_MIN = 0.25  # ferry-overhead: frees at least this share of the activation memory
RSS_GROWTH_MAX = 0.01  # host memory flat: RSS growth over the timed steps <= this share


def link_floor(forward_s: float, backward_s: float, optimizer_s: float, offloaded_bytes: int,
               d2h_bytes_per_s: float, h2d_bytes_per_s: float) -> float:
    """The step time offloading `offloaded_bytes` could reach: each pass takes its
    compute or its copies' time at the pinned rate, whichever is longer."""
    return (max(forward_s, offloaded_bytes / d2h_bytes_per_s) + max(backward_s, offloaded_bytes / h2d_bytes_per_s)
            + optimizer_s)


def activation_freed(peak_none: int, peak_case: int, model_bytes: int) -> float | None:
    """The share of the no-offload step's activation memory (its peak over the
    model's own memory) that a case's lower peak freed; None where there is none."""
    activations = peak_none - model_bytes
    return (peak_none - peak_case) / activations if activations > 0 else None


def targets(res: dict, floor: float | None, model_bytes: int) -> list[tuple[str, str, str, bool]]:
    """Issue 31's targets that this run's cases allow checking: (what, measured,
    goal, met). res: {case: {"step_s", "peak_bytes", "rss_before", "rss_growth"}}."""
    out = []
    ferry, soc, none, over = (res.get(c) for c in ("ferry", "save_on_cpu", "none", "ferry-overhead"))
    if ferry and floor:
        x = ferry["step_s"] / floor
        out.append(("ferry: step over the link floor", f"{x:.2f}x", f"<= {FLOOR_MAX}x", x <= FLOOR_MAX))
    if ferry and soc:
        x = soc["step_s"] / ferry["step_s"]
        out.append(("ferry: faster than save_on_cpu", f"{x:.2f}x", f">= {SPEEDUP_MIN}x", x >= SPEEDUP_MIN))
        x = ferry["peak_bytes"] / soc["peak_bytes"] - 1
        out.append(("ferry: peak over save_on_cpu's", f"{x:+.1%}", f"<= +{PEAK_SLACK:.0%}", x <= PEAK_SLACK))
    if over and none:
        x = over["step_s"] / none["step_s"]
        out.append(("ferry-overhead: step over none", f"{x:.2f}x", f"<= {OVERHEAD_MAX}x", x <= OVERHEAD_MAX))
        freed = activation_freed(none["peak_bytes"], over["peak_bytes"], model_bytes)
        if freed is not None:
            out.append(("ferry-overhead: activation memory freed", f"{freed:.0%}", f">= {FREED_MIN:.0%}",
                        freed >= FREED_MIN))
    for case in ("ferry", "ferry-overhead"):
        r = res.get(case)
        if r and r.get("rss_before"):
            x = r["rss_growth"] / r["rss_before"]
            out.append((f"{case}: host RSS growth over the timed steps", f"{x:+.2%}", f"<= {RSS_GROWTH_MAX:.0%}",
                        x <= RSS_GROWTH_MAX))
    return out


def rss_bytes() -> int:
    """This process's resident memory (/proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # kB
    raise MeasurementError("/proc/self/status has no VmRSS line")


def pool_bytes(stats: dict, what: str) -> int:
    """A pinned pool's current `what` (in_use, reserved) over its small and huge kinds."""
    return sum(stats[kind][what]["current"] for kind in ("small", "huge"))


# ---- measuring (GPU) -----------------------------------------------------------

def build(torch, args):
    """The model (bf16, cuda:0, train mode), its SGD, the token batch, a CPU copy of
    the initial weights and the GPU memory they take before any step."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                                   num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                   num_key_value_heads=args.heads, max_position_embeddings=args.seq,
                                   tie_word_embeddings=False, use_cache=False)
    torch.manual_seed(SEED)
    with torch.device("cuda:0"):
        try:  # transformers 5: dtype=; 4.x: torch_dtype=
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                                  dtype=torch.bfloat16)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                                  torch_dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator(device="cuda:0").manual_seed(SEED)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda:0", generator=g)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    torch.cuda.synchronize()
    return model, opt, ids, initial, torch.cuda.memory_allocated(0)


def one_step(torch, model, opt, ids, ctx) -> tuple[float, list[float], float]:
    """Wall seconds of a step (GPU synchronized before and after), its forward,
    backward and optimizer seconds (CUDA events), and its loss."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ev[0].record()
    with ctx:
        loss = model(input_ids=ids, labels=ids).loss
        ev[1].record()
        loss.backward()
        ev[2].record()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ev[3].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return wall, [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(3)], loss.detach().item()


def case_context(torch, case: str, offload):
    """What a step's forward and backward run in: save_on_cpu is made anew each step."""
    if case == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return offload if offload is not None else contextlib.nullcontext()


def run_case(torch, case: str, model, opt, ids, initial: dict, args) -> dict:
    """Warm-up then timed steps of one case; its figures."""
    import ferry.torch as ft

    with torch.no_grad():
        model.load_state_dict(initial)
    torch.manual_seed(SEED)
    offload = None
    if case == "ferry":
        offload = ft.offload_activations()
    elif case == "ferry-overhead":
        offload = ft.offload_activations(max_overhead=MAX_OVERHEAD)

    pool = ft.default_pinned_pool(0)
    for _ in range(args.warmup):
        one_step(torch, model, opt, ids, case_context(torch, case, offload))
    torch.cuda.reset_peak_memory_stats(0)
    rss0, reserved0 = rss_bytes(), pool_bytes(pool.stats(), "reserved")
    walls, parts, loss = [], [], None
    for _ in range(args.repeats):
        wall, part, loss = one_step(torch, model, opt, ids, case_context(torch, case, offload))
        walls.append(wall)
        parts.append(part)
    r = {"step_s": median(walls), "forward_s": median([p[0] for p in parts]),
         "backward_s": median([p[1] for p in parts]), "optimizer_s": median([p[2] for p in parts]),
         "peak_bytes": torch.cuda.max_memory_allocated(0), "rss_before": rss0, "rss_growth": rss_bytes() - rss0,
         "loss": loss, "steps_s": walls}
    if offload is not None:
        stats = pool.stats()
        r.update(offloaded_bytes=offload.stats.last_step_offloaded_bytes, pinned_in_use=pool_bytes(stats, "in_use"),
                 pinned_reserved=pool_bytes(stats, "reserved"),
                 pinned_growth=pool_bytes(stats, "reserved") - reserved0, offload_stats=offload.stats.as_dict())
    offload = None
    release_memory(torch)
    return r


def release_memory(torch) -> None:
    """What a case cached goes before the next one, so that each case's host RSS
    starts from the model's: the GPU's cache, ferry's pinned pool and PyTorch's
    pinned host cache (save_on_cpu's, 35 GB at the default sizes; the call
    torch.cuda.graphs makes before a capture, where this PyTorch has it)."""
    import ferry.torch as ft
    from ferry.torch import _torch_private

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    ft.default_pinned_pool(0).trim()
    _torch_private.empty_host_cache()
    torch.cuda.reset_peak_memory_stats(0)


# ---- the suite -----------------------------------------------------------------

def check_model_shape(args) -> None:
    """Sizes a Llama cannot take, refused on any machine before anything runs."""
    from ..errors import InvalidArgumentError

    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        raise InvalidArgumentError(f"--hidden {args.hidden} / --heads {args.heads}: the head size must be a whole, "
                                   "even number (rotary embeddings pair its elements); e.g. --hidden 2048 --heads 16")


class OffloadSuite(Suite):
    key = "offload"
    description = ("a Llama training step with its activations in host memory: ferry offload_activations "
                   "beside save_on_cpu and no offload, over the link floor")

    def add_arguments(self, p):
        for name, default, what in (("hidden", 2048, "hidden size"), ("layers", 12, "decoder layers"),
                                    ("intermediate", 5632, "MLP size"), ("heads", 16, "attention heads"),
                                    ("vocab", 32000, "vocabulary"), ("batch", 8, "sequences a step"),
                                    ("seq", 2048, "tokens a sequence")):
            p.add_argument(f"--{name}", type=int_at_least(1), default=default, help=f"{what} (default: {default})")
        add_repeats(p, 6, "timed steps a case", old=("--steps",))
        p.add_argument("--warmup", type=int_at_least(2), default=2,
                       help="steps before the timed ones (default: 2; ferry-overhead's first is its calibration)")
        p.add_argument("--cases", type=choices_list(CASES), default=",".join(CASES),
                       help=f"which cases, comma-separated (default: {','.join(CASES)}; they run in that order)")

    def waived(self, args):
        check_model_shape(args)
        reasons = [why for why in (super().waived(args), missing_module("torch"), missing_module("transformers"))
                   if why]
        if not reasons:
            import torch

            if not torch.cuda.is_available():
                reasons.append(f"needs PyTorch with CUDA (torch {torch.__version__}: "
                               "torch.cuda.is_available() is False)")
        return "; ".join(reasons) or None

    def run(self, args) -> int:
        import torch

        from ..torch.offload_plan import measure_pinned_rates

        cases = [c for c in CASES if c in args.cases.split(",")]
        torch.cuda.set_device(0)
        progress(f"offload: building the model ({args.layers} layers, hidden {args.hidden}, "
                 f"batch {args.batch} x {args.seq} tokens)")
        model, opt, ids, initial, model_bytes = build(torch, args)
        d2h, h2d = measure_pinned_rates(torch, torch.device("cuda", 0), RATE_BYTES)
        progress(f"offload: ferry pinned d2h {d2h / 1e9:.1f} GB/s, h2d {h2d / 1e9:.1f} GB/s; "
                 f"model {model_bytes / 1e9:.2f} GB")
        release_memory(torch)
        res = {}
        for case in cases:
            progress(f"offload: {case}: {args.warmup} warm-up + {args.repeats} timed steps")
            res[case] = run_case(torch, case, model, opt, ids, initial, args)
        floor = None
        if "none" in res and "ferry" in res:
            n = res["none"]
            floor = link_floor(n["forward_s"], n["backward_s"], n["optimizer_s"], res["ferry"]["offloaded_bytes"],
                               d2h, h2d)
        else:
            progress("offload: no link floor (it needs the cases none and ferry)")
        params = {"hidden": args.hidden, "layers": args.layers, "intermediate": args.intermediate,
                  "heads": args.heads, "vocab": args.vocab, "batch": args.batch, "seq": args.seq,
                  "steps": args.repeats, "dtype": "bfloat16", "model_bytes": model_bytes}
        records = _records(self.key, params, res, floor, d2h, h2d, model_bytes)
        _print(res, floor, d2h, h2d, model_bytes)
        write_json(args.json, self.key, records.items, details={"cases": res, "model_bytes": model_bytes})
        return 0


def _records(key: str, params: dict, res: dict, floor, d2h: float, h2d: float, model_bytes: int) -> Records:
    """Every figure the tables show: step times against none (and ferry's against
    save_on_cpu, each against the floor), peaks, bytes, the link's rates."""
    out = Records(key)
    for direction, rate in (("d2h", d2h), ("h2d", h2d)):
        out.add("ferry pinned", "bandwidth", rate / 1e9, "GB/s", direction=direction, nbytes=RATE_BYTES)
    out.add("model", "gpu_memory", model_bytes, "bytes", **params)
    out.compare(params, "step_time", "s", {c: r["step_s"] for c, r in res.items()}, baseline="none")
    for metric, k in (("forward_time", "forward_s"), ("backward_time", "backward_s"),
                      ("optimizer_time", "optimizer_s")):
        out.compare(params, metric, "s", {c: r[k] for c, r in res.items()}, baseline="none")
    if "save_on_cpu" in res:
        for case in ("ferry", "ferry-overhead"):
            if case in res:
                out.add(case, "step_time_vs_save_on_cpu", res[case]["step_s"], "s",
                        baseline=res["save_on_cpu"]["step_s"], baseline_case="save_on_cpu", **params)
    if floor is not None:
        fp = dict(params, offloaded_bytes=res["ferry"]["offloaded_bytes"], d2h_gbps=d2h / 1e9, h2d_gbps=h2d / 1e9)
        out.add(FLOOR, "step_time", floor, "s", **fp)
        for case, r in res.items():
            out.add(case, "step_time_vs_floor", r["step_s"], "s", baseline=floor, baseline_case=FLOOR, **params)
    out.compare(params, "peak_gpu_memory", "bytes", {c: r["peak_bytes"] for c, r in res.items()}, baseline="none")
    for case, r in res.items():
        out.add(case, "host_rss_growth", r["rss_growth"], "bytes", **params)
        if "none" in res and case != "none":
            freed = activation_freed(res["none"]["peak_bytes"], r["peak_bytes"], model_bytes)
            if freed is not None:
                out.add(case, "activation_memory_freed", freed, "fraction", **params)
        if "offloaded_bytes" in r:
            for metric, k in (("offloaded_per_step", "offloaded_bytes"), ("pinned_in_use", "pinned_in_use"),
                              ("pinned_reserved", "pinned_reserved"), ("pinned_reserved_growth", "pinned_growth")):
                out.add(case, metric, r[k], "bytes", **params)
    return out


def _print(res: dict, floor, d2h: float, h2d: float, model_bytes: int) -> None:
    none = res.get("none")
    rows = []
    for case, r in res.items():
        freed = activation_freed(none["peak_bytes"], r["peak_bytes"], model_bytes) if none and case != "none" else None
        rows.append([case, r["step_s"], r["step_s"] / none["step_s"] if none else None,
                     r["step_s"] / floor if floor else None, r["forward_s"], r["backward_s"], r["peak_bytes"] / 1e9,
                     r["offloaded_bytes"] / 1e9 if "offloaded_bytes" in r else None,
                     f"{freed:.0%}" if freed is not None else None, r["rss_growth"] / 1e6,
                     f"{r['pinned_in_use'] / 1e6:.0f}/{r['pinned_reserved'] / 1e6:.0f}" if "pinned_in_use" in r
                     else None, r["loss"]])
    print(table(f"offload: a training step (median of the timed steps; model {model_bytes / 1e9:.2f} GB)",
                ["case", "step s", "x none", "x floor", "fwd s", "bwd s", "peak GPU GB", "offloaded GB/step",
                 "act. freed", "host RSS +MB", "pinned MB used/held", "loss"], rows))
    if floor is not None:
        n, b = res["none"], res["ferry"]["offloaded_bytes"]
        print(f"link floor: {floor:.3f} s = max(fwd {n['forward_s']:.3f} s, {b / 1e9:.2f} GB / d2h "
              f"{d2h / 1e9:.1f} GB/s)"
              f" + max(bwd {n['backward_s']:.3f} s, {b / 1e9:.2f} GB / h2d {h2d / 1e9:.1f} GB/s)"
              f" + optimizer {n['optimizer_s']:.3f} s")
    checks = targets(res, floor, model_bytes)
    if checks:
        print(table("issue 31's targets", ["target", "measured", "goal", "met"],
                    [[what, got, goal, "yes" if ok else "NO"] for what, got, goal, ok in checks]))


SUITE = OffloadSuite()
main = SUITE.main
