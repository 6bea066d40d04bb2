"""`ferry bench offload`: a training step whose activations wait in host memory,
ferry.torch.offload_activations beside PyTorch's save_on_cpu, torchtune's
OffloadActivations and no offload, in one run (issues 31 and 42).

The model (--model): transformers' LlamaForCausalLM built from a LlamaConfig (random
weights, nothing downloaded; SDPA attention), bf16 on cuda:0, SGD. "llama": the
bench's small Llama (hidden 2048, 12 layers, batch 8 x 2048); "8b": a Llama-8B-like
layer stack (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, vocabulary
128256, batch 1 x 4096; --layers as many as fit without offload: 32 on an 80 GB
H100). Any size flag given overrides the preset. A step: loss =
model(input_ids=ids, labels=ids).loss, backward, optimizer step.

Cases (--cases), one after another in this process, on the same model (its weights
and the seed reset before each; the GPU's cache, ferry's pinned pool and PyTorch's
pinned host cache emptied after each, the GPU's peak reset):

  none              no offload
  save_on_cpu       torch.autograd.graph.save_on_cpu(pin_memory=True)
  torchtune         torchtune.training.OffloadActivations(use_streams=True), where
                    torchtune is installed (else the case says so and is left out)
  ferry             ferry.torch.offload_activations(): every eligible saved tensor
  ferry-overhead-F  offload_activations(max_overhead=F), F in 0.03, 0.1, 0.25: what
                    the link carries by forward's peak, plus what F of the step buys

Each case runs --warmup steps (a ferry-overhead case runs two more: its first three
offload nothing, a warm-up, a step timed whole, one timed by pack; offload.py), then
--repeats timed ones with the GPU synchronized around each: the median step time
(forward + backward + optimizer), its forward, backward and optimizer parts (CUDA
events), the peak GPU memory over the timed steps (allocated, and reserved: the
caching allocator's, which holds a freed block until the copy out of it is done; the
cache is emptied after the warm-up, whose reservations, a budgeted case's planning
steps without offload among them, the allocator would keep), bytes offloaded per step
(ferry's stats), the process's RSS growth over the timed steps (/proc/self/status
VmRSS) and, for ferry, the pinned pool's in-use and reserved bytes between steps and
the growth of reserved bytes over them.

The link floor: ferry pinned memory <-> GPU rates measured in the same run (256 MiB
each way, best of 3, CUDA events) and the no-offload step's medians:

  floor = max(forward, B / d2h) + max(backward, B / h2d) + optimizer

B being ferry full's bytes offloaded per step: the step time full offload would
take if every copy hid behind its pass's compute. "act. freed": (peak of none - peak
of the case) / (peak of none - the model's memory), the model's memory being what is
allocated once the model and optimizer are built (SGD: no state), before any step.

The bound of a budgeted case (issue 42): the peak comes at the end of forward, so at
most what the link carries while forward runs, plus the overhead allowed, can have
left by then: (forward of none + F x step of none) x d2h, as a share of the
activation memory (at most all of it). "of bound": act. freed over it. GB = 1e9 bytes.
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

OVERHEADS = (0.03, 0.1, 0.25)  # the budgeted cases' max_overhead
CASES = ("none", "save_on_cpu", "torchtune", "ferry") + tuple(f"ferry-overhead-{f}" for f in OVERHEADS)
LR = 1e-4  # SGD's step: small, so the random model stays finite over every case's steps
SEED = 1234
RATE_BYTES = 256 << 20  # the pinned link rates' copy size
FLOOR = "link floor"
# The models --model names: each size flag's default.
MODELS = {
    "llama": {"hidden": 2048, "layers": 12, "intermediate": 5632, "heads": 16, "kv_heads": 16, "vocab": 32000,
              "batch": 8, "seq": 2048},
    "8b": {"hidden": 4096, "layers": 32, "intermediate": 14336, "heads": 32, "kv_heads": 8, "vocab": 128256,
           "batch": 1, "seq": 4096},
}
# Issues 31 and 42's targets on the GPU machine.
FLOOR_MAX = 1.05  # full offload: step <= this x the floor
SPEEDUP_MIN = 1.7  # full offload: >= this x faster than save_on_cpu
PEAK_SLACK = 0.05  # full offload: peak <= save_on_cpu's peak + this share of it
OVERHEAD_MAX = {0.03: 1.03, 0.1: 1.10}  # a budgeted case: step <= this x none
BOUND_MIN = 0.8  # a budgeted case: frees >= this share of its bound
RSS_GROWTH_MAX = 0.01  # host memory flat: RSS growth over the timed steps <= this share
PINNED_BETWEEN_MAX = 0.05  # pinned memory in use between steps <= this share of a step's offloaded bytes


def overhead_of(case: str) -> float | None:
    """F of a ferry-overhead-F case; None for the others."""
    return float(case.rsplit("-", 1)[1]) if case.startswith("ferry-overhead-") else None


def warmup_steps(case: str, warmup: int) -> int:
    """Steps before the timed ones: --warmup, plus a ferry-overhead case's steps that
    offload nothing but its timing step (offload.PLANNING_STEPS: warm-up, timed whole,
    timed by pack), which --warmup counts."""
    from ..torch.offload import PLANNING_STEPS

    return warmup + (PLANNING_STEPS - 1 if overhead_of(case) is not None else 0)


def bound_share(none: dict, overhead: float, d2h: float, model_bytes: int) -> float | None:
    """The share of the activation memory a budgeted case can free (the module's
    text): (forward + overhead x step, all of none) x d2h over the activations."""
    activations = none["peak_bytes"] - model_bytes
    if activations <= 0:
        return None
    return min(1.0, (none["forward_s"] + overhead * none["step_s"]) * d2h / activations)


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


def targets(res: dict, floor: float | None, model_bytes: int, d2h: float | None = None
            ) -> list[tuple[str, str, str, bool]]:
    """The issues' targets that this run's cases allow checking: (what, measured,
    goal, met). res: {case: {"step_s", "peak_bytes", "rss_before", "rss_growth", ...}}."""
    out = []
    ferry, soc, none = (res.get(c) for c in ("ferry", "save_on_cpu", "none"))
    if ferry and floor:
        x = ferry["step_s"] / floor
        out.append(("ferry: step over the link floor", f"{x:.2f}x", f"<= {FLOOR_MAX}x", x <= FLOOR_MAX))
    if ferry and soc:
        x = soc["step_s"] / ferry["step_s"]
        out.append(("ferry: faster than save_on_cpu", f"{x:.2f}x", f">= {SPEEDUP_MIN}x", x >= SPEEDUP_MIN))
        x = ferry["peak_bytes"] / soc["peak_bytes"] - 1
        out.append(("ferry: peak over save_on_cpu's", f"{x:+.1%}", f"<= +{PEAK_SLACK:.0%}", x <= PEAK_SLACK))
        if ferry.get("peak_reserved") and soc.get("peak_reserved"):
            # What decides whether a model fits: the caching allocator's reserved peak
            # (a block whose copy out is still running is not reusable yet).
            x = ferry["peak_reserved"] / soc["peak_reserved"] - 1
            out.append(("ferry: reserved peak over save_on_cpu's", f"{x:+.1%}", f"<= +{PEAK_SLACK:.0%}",
                        x <= PEAK_SLACK))
    for case, r in res.items():
        f = overhead_of(case)
        if f is None or not none:
            continue
        if f in OVERHEAD_MAX:
            x = r["step_s"] / none["step_s"]
            out.append((f"{case}: step over none", f"{x:.3f}x", f"<= {OVERHEAD_MAX[f]}x", x <= OVERHEAD_MAX[f]))
        freed = activation_freed(none["peak_bytes"], r["peak_bytes"], model_bytes)
        bound = bound_share(none, f, d2h, model_bytes) if d2h else None
        if freed is not None and bound:
            x = freed / bound
            out.append((f"{case}: freed over its bound", f"{freed:.1%} / {bound:.1%} = {x:.0%}",
                        f">= {BOUND_MIN:.0%}", x >= BOUND_MIN))
        if r.get("peak_reserved") and none.get("peak_reserved"):
            x = r["peak_reserved"] / none["peak_reserved"] - 1  # offloading must not make it grow
            out.append((f"{case}: reserved peak over none's", f"{x:+.1%}", "<= +0%", x <= 0))
    for case, r in res.items():
        if r.get("rss_before") and (case == "ferry" or overhead_of(case) is not None):
            x = r["rss_growth"] / r["rss_before"]
            out.append((f"{case}: host RSS growth over the timed steps", f"{x:+.2%}", f"<= {RSS_GROWTH_MAX:.0%}",
                        x <= RSS_GROWTH_MAX))
        if r.get("offloaded_bytes") and "pinned_in_use" in r:
            x = r["pinned_in_use"] / r["offloaded_bytes"]
            out.append((f"{case}: pinned in use between steps", f"{x:.1%} of a step's",
                        f"<= {PINNED_BETWEEN_MAX:.0%}", x <= PINNED_BETWEEN_MAX))
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
                                   num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
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


def torchtune_offload():
    """torchtune's OffloadActivations(use_streams=True), or None where torchtune is not installed."""
    try:
        from torchtune.training import OffloadActivations
    except ImportError:
        return None
    return OffloadActivations(use_streams=True)


def run_case(torch, case: str, model, opt, ids, initial: dict, args) -> dict | None:
    """Warm-up then timed steps of one case; its figures (None: the case cannot run here)."""
    import ferry.torch as ft

    offload = None
    if case == "torchtune":
        offload = torchtune_offload()
        if offload is None:
            progress("offload: torchtune: not installed (pip install torchtune): case left out")
            return None
    elif case == "ferry":
        offload = ft.offload_activations()
    elif overhead_of(case) is not None:
        offload = ft.offload_activations(max_overhead=overhead_of(case))
    with torch.no_grad():
        model.load_state_dict(initial)
    torch.manual_seed(SEED)

    pool = ft.default_pinned_pool(0)
    for _ in range(warmup_steps(case, args.warmup)):
        one_step(torch, model, opt, ids, case_context(torch, case, offload))
    # The warm-up's reservations go back: a budgeted case's planning steps offload
    # nothing and reserve what no offload does, which the caching allocator keeps.
    # The timed steps' reserved peak is then what an offloaded step itself needs.
    torch.cuda.synchronize(0)
    reserved_warm = torch.cuda.memory_reserved(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    rss0, reserved0 = rss_bytes(), pool_bytes(pool.stats(), "reserved")
    walls, parts, loss, moved = [], [], None, []
    for _ in range(args.repeats):
        wall, part, loss = one_step(torch, model, opt, ids, case_context(torch, case, offload))
        walls.append(wall)
        parts.append(part)
        moved.append(getattr(getattr(offload, "stats", None), "last_step_offloaded_bytes", 0))
    r = {"step_s": median(walls), "forward_s": median([p[0] for p in parts]),
         "backward_s": median([p[1] for p in parts]), "optimizer_s": median([p[2] for p in parts]),
         "peak_bytes": torch.cuda.max_memory_allocated(0), "peak_reserved": torch.cuda.max_memory_reserved(0),
         "rss_before": rss0, "rss_growth": rss_bytes() - rss0, "loss": loss, "steps_s": walls,
         "reserved_after_warmup": reserved_warm}
    stats = getattr(offload, "stats", None)
    if stats is not None and hasattr(stats, "last_step_offloaded_bytes"):  # ferry's
        pstats = pool.stats()
        r.update(offloaded_bytes=stats.last_step_offloaded_bytes, offloaded_per_step=moved, pinned_in_use=pool_bytes(pstats, "in_use"),
                 pinned_reserved=pool_bytes(pstats, "reserved"),
                 pinned_growth=pool_bytes(pstats, "reserved") - reserved0, offload_stats=stats.as_dict())
        cal = stats.calibration or {}
        if cal.get("planned_overhead_s") is not None:  # max_overhead's feedback (offload_plan.OverheadControl)
            measured = cal.get("measured_overhead_s")
            progress(f"offload: {case}: timed step {(cal['forward_s'] + cal['backward_s']) * 1e3:.1f} ms, "
                     f"overhead asked {cal['overhead_s'] * 1e3:.1f} ms, planned with "
                     f"{cal['planned_overhead_s'] * 1e3:.1f} ms, measured "
                     f"{'-' if measured is None else f'{measured * 1e3:.1f}'} ms (forward + backward); "
                     f"offloaded per timed step {min(moved) / 1e9:.2f}-{max(moved) / 1e9:.2f} GB")
        offload.close()
        r["pinned_after_close"] = pool_bytes(pool.stats(), "in_use")
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

def resolve_model(args) -> None:
    """Fills the size flags not given from --model's preset (MODELS)."""
    for name, value in MODELS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_model_shape(args) -> None:
    """Sizes a Llama cannot take, refused on any machine before anything runs."""
    from ..errors import InvalidArgumentError

    resolve_model(args)
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        raise InvalidArgumentError(f"--hidden {args.hidden} / --heads {args.heads}: the head size must be a whole, "
                                   "even number (rotary embeddings pair its elements); e.g. --hidden 2048 --heads 16")
    if args.heads % args.kv_heads:
        raise InvalidArgumentError(f"--heads {args.heads} / --kv-heads {args.kv_heads}: the attention heads must be "
                                   "a whole multiple of the KV heads")


class OffloadSuite(Suite):
    key = "offload"
    description = ("a Llama training step with its activations in host memory: ferry offload_activations "
                   "beside save_on_cpu and no offload, over the link floor")

    def add_arguments(self, p):
        p.add_argument("--model", choices=tuple(MODELS), default="llama",
                       help="the size flags' defaults: the bench's Llama or an 8B-like layer stack (default: llama)")
        for name, what in (("hidden", "hidden size"), ("layers", "decoder layers"), ("intermediate", "MLP size"),
                           ("heads", "attention heads"), ("kv_heads", "key/value heads"), ("vocab", "vocabulary"),
                           ("batch", "sequences a step"), ("seq", "tokens a sequence")):
            defaults = ", ".join(f"{m} {v[name]}" for m, v in MODELS.items())
            p.add_argument(f"--{name.replace('_', '-')}", type=int_at_least(1), default=None,
                           help=f"{what} (default: --model's, {defaults})")
        add_repeats(p, 6, "timed steps a case", old=("--steps",))
        p.add_argument("--warmup", type=int_at_least(2), default=2,
                       help="steps before the timed ones (default: 2; a ferry-overhead case's first is timed only)")
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
        resolve_model(args)
        torch.cuda.set_device(0)
        progress(f"offload: building the model ({args.model}: {args.layers} layers, hidden {args.hidden}, "
                 f"batch {args.batch} x {args.seq} tokens)")
        model, opt, ids, initial, model_bytes = build(torch, args)
        d2h, h2d = measure_pinned_rates(torch, torch.device("cuda", 0), RATE_BYTES)
        progress(f"offload: ferry pinned d2h {d2h / 1e9:.1f} GB/s, h2d {h2d / 1e9:.1f} GB/s; "
                 f"model {model_bytes / 1e9:.2f} GB")
        release_memory(torch)
        res = {}
        for case in cases:
            progress(f"offload: {case}: {warmup_steps(case, args.warmup)} warm-up + {args.repeats} timed steps")
            r = run_case(torch, case, model, opt, ids, initial, args)
            if r is not None:
                res[case] = r
        floor = None
        if "none" in res and "ferry" in res:
            n = res["none"]
            floor = link_floor(n["forward_s"], n["backward_s"], n["optimizer_s"], res["ferry"]["offloaded_bytes"],
                               d2h, h2d)
        else:
            progress("offload: no link floor (it needs the cases none and ferry)")
        params = {"model": args.model, "hidden": args.hidden, "layers": args.layers,
                  "intermediate": args.intermediate, "heads": args.heads, "kv_heads": args.kv_heads,
                  "vocab": args.vocab, "batch": args.batch, "seq": args.seq, "steps": args.repeats,
                  "dtype": "bfloat16", "model_bytes": model_bytes}
        records = _records(self.key, params, res, floor, d2h, h2d, model_bytes)
        _print(res, floor, d2h, h2d, model_bytes)
        write_json(args.json, self.key, records.items, details={"cases": res, "model_bytes": model_bytes})
        return 0


def _records(key: str, params: dict, res: dict, floor, d2h: float, h2d: float, model_bytes: int) -> Records:
    """Every figure the tables show: step times against none (and ferry's against
    save_on_cpu, each against the floor), peaks, bytes, the bounds, the link's rates."""
    out = Records(key)
    for direction, rate in (("d2h", d2h), ("h2d", h2d)):
        out.add("ferry pinned", "bandwidth", rate / 1e9, "GB/s", direction=direction, nbytes=RATE_BYTES)
    out.add("model", "gpu_memory", model_bytes, "bytes", **params)
    out.compare(params, "step_time", "s", {c: r["step_s"] for c, r in res.items()}, baseline="none")
    for metric, k in (("forward_time", "forward_s"), ("backward_time", "backward_s"),
                      ("optimizer_time", "optimizer_s")):
        out.compare(params, metric, "s", {c: r[k] for c, r in res.items()}, baseline="none")
    if "save_on_cpu" in res:
        for case in res:
            if case not in ("none", "save_on_cpu"):
                out.add(case, "step_time_vs_save_on_cpu", res[case]["step_s"], "s",
                        baseline=res["save_on_cpu"]["step_s"], baseline_case="save_on_cpu", **params)
    if floor is not None:
        fp = dict(params, offloaded_bytes=res["ferry"]["offloaded_bytes"], d2h_gbps=d2h / 1e9, h2d_gbps=h2d / 1e9)
        out.add(FLOOR, "step_time", floor, "s", **fp)
        for case, r in res.items():
            out.add(case, "step_time_vs_floor", r["step_s"], "s", baseline=floor, baseline_case=FLOOR, **params)
    out.compare(params, "peak_gpu_memory", "bytes", {c: r["peak_bytes"] for c, r in res.items()}, baseline="none")
    if all("peak_reserved" in r for r in res.values()):
        out.compare(params, "peak_gpu_reserved", "bytes", {c: r["peak_reserved"] for c, r in res.items()},
                    baseline="none")
    none = res.get("none")
    for case, r in res.items():
        out.add(case, "host_rss_growth", r["rss_growth"], "bytes", **params)
        if none and case != "none":
            freed = activation_freed(none["peak_bytes"], r["peak_bytes"], model_bytes)
            if freed is not None:
                out.add(case, "activation_memory_freed", freed, "fraction", **params)
            f = overhead_of(case)
            bound = bound_share(none, f, d2h, model_bytes) if f is not None else None
            if bound is not None:
                out.add(case, "activation_memory_bound", bound, "fraction", max_overhead=f, d2h_gbps=d2h / 1e9,
                        forward_s=none["forward_s"], **params)
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
        freed_reserved = (activation_freed(none["peak_reserved"], r["peak_reserved"], model_bytes)
                          if none and case != "none" and "peak_reserved" in r and "peak_reserved" in none else None)
        f = overhead_of(case)
        bound = bound_share(none, f, d2h, model_bytes) if none and f is not None else None
        rows.append([case, r["step_s"], r["step_s"] / none["step_s"] if none else None,
                     r["step_s"] / floor if floor else None, r["forward_s"], r["backward_s"], r["peak_bytes"] / 1e9,
                     r["peak_reserved"] / 1e9 if "peak_reserved" in r else None,
                     r["offloaded_bytes"] / 1e9 if "offloaded_bytes" in r else None,
                     f"{freed:.1%}" if freed is not None else None,
                     f"{freed_reserved:.1%}" if freed_reserved is not None else None,
                     f"{bound:.1%}" if bound is not None else None,
                     f"{freed / bound:.0%}" if bound and freed is not None else None, r["rss_growth"] / 1e6,
                     f"{r['pinned_in_use'] / 1e6:.0f}/{r['pinned_reserved'] / 1e6:.0f}" if "pinned_in_use" in r
                     else None, r["loss"]])
    print(table(f"offload: a training step (median of the timed steps; model {model_bytes / 1e9:.2f} GB; "
                f"pinned d2h {d2h / 1e9:.1f} GB/s, h2d {h2d / 1e9:.1f} GB/s)",
                ["case", "step s", "x none", "x floor", "fwd s", "bwd s", "peak GB", "peak rsv GB", "offl. GB",
                 "freed", "freed rsv", "bound", "of bound", "RSS +MB", "pinned MB used/held", "loss"], rows))
    if floor is not None:
        n, b = res["none"], res["ferry"]["offloaded_bytes"]
        print(f"link floor: {floor:.3f} s = max(fwd {n['forward_s']:.3f} s, {b / 1e9:.2f} GB / d2h "
              f"{d2h / 1e9:.1f} GB/s)"
              f" + max(bwd {n['backward_s']:.3f} s, {b / 1e9:.2f} GB / h2d {h2d / 1e9:.1f} GB/s)"
              f" + optimizer {n['optimizer_s']:.3f} s")
    if none:
        print(f"bound of a budgeted case F: (fwd {none['forward_s']:.3f} s + F x step {none['step_s']:.3f} s) x d2h "
              f"{d2h / 1e9:.1f} GB/s over activations {(none['peak_bytes'] - model_bytes) / 1e9:.2f} GB")
    checks = targets(res, floor, model_bytes, d2h)
    if checks:
        print(table("issues 31 and 42's targets", ["target", "measured", "goal", "met"],
                    [[what, got, goal, "yes" if ok else "NO"] for what, got, goal, ok in checks]))


SUITE = OffloadSuite()
main = SUITE.main
