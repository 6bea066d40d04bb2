"""`ferry bench fork`: what fork() costs a process that holds pinned memory.

Linux pins registered anonymous memory (FOLL_PIN) and copies every pinned
anonymous page into the child at fork(), where other pages are shared
copy-on-write: a process holding GiBs of such memory forks slowly and every
child (each DataLoader worker, at every epoch) gets a private copy. Holders of
N bytes, every byte written before the measurement:

  ferry PinnedPool                    ferry.torch.empty_pinned (the default pinned pool)
  ferry PinnedPool memfd              empty_pinned from ferry.PinnedPool(memfd=True)
  torch pin_memory (cudaHostAlloc)    torch.empty(N, dtype=uint8, pin_memory=True)
  torch pinned_use_cuda_host_register the same with PYTORCH_CUDA_ALLOC_CONF=
                                      pinned_use_cuda_host_register:True,pinned_num_register_threads:8
  pageable                            torch.empty(N, dtype=uint8)
  ferry Pool                          ferry.Pool().alloc(N) (pageable)

Each case runs in a fresh process (`python -m ferry.bench.fork --case ...`), set
up as a training process is (torch imported; the CUDA context and the pool made
for the GPU holders). Held 0 is that same process holding nothing: each holder's
baseline (always measured).

  fork: os.fork() --repeats times, the parent's time from the call to its return
        (median); the child reads its Private_Dirty (/proc/self/smaps_rollup) at
        once, writes it to a pipe and leaves with os._exit(0); its growth is the
        child's figure minus the same holder's with nothing held. "mapping" is
        what /proc/self/smaps says of the held memory (anon, memfd, a device;
        VmFlags sh: shared with the child, dc: not in the child at all).
  loader: time from iter() to the first batch of ferry.torch.DataLoader and of
        torch's DataLoader (--workers workers, forked: multiprocessing_context
        "fork", persistent_workers False, CPU batches of a small synthetic
        dataset), with --loader-held bytes of --loader-holder held vs nothing
        held; median of --loader-repeats iterators in one process.

--device cpu runs the holders that need no CUDA (pageable, ferry Pool; the loader
holds ferry Pool memory). Times in ms; memory in MiB (2^20 bytes, as smaps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from ..units import MiB
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_device, add_repeats, deprecated_alias, choices_list, int_at_least, missing_module

FERRY_PINNED = "ferry PinnedPool"
FERRY_MEMFD = "ferry PinnedPool memfd"
TORCH_HOST_ALLOC = "torch pin_memory (cudaHostAlloc)"
TORCH_REGISTER = "torch pinned_use_cuda_host_register"
PAGEABLE = "pageable"
FERRY_POOL = "ferry Pool"
GPU_HOLDERS = (FERRY_PINNED, FERRY_MEMFD, TORCH_HOST_ALLOC, TORCH_REGISTER)
CPU_HOLDERS = (PAGEABLE, FERRY_POOL)
HOLDERS = GPU_HOLDERS + CPU_HOLDERS
TORCH_REGISTER_CONF = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
LOADERS = ("ferry.torch.DataLoader", "torch DataLoader")
NOTHING = "nothing held"
CASE_TIMEOUT_S = 600


# ---- in the case's process ---------------------------------------------------------


def hold(holder: str, nbytes: int):
    """(what keeps the memory alive, its address): nbytes from `holder`, every byte
    written; with nbytes 0 the process is set up the same way and holds nothing."""
    import torch

    from .. import _ferry

    if holder in GPU_HOLDERS:
        torch.empty(1, device="cuda")  # the CUDA context, as a training process has it
    keep, addr = None, 0
    if holder in (FERRY_PINNED, FERRY_MEMFD):
        import ferry
        import ferry.torch as ft

        pool = ft.default_pinned_pool() if holder == FERRY_PINNED else ferry.PinnedPool(memfd=True)
        keep = (pool, ft.empty_pinned(nbytes, torch.uint8, pool=pool) if nbytes else None)
        addr = keep[1].data_ptr() if nbytes else 0
    elif holder == FERRY_POOL:
        import ferry

        pool = ferry.Pool()
        keep = (pool, pool.alloc(nbytes) if nbytes else None)
        addr = keep[1].ptr if nbytes else 0
    elif nbytes:
        keep = torch.empty(nbytes, dtype=torch.uint8, pin_memory=holder != PAGEABLE)
        addr = keep.data_ptr()
    if nbytes:  # every byte written, through a view that holds `keep`
        torch.frombuffer(_ferry.MemorySpan(addr, nbytes, keep), dtype=torch.uint8).fill_(1)
    return keep, addr


def mapping_summary(smaps: str, lo: int, hi: int) -> str:
    """What /proc/self/smaps says of the mappings over [lo, hi): "anon dc",
    "memfd sh", "/dev/nvidiactl io", ... (kind, then those of the VmFlags sh, dc,
    io, pf it has), distinct ones joined by ", "; "-" when none (an empty range
    covers nothing, even inside a mapping)."""
    if hi <= lo:
        return "-"
    labels, inside = [], False
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            start, _, end = head[0].partition("-")
            inside = int(start, 16) < hi and int(end, 16) > lo
            path = head[5].strip() if len(head) > 5 else ""
            kind = "anon" if not path else ("memfd" if path.startswith("/memfd:") else path)
        elif inside and line.startswith("VmFlags:"):
            flags = set(line.split()[1:])
            label = " ".join([kind] + [f for f in ("sh", "dc", "io", "pf") if f in flags])
            if label not in labels:
                labels.append(label)
    return ", ".join(labels) or "-"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _private_dirty(text: str) -> int | None:
    from ..facts.parsers import parse_meminfo

    return parse_meminfo(text).get("Private_Dirty")


def fork_figures(repeat: int) -> dict:
    """{"fork_s": [...], "child_private_dirty_bytes": [...], "parent_private_dirty_bytes"}:
    os.fork() `repeat` times."""
    import gc
    import warnings

    times, dirty = [], []
    parent = _private_dirty(_read("/proc/self/smaps_rollup"))  # also imports the parser before any fork
    gc.collect()
    gc.disable()  # no collection inside a timed fork
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()": on purpose
        for _ in range(repeat):
            r, w = os.pipe()
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:  # the child: its figure, then out without cleanup
                try:
                    os.write(w, str(_private_dirty(_read("/proc/self/smaps_rollup"))).encode())
                finally:
                    os._exit(0)
            times.append(time.perf_counter() - t0)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                answer = f.read().decode()
            os.waitpid(pid, 0)
            dirty.append(int(answer) if answer.isdigit() else None)
    gc.enable()
    return {"fork_s": times, "child_private_dirty_bytes": dirty, "parent_private_dirty_bytes": parent}


def first_batch_times(loader: str, workers: int, repeat: int) -> list[float]:
    """Seconds from iter() to the first batch, `repeat` times (new workers each)."""
    import torch

    from .dataloader import Frames

    ds = Frames(1 << 20, (3, 64, 64), "uint8")
    common = dict(batch_size=32, shuffle=False, num_workers=workers, persistent_workers=False,
                  multiprocessing_context="fork")
    if loader == LOADERS[0]:
        import ferry.torch as ft

        dl = ft.DataLoader(ds, **common)
    else:
        dl = torch.utils.data.DataLoader(ds, **common)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        it = iter(dl)
        batch = next(it)
        out.append(time.perf_counter() - t0)
        del batch, it  # the workers go
    return out


def run_in_case(case: dict) -> dict:
    """One case, in this (fresh) process."""
    keep, addr = hold(case["holder"], case["nbytes"])
    out = {"mapping": mapping_summary(_read("/proc/self/smaps"), addr, addr + case["nbytes"])
           if case["nbytes"] else "-"}
    if case["kind"] == "fork":
        out.update(fork_figures(case["repeat"]))
    else:
        out["first_batch_s"] = first_batch_times(case["loader"], case["workers"], case["repeat"])
    del keep
    return out


# ---- in the suite's process ---------------------------------------------------------


def run_case(case: dict) -> dict:
    """`case` in a fresh process: its figures, or {"error": why}."""
    from ..facts.parsers import ALLOC_CONF_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARIABLES}
    if case["holder"] == TORCH_REGISTER:
        env["PYTORCH_CUDA_ALLOC_CONF"] = TORCH_REGISTER_CONF
    cmd = [sys.executable, "-m", "ferry.bench.fork", "--case", json.dumps(case)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {CASE_TIMEOUT_S} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def available_bytes() -> int | None:
    from ..facts.parsers import parse_meminfo

    try:
        return parse_meminfo(_read("/proc/meminfo")).get("MemAvailable")
    except OSError:
        return None


def median(xs: list) -> float | None:
    """The median of the figures that are there, None for none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def measure_forks(holders: list[str], sizes: list[int], repeat: int) -> list[dict]:
    rows = []
    for holder in holders:
        for n in sizes:
            row = {"holder": holder, "nbytes": n}
            free = available_bytes()
            if n and free is not None and 2 * n > free:  # the child may get a copy of it all
                row["waived"] = f"needs twice the held bytes free ({2 * n // MiB} MiB; {free // MiB} MiB available)"
            else:
                progress(f"fork: {holder}, {n // MiB} MiB held")
                got = run_case({"kind": "fork", "holder": holder, "nbytes": n, "repeat": repeat})
                row.update(got)
                if "fork_s" in got:
                    row["fork_ms"] = median(got["fork_s"]) * 1e3
                    dirty = median(got["child_private_dirty_bytes"])
                    row["child_mib"] = None if dirty is None else dirty / MiB
            rows.append(row)
    return rows


def copies_at_fork(fork_rows: list[dict], holder: str) -> bool:
    """Whether a child of `holder`'s process got a copy of at least half of what it held."""
    base = next((r.get("child_mib") for r in fork_rows if r["holder"] == holder and r["nbytes"] == 0), None)
    return any(r.get("child_mib") is not None and base is not None and r["nbytes"]
               and (r["child_mib"] - base) * MiB >= r["nbytes"] / 2 for r in fork_rows if r["holder"] == holder)


def measure_loaders(holder: str, held: int, workers: int, repeat: int, fork_rows: list[dict]) -> list[dict]:
    rows = []
    for n in (0, held):
        for loader in LOADERS:
            row = {"holder": holder, "nbytes": n, "loader": loader, "workers": workers}
            free = available_bytes()
            if n and free is not None and copies_at_fork(fork_rows, holder) and (workers + 1) * n > 0.8 * free:
                row["waived"] = (f"{holder}'s children got a copy of what it held: {workers} workers would need "
                                 f"{workers * n // MiB} MiB ({free // MiB} MiB available)")
            else:
                progress(f"loader: {loader}, {workers} workers, {n // MiB} MiB of {holder} held")
                got = run_case({"kind": "loader", "holder": holder, "nbytes": n, "loader": loader,
                                "workers": workers, "repeat": repeat})
                row.update(got)
                if "first_batch_s" in got:
                    row["first_batch_ms"] = median(got["first_batch_s"]) * 1e3
            rows.append(row)
    return rows


# ---- records and tables ---------------------------------------------------------------


def _beside(holders: list[str]) -> str | None:
    """The holder every other one is set beside: PyTorch's default pinned memory, else pageable."""
    return next((h for h in (TORCH_HOST_ALLOC, PAGEABLE) if h in holders), None)


def _growth(rows: list[dict]) -> dict[tuple[str, int], float]:
    """{(holder, held bytes): the child's Private_Dirty minus the same holder's with nothing held}."""
    base = {r["holder"]: r.get("child_mib") for r in rows if r["nbytes"] == 0}
    return {(r["holder"], r["nbytes"]): r["child_mib"] - base[r["holder"]] for r in rows
            if r["nbytes"] and r.get("child_mib") is not None and base.get(r["holder"]) is not None}


def records(fork_rows: list[dict], loader_rows: list[dict]) -> list[dict]:
    """One record per figure. fork_time (ms) and child_private_dirty (MiB): case
    the holder ("nothing held" at 0 bytes), baseline the same holder with nothing
    held; child_private_growth (MiB), baseline the growth of torch's cudaHostAlloc
    holder (pageable without CUDA) at the same size; mapping: what smaps says of
    the held memory. first_batch_time (ms): case the loader, baseline the same
    loader with nothing held. params: holder, held_bytes (and loader, workers);
    a case not run: state Waived (why) or error."""
    out = Records(ForkSuite.key)
    base = {r["holder"]: r for r in fork_rows if r["nbytes"] == 0}
    beside = _beside([r["holder"] for r in fork_rows])
    growth = _growth(fork_rows)
    for r in fork_rows:
        holder, n = r["holder"], r["nbytes"]
        case, params = (holder if n else NOTHING), {"holder": holder, "held_bytes": n}
        b = base.get(holder, {}) if n else {}
        if r.get("waived") or r.get("error"):
            out.add(case, "state" if r.get("waived") else "error", "Waived" if r.get("waived") else r["error"], None,
                    why=r.get("waived"), **params)
            continue
        out.add(case, "fork_time", r["fork_ms"], "ms", baseline=b.get("fork_ms"), baseline_case=NOTHING, **params)
        if r.get("child_mib") is not None:
            out.add(case, "child_private_dirty", r["child_mib"], "MiB", baseline=b.get("child_mib"),
                    baseline_case=NOTHING, **params)
        if (holder, n) in growth:
            vs = growth.get((beside, n)) if holder != beside else None
            out.add(case, "child_private_growth", growth[holder, n], "MiB", baseline=vs, baseline_case=beside,
                    **params)
        if n:
            out.add(case, "mapping", r.get("mapping"), None, **params)
    lbase = {r["loader"]: r for r in loader_rows if r["nbytes"] == 0}
    for r in loader_rows:
        n = r["nbytes"]
        case = r["loader"] if n else NOTHING
        params = {"loader": r["loader"], "holder": r["holder"], "held_bytes": n, "workers": r["workers"]}
        if r.get("waived") or r.get("error"):
            out.add(case, "state" if r.get("waived") else "error", "Waived" if r.get("waived") else r["error"], None,
                    why=r.get("waived"), **params)
            continue
        b = lbase.get(r["loader"], {}) if n else {}
        out.add(case, "first_batch_time", r["first_batch_ms"], "ms", baseline=b.get("first_batch_ms"),
                baseline_case=NOTHING, **params)
    return out.items


def _x(a, b) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def print_tables(fork_rows: list[dict], loader_rows: list[dict], repeat: int) -> None:
    base = {r["holder"]: r for r in fork_rows if r["nbytes"] == 0}
    beside = _beside([r["holder"] for r in fork_rows])
    growth = _growth(fork_rows)
    rows = []
    for r in fork_rows:
        n, b = r["nbytes"], base.get(r["holder"], {})
        vs = next((x.get("fork_ms") for x in fork_rows if x["holder"] == beside and x["nbytes"] == n), None)
        note = (f"waived: {r['waived']}" if r.get("waived") else f"failed: {r['error']}" if r.get("error")
                else r.get("mapping"))
        rows.append([r["holder"], n // MiB, r.get("fork_ms"), _x(r.get("fork_ms"), b.get("fork_ms")) if n else "-",
                     _x(r.get("fork_ms"), vs) if n and r["holder"] != beside else "-", r.get("child_mib"),
                     growth.get((r["holder"], n)), note])
    print(table(f"os.fork() with memory held (median of {repeat}; child: its Private_Dirty right after fork; "
                "+MiB: minus the same holder's with nothing held)",
                ["holder", "held MiB", "fork ms", "x nothing held", f"x {beside}", "child MiB", "child +MiB",
                 "mapping"], rows))
    if not loader_rows:
        return
    lbase = {r["loader"]: r for r in loader_rows if r["nbytes"] == 0}
    rows = []
    for r in loader_rows:
        n = r["nbytes"]
        torch_ms = next((x.get("first_batch_ms") for x in loader_rows
                         if x["loader"] == LOADERS[1] and x["nbytes"] == n), None)
        note = f"waived: {r['waived']}" if r.get("waived") else f"failed: {r['error']}" if r.get("error") else ""
        rows.append([r["loader"], r["holder"], n // MiB, r["workers"], r.get("first_batch_ms"),
                     _x(r.get("first_batch_ms"), lbase.get(r["loader"], {}).get("first_batch_ms")) if n else "-",
                     _x(r.get("first_batch_ms"), torch_ms) if r["loader"] == LOADERS[0] else "-", note])
    print()
    print(table("DataLoader: iter() to the first batch (ms; workers forked, not persistent)",
                ["loader", "holder", "held MiB", "workers", "first batch ms", "x nothing held", "x torch", ""],
                rows))


# ---- the suite ---------------------------------------------------------------------------


def _held_list(text: str) -> list[int]:
    """'0,1G,4G' -> [0, 1073741824, 4294967296] (0: nothing held)."""
    from ..errors import InvalidArgumentError
    from ..units import parse_size

    try:
        sizes = {0 if x.strip() == "0" else parse_size(x) for x in text.split(",") if x.strip()}
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"'{text}': expected held sizes such as 0,1G,4G")
    return sorted(sizes)


def _held_or_none(text: str) -> int:
    return 0 if text == "none" else max(_held_list(text))


class ForkSuite(Suite):
    key = "fork"
    description = "fork() time and the child's private memory with pinned memory held: ferry beside PyTorch"

    def add_arguments(self, p):
        p.add_argument("--sizes", type=_held_list, default="0,1G,4G",
                       help="bytes held; 0, nothing held, is always measured (default: %(default)s)")
        add_repeats(p, 5, "forks per case, the median", old=("--repeat",))
        p.add_argument("--holders", type=choices_list(HOLDERS),
                       help=f"comma-separated (default: all; with --device cpu: {', '.join(CPU_HOLDERS)})")
        add_device(p, what=f"cuda: every holder; cpu: only the holders that need no CUDA ({', '.join(CPU_HOLDERS)})",
                   old_cpu_flag="--cpu")
        p.add_argument("--workers", type=int_at_least(1), default=min(12, os.cpu_count() or 1),
                       help="DataLoader workers, min(12, cores) (default: %(default)s)")
        p.add_argument("--loader-held", type=_held_or_none, default="4G",
                       help="bytes held in the DataLoader cases; none: no DataLoader cases (default: %(default)s)")
        p.add_argument("--loader-holder", choices=HOLDERS, metavar="HOLDER",
                       help=f"who holds them (default: {FERRY_PINNED}; with --device cpu: {FERRY_POOL})")
        p.add_argument("--loader-repeats", type=int_at_least(1), default=3, metavar="N",
                       help="iterators per DataLoader case, the median (default: %(default)s)")
        deprecated_alias(p, "--loader-repeat", "--loader-repeats", "loader_repeats", type=int_at_least(1))
        p.add_argument("--case", help=argparse.SUPPRESS)

    def check_arguments(self, args) -> None:
        from ..errors import InvalidArgumentError

        allowed = CPU_HOLDERS if args.device == "cpu" else HOLDERS
        args.holder_list = [h for h in (args.holders.split(",") if args.holders else allowed) if h]
        args.loader_holder = args.loader_holder or (FERRY_POOL if args.device == "cpu" else FERRY_PINNED)
        wrong = [h for h in args.holder_list + [args.loader_holder] if h not in allowed]
        if wrong:
            raise InvalidArgumentError(f"--device cpu runs only the holders {', '.join(CPU_HOLDERS)}, not "
                                       f"{wrong[0]!r} (use --device cuda on a machine with a CUDA device)")

    def waived(self, args):
        if args.case:
            return None  # a child that a run started
        self.check_arguments(args)  # a typo is caught on any machine
        why = missing_module("torch")
        if why or args.device == "cpu":
            return why
        why = super().waived(args)
        if why:
            return f"{why} (--device cpu measures the {' and '.join(CPU_HOLDERS)} holders without one)"
        import torch

        if not torch.cuda.is_available():
            return f"needs PyTorch with CUDA: torch {torch.__version__} sees no CUDA device"
        return None

    def run(self, args) -> int:
        if args.case:
            print(json.dumps(run_in_case(json.loads(args.case))))
            return 0
        sizes = sorted(set(args.sizes) | {0})
        fork_rows = measure_forks(args.holder_list, sizes, args.repeats)
        loader_rows = []
        if args.loader_held:
            loader_rows = measure_loaders(args.loader_holder, args.loader_held, args.workers, args.loader_repeats,
                                          fork_rows)
        print_tables(fork_rows, loader_rows, args.repeats)
        write_json(args.json, self.key, records(fork_rows, loader_rows),
                   details={"fork": fork_rows, "loader": loader_rows})
        return 1 if any(r.get("error") for r in fork_rows + loader_rows) else 0


SUITE = ForkSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
