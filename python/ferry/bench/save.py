"""`ferry bench save`: a state dict on the GPU to a durable file, ferry beside the
ways people checkpoint today, in one run.

State dicts (random, on GPU 0; --device cpu: in host memory): "transformer",
12 layers of bf16 4096x4096 q/k/v/o, 11008x4096 gate/up, 4096x11008 down and
two 4096-element norms (4.86 GB); "moe", 8 layers of 16 experts (bf16
1408x2048 gate/up/down), bf16 attention, fp32 routers and norms (~2.4 GB, ~450
tensors). --scale multiplies the layer counts.

Savers: `torch.save`; safetensors `save_file` from the GPU (the baseline), and
from a CPU copy made beforehand (not timed; with --device cpu one `save_file`,
the baseline); `torch.distributed.checkpoint.save` and `async_save` (one
process, a gloo group of one) where this PyTorch has them; ferry
`save_safetensors`; ferry `snapshot` + `Snapshot.save` (the snapshot reused:
`out=`), and the same with `non_blocking=True` (its "blocked s" is the time to
queue the copy; the copy itself runs on the stream before the next step's
work). Each file is fsynced before its time stops (the savers that do not
fsync get an fsync, counted).

First table, ferry beside dd (issue 39's target): `dd if=/dev/zero of=FILE
bs=32M count=N oflag=direct conv=fsync` of the state dict's bytes, then ferry
`save_safetensors` of the state dict from the GPU and of its CPU copy (same
bytes), in turn, each repeat, on the same disk; GB/s (dd: its own time,
fsync included; ferry: the whole call, fsync of the file and directory
included) and ferry's share of dd's rate. Target: the GPU save >= 95% of dd.
Needs dd and a file system that takes O_DIRECT (not tmpfs: use --dir).

Second table, columns: "blocked s", the time the caller (training) is blocked: the whole
save, or until `async_save` / `snapshot` return; "durable s", the time to
a durable file; GB/s of the state dict's bytes over "durable s"; "of disk",
that rate over the disk's own direct-write rate, measured in the same run
(dd O_DIRECT of --disk-bytes, as above);
"host MB", the peak anonymous memory the saver added (sampled every 5 ms,
warm-up included: a snapshot's pinned memory counts). Median of --repeats
after one warm-up. ferry's files are read back with safetensors and compared
bit for bit with the state dict.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time

from ..measure import median
from ..units import parse_size
from .load import PeakAnon
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, missing_module

SETS = ("transformer", "moe")
SAVERS = ("torch.save", "save_file (GPU)", "save_file (CPU)", "dcp.save", "dcp.async_save",
          "ferry save_safetensors", "ferry snapshot+save", "ferry snapshot(non_blocking)+save")
BASELINE = "save_file (GPU)"  # with --device cpu: CPU_BASELINE, the one save_file
CPU_BASELINE = "save_file"
DISK_CASE = "disk O_DIRECT write"  # dd (dd_direct_write) of --disk-bytes
DD_BLOCK = 32 << 20  # dd's bs: one 32 MiB O_DIRECT write at a time, as ferry's slots
# `ferry bench save`'s first table: ferry's save beside dd O_DIRECT of the same
# bytes, in one run, each repeat in this order (same disk, same moment).
DD = "dd O_DIRECT"
FERRY_GPU = "ferry save_safetensors (GPU tensors)"
FERRY_CPU = "ferry save_safetensors (CPU tensors)"
DD_TARGET = 0.95  # issue 39: a save from the GPU reaches at least 95% of dd O_DIRECT on the same disk


def transformer_set(layers: int) -> list[tuple[str, tuple, str]]:
    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{n}_proj.weight", (4096, 4096), "bfloat16") for n in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (11008, 4096), "bfloat16"),
                (p + "mlp.up_proj.weight", (11008, 4096), "bfloat16"),
                (p + "mlp.down_proj.weight", (4096, 11008), "bfloat16")]
        out += [(p + n, (4096,), "bfloat16") for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]
    return out


def moe_set(layers: int, experts: int = 16) -> list[tuple[str, tuple, str]]:
    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{n}_proj.weight", (2048, 2048), "bfloat16") for n in "qkvo"]
        out += [(p + "mlp.gate.weight", (experts, 2048), "float32")]
        for e in range(experts):
            q = p + f"mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (1408, 2048), "bfloat16"), (q + "up_proj.weight", (1408, 2048), "bfloat16"),
                    (q + "down_proj.weight", (2048, 1408), "bfloat16")]
        out += [(p + n, (2048,), "float32") for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]
    return out


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"'{text}': expected a positive number")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{text}': expected a positive integer")
    return v


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _choices(allowed):
    def parse(text: str) -> list[str]:
        vals = [x.strip() for x in text.split(",") if x.strip()]
        bad = [v for v in vals if not any(v in a for a in allowed)]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"'{text}': expected names (or parts of names) among {', '.join(allowed)}")
        return vals
    return parse


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a directory")
    return text


# ---- measuring ------------------------------------------------------------------

def dd_direct_write(directory: str, nbytes: int, block: int = DD_BLOCK) -> float | None:
    """GB/s of `dd if=/dev/zero of=FILE bs=32M count=N oflag=direct conv=fsync` in
    `directory` (N blocks: nbytes rounded up), by dd's own time (its fsync
    included); None where there is no dd or the file system refuses O_DIRECT."""
    count = max(1, -(-nbytes // block))
    path = os.path.join(directory, ".ferry-bench-dd")
    cmd = ["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}", "oflag=direct", "conv=fsync"]
    try:
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "LC_ALL": "C"})
        wall = time.perf_counter() - t0
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if r.returncode != 0:
        return None
    m = re.search(r"copied, ([0-9.eE+-]+) s", r.stderr)
    seconds = float(m[1]) if m else wall
    return count * block / max(seconds, 1e-9) / 1e9


def fsync_path(path: str) -> None:
    """fsync a file, or every file of a directory, and the directory holding it."""
    from .. import _ferry

    files = [os.path.join(path, n) for n in os.listdir(path)] if os.path.isdir(path) else [path]
    for f in files:
        if os.path.isfile(f):
            _ferry.sync_file(f)
    _ferry.sync_directory(os.path.dirname(path) or ".")


def verify(torch, path: str, sd_cpu: dict) -> None:
    """Reads path back with safetensors, compares bit for bit with the state dict."""
    from safetensors import safe_open

    with safe_open(path, "pt", device="cpu") as f:
        keys = set(f.keys())
        if keys != set(sd_cpu):
            raise AssertionError(f"save: {path} holds {len(keys)} tensors, the state dict {len(sd_cpu)}")
        for k, v in sd_cpu.items():
            got = f.get_tensor(k)
            if got.dtype != v.dtype or got.shape != v.shape or not torch.equal(got.view(-1).view(torch.uint8),
                                                                                 v.view(-1).view(torch.uint8)):
                raise AssertionError(f"save: {path}: tensor {k} came back different")


# ---- savers --------------------------------------------------------------------

def _sync(torch) -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _DCP:
    """torch.distributed.checkpoint in one process (a gloo group of one for async_save)."""

    def __init__(self, torch):
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.dist, self.dcp = dist, dcp
        self.why_not_async = None if hasattr(dcp, "async_save") else f"PyTorch {torch.__version__} has no async_save"
        self.own_group = False
        if self.why_not_async is None and not dist.is_initialized():
            try:
                store = dist.HashStore()
                dist.init_process_group("gloo", store=store, rank=0, world_size=1)
                self.own_group = True
            except Exception as e:  # noqa: BLE001 - reported as the row's reason
                self.why_not_async = f"no process group: {e}"

    def close(self):
        if self.own_group:
            self.dist.destroy_process_group()


def baseline(device: str) -> str:
    """The saver every other is compared with: save_file from where the state dict lives."""
    return BASELINE if device == "cuda" else CPU_BASELINE


def savers(torch, dcp_state: _DCP | None, device: str = "cuda"):
    """{name: fn(sd_gpu, sd_cpu, target, snap_box) -> (blocked s, durable s)}; target: a path to
    create (a file, or a directory for DCP). With device "cpu" the state dict is in host
    memory: one save_file (CPU_BASELINE), not a "GPU" and a "CPU" one of the same tensors."""
    import ferry.torch as ft

    def timed_sync(fn):
        def run(sd_gpu, sd_cpu, target, box):
            _sync(torch)
            t0 = time.perf_counter()
            fn(sd_gpu, sd_cpu, target)
            fsync_path(target)
            s = time.perf_counter() - t0
            return s, s
        return run

    def torch_save(g, c, target):
        torch.save(g, target)

    def st_gpu(g, c, target):
        from safetensors.torch import save_file

        save_file(g, target, metadata={"format": "pt"})

    def st_cpu(g, c, target):
        from safetensors.torch import save_file

        save_file(c, target, metadata={"format": "pt"})

    def ferry_save(g, c, target):
        ft.save_safetensors(g, target)

    def dcp_save(g, c, target):
        dcp_state.dcp.save(g, checkpoint_id=target)

    def dcp_async(sd_gpu, sd_cpu, target, box):
        _sync(torch)
        t0 = time.perf_counter()
        res = dcp_state.dcp.async_save(sd_gpu, checkpoint_id=target)
        blocked = time.perf_counter() - t0
        fut = getattr(res, "upload_completion", res)
        fut.result()
        fsync_path(target)
        return blocked, time.perf_counter() - t0

    def ferry_snapshot(sd_gpu, sd_cpu, target, box):
        _sync(torch)
        t0 = time.perf_counter()
        box["snap"] = ft.snapshot(sd_gpu, out=box.get("snap"))
        blocked = time.perf_counter() - t0
        box["snap"].save(target).wait()
        return blocked, time.perf_counter() - t0

    def ferry_snapshot_nb(sd_gpu, sd_cpu, target, box):
        _sync(torch)
        t0 = time.perf_counter()
        box["snap"] = ft.snapshot(sd_gpu, out=box.get("snap"), non_blocking=True)
        blocked = time.perf_counter() - t0
        box["snap"].save(target).wait()
        return blocked, time.perf_counter() - t0

    out = {"torch.save": timed_sync(torch_save), baseline(device): timed_sync(st_gpu)}
    if device == "cuda":
        out["save_file (CPU)"] = timed_sync(st_cpu)
    if dcp_state is not None:
        out["dcp.save"] = timed_sync(dcp_save)
        if dcp_state.why_not_async is None:
            out["dcp.async_save"] = dcp_async
    out["ferry save_safetensors"] = timed_sync(ferry_save)
    out["ferry snapshot+save"] = ferry_snapshot
    out["ferry snapshot(non_blocking)+save"] = ferry_snapshot_nb
    return out


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def run_saver(torch, name, fn, sd_gpu, sd_cpu, directory, repeats: int, check) -> dict:
    box: dict = {}
    blocked, durable = [], []
    target = os.path.join(directory, "dcp-checkpoint" if "dcp" in name else
                          "model.pt" if name == "torch.save" else "model.safetensors")
    with PeakAnon() as peak:
        for i in range(repeats + 1):  # the first run warms up
            _remove(target)
            b, d = fn(sd_gpu, sd_cpu, target, box)
            if i:
                blocked.append(b)
                durable.append(d)
        if check:
            verify(torch, target, sd_cpu)
    box.clear()
    _remove(target)
    return {"blocked_s": median(blocked), "durable_s": median(durable), "host_bytes": peak.added,
            "verified": bool(check)}


# ---- the suite -------------------------------------------------------------------

class SaveSuite(Suite):
    key = "save"
    description = "a GPU state dict to a durable file: ferry beside torch.save, safetensors and torch DCP"

    def add_arguments(self, p):
        p.add_argument("--dir", type=_directory, help="where to write (default: a new directory under $TMPDIR)")
        p.add_argument("--sets", type=_choices(SETS), default=list(SETS),
                       help=f"state dicts, comma-separated (default: {','.join(SETS)})")
        p.add_argument("--scale", type=_positive_float, default=1.0,
                       help="multiplies the layer counts (default: %(default)s)")
        add_repeats(p, 2, "timed saves per saver")
        p.add_argument("--savers", type=_choices(SAVERS), default=None,
                       help="only savers whose name contains one of these, comma-separated (default: all)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                       help="where the state dict lives (cpu: the savers' code on a machine without a GPU, "
                            "e.g. in CI; default: %(default)s)")
        p.add_argument("--disk-bytes", type=_size, default=4 << 30,
                       help="bytes of the disk's O_DIRECT write measurement (default: 4G)")

    def waived(self, args):
        why = super().waived(args) if args.device == "cuda" else None
        if why:
            return why
        return missing_module("torch", "safetensors")

    def run(self, args) -> int:
        import torch

        own_dir = args.dir is None
        directory = args.dir or tempfile.mkdtemp(prefix="ferry-bench-save-")
        records = Records(self.key)
        try:
            rows = _run(args, torch, directory, records)
        finally:
            if own_dir:
                shutil.rmtree(directory, ignore_errors=True)
        write_json(args.json, self.key, records.items, details={"rows": rows})
        return 0


def _state_dict(torch, spec, device) -> dict:
    g = torch.Generator(device=device).manual_seed(1)
    return {name: torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(getattr(torch, dt))
            for name, shape, dt in spec}


def _run(args, torch, directory, records: Records) -> list:
    """Measures every set with every saver, prints the table, fills records; the table's rows."""
    import ferry.torch as ft

    disk = dd_direct_write(directory, args.disk_bytes)
    progress(f"save: disk O_DIRECT write (dd) {disk:.2f} GB/s" if disk else
             "save: no dd O_DIRECT here (no dd, or this file system refuses O_DIRECT)")
    if disk:
        records.add(DISK_CASE, "bandwidth", disk, "GB/s", write_bytes=args.disk_bytes, tool="dd",
                    block_bytes=DD_BLOCK)
    versus_rows: list = []
    try:
        dcp_state = _DCP(torch)
    except ImportError as e:
        progress(f"save: no torch.distributed.checkpoint ({e})")
        dcp_state = None
    rows = []
    base_name = baseline(args.device)
    try:
        all_savers = savers(torch, dcp_state, args.device)
        chosen = {n: f for n, f in all_savers.items() if args.savers is None or any(s in n for s in args.savers)}
        for set_name in args.sets:
            layers = max(1, round((12 if set_name == "transformer" else 8) * args.scale))
            spec = transformer_set(layers) if set_name == "transformer" else moe_set(layers)
            sd_gpu = _state_dict(torch, spec, args.device)
            sd_cpu = {k: v.cpu() for k, v in sd_gpu.items()}
            nbytes = sum(v.numel() * v.element_size() for v in sd_gpu.values())
            params = {"set": set_name, "tensors": len(sd_gpu), "state_dict_bytes": nbytes, "layers": layers,
                      "repeats": args.repeats, "device": args.device}
            progress(f"save: {set_name}: {len(sd_gpu)} tensors, {nbytes / 1e9:.2f} GB")
            if disk and (args.savers is None or any(s in "ferry save_safetensors" for s in args.savers)):
                versus_rows += versus_dd(torch, records, params, sd_gpu, sd_cpu, nbytes, directory, args)
            results = {}
            for name, fn in chosen.items():
                progress(f"save: {set_name}: {name}")
                check = name.startswith("ferry") or name.startswith("save_file")
                try:
                    r = run_saver(torch, name, fn, sd_gpu, sd_cpu, directory, args.repeats, check)
                except AssertionError:
                    raise  # a wrong file is a failure of the bench, not a missing row
                except Exception as e:  # noqa: BLE001 - a peer that fails here is reported, not fatal
                    progress(f"save: {set_name}: {name} failed: {type(e).__name__}: {e}")
                    continue
                finally:
                    if name.startswith("ferry") and args.device == "cuda":
                        ft.default_pinned_pool(0).trim()  # the next saver starts without ferry's cached memory
                r["gbps"] = nbytes / r["durable_s"] / 1e9
                results[name] = r
            base = results.get(base_name)
            for name, r in results.items():
                rows.append([set_name, name, r["blocked_s"], r["durable_s"], r["gbps"],
                             r["gbps"] / disk if disk else None,
                             base["durable_s"] / r["durable_s"] if base else None, r["host_bytes"] / 1e6,
                             "yes" if r["verified"] else "-"])
            _records(records, params, results, disk, base_name)
            if dcp_state is not None and dcp_state.why_not_async is not None:
                progress(f"save: dcp.async_save: not run: {dcp_state.why_not_async}")
            del sd_gpu, sd_cpu
            if args.device == "cuda":
                torch.cuda.empty_cache()
    finally:
        if dcp_state is not None:
            dcp_state.close()
    if versus_rows:
        print(table(f"save: ferry beside dd O_DIRECT of the same bytes (bs={DD_BLOCK >> 20}M, conv=fsync), "
                    f"in turn, median of {args.repeats}; target: GPU >= {DD_TARGET:.0%} of dd",
                    ["set", "case", "GB/s", "of dd", "target"], versus_rows))
    print(table(f"save: to a durable file (disk O_DIRECT write: {disk:.2f} GB/s)" if disk else "save",
                ["set", "saver", "blocked s", "durable s", "GB/s", "of disk", f"vs {base_name}", "host MB",
                 "verified"], rows))
    return rows


def versus_dd(torch, records: Records, params: dict, sd_gpu: dict, sd_cpu: dict, nbytes: int, directory: str,
              args) -> list:
    """ferry's save from the GPU tensors and from CPU tensors of the same bytes
    beside dd O_DIRECT of those bytes (rounded up to dd's blocks), each repeat
    dd, GPU, CPU in turn, one warm-up first; records and the table's rows."""
    import ferry.torch as ft

    target = os.path.join(directory, "versus-dd.safetensors")
    cases = [DD] + ([FERRY_GPU] if args.device == "cuda" else []) + [FERRY_CPU]
    rates: dict[str, list] = {c: [] for c in cases}
    for i in range(args.repeats + 1):
        for case in cases:
            if case == DD:
                gbps = dd_direct_write(directory, nbytes)
            else:
                sd = sd_gpu if case == FERRY_GPU else sd_cpu
                _remove(target)
                _sync(torch)
                t0 = time.perf_counter()
                ft.save_safetensors(sd, target)  # durable: fsync of the file and its directory inside
                gbps = nbytes / (time.perf_counter() - t0) / 1e9
            if i and gbps is not None:
                rates[case].append(gbps)
    verify(torch, target, sd_cpu)  # the last save's file, bit for bit
    _remove(target)
    medians = {c: median(v) if v else None for c, v in rates.items()}
    records.compare({**params, "dd_block_bytes": DD_BLOCK}, "bandwidth_vs_dd", "GB/s", medians, baseline=DD)
    dd = medians[DD]
    rows = []
    for c, v in medians.items():
        ratio = v / dd if v is not None and dd else None
        met = "-" if c != FERRY_GPU or ratio is None else ("met" if ratio >= DD_TARGET else "MISSED")
        rows.append([params["set"], c, v, ratio, met])
    return rows


def _records(records: Records, params: dict, results: dict, disk: float | None, base_name: str) -> None:
    """One set's figures: times and GB/s against base_name, save_file from where the
    state dict lives (for times a ratio below 1 means faster), GB/s against the disk's direct write,
    peak host memory, whether the file was verified."""
    for metric, key, unit in (("blocked_time", "blocked_s", "s"), ("durable_time", "durable_s", "s"),
                              ("bandwidth", "gbps", "GB/s")):
        records.compare(params, metric, unit, {n: r[key] for n, r in results.items()}, baseline=base_name)
    for name, r in results.items():
        if disk:
            records.add(name, "bandwidth_vs_disk", r["gbps"], "GB/s", baseline=disk, baseline_case=DISK_CASE,
                        **params)
        records.add(name, "peak_host_memory", r["host_bytes"], "bytes", **params)
        records.add(name, "verified", "Passed" if r["verified"] else "not checked", None, **params)


SUITE = SaveSuite()
main = SUITE.main
