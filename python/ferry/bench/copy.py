"""`ferry bench copy`: host<->GPU copies of pageable memory, ferry beside CUDA.

For each size, direction (h2d, d2h, bidirectional) and host backing (4 KiB
pages, THP, memfd), in one run: ferry (auto and each strategy), cudaMemcpy on the
same pageable buffer (CUDA's pageable path), cudaMemcpyAsync on pinned memory
(the link's practical ceiling), ferry on that pinned buffer and on the pageable
buffer once registered (first backing only: registered copies must match
pinned ones), and torch's `.to()` / `.copy_()` where torch is present.
Bandwidth is the median of the timed repeats (GB/s = 1e9 bytes/s), also as a
share of the link's theoretical limit. Host buffers are fresh mmaps: no
registration is reused between sizes (a one-shot copy).

The first table is the sweep a PyTorch user sees, timed from Python per call
(call to synchronize), 4 KiB .. 2 GiB: torch's pageable `copy_`, torch's pinned
`copy_`, CUDA's pageable cudaMemcpy (timed in C++), `ferry.copy` on the same
pageable tensors and on the pinned ones, with ferry's ratio to each baseline.

`--gpus all` measures every GPU alone and all at once (aggregate GB/s, one
thread per GPU, pageable through ferry and pinned through torch, both
directions), after a table of where each GPU's engine runs: its host NUMA
node and the crew of copy threads it uses.

`--calibrate` first prints, per direction and size, each pageable strategy's
bandwidth and which one wins (staged, cuda, pin-in-place, hybrid at half the
body pinned): the table `auto` is judged by (copy/strategy.h's choose_route).
It then measures the choices the profile can express (CUDA-path threshold per
direction, pinned share per direction: 1 is pin-in-place) and writes the
machine profile the engine reads (_ferry.profile_file_path(), the
engine's own rule: FERRY_PROFILE's file, else $XDG_CACHE_HOME/ferry/profile.txt,
else ~/.cache/ferry/profile.txt).
"""

from __future__ import annotations

import os
import sys

from ..measure import HostBuffer, gbps
from .. import _ferry
from ..units import GiB, KiB, MiB, link_limit, parse_size_list
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, Waived, add_repeats, choices_list, missing_module, size_list, size_list_or_none


def _torch_with_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()

STRATEGIES = ("auto", "staged", "pin-in-place", "hybrid")


def link_gbps(measured: list[float]) -> float | None:
    """GPU 0's link limit (units.link_limit) given the pinned rates measured."""
    from .. import _ferry, facts

    try:
        gpus = facts.collect(_ferry.cuda_info())["gpus"]
    except Exception:
        return None
    return link_limit(gpus[0].get("link_gbps"), gpus[0].get("max_link_gbps"), measured)[0] if gpus else None


def measure(sizes, directions, backings, strategies, iterations, with_torch):
    from .. import _ferry
    from ..copy import engine

    torch = None
    if with_torch:  # import torch before ferry starts its engine
        try:
            import torch as _t

            torch = _t if _t.cuda.is_available() else None
        except ImportError:
            torch = None
    eng = engine(0)
    eng.warm_up()
    rows = []
    biggest = max(sizes)
    dev_a = _ferry.cuda_malloc(biggest)
    dev_b = _ferry.cuda_malloc(biggest)
    pinned = _ferry.cuda_host_alloc(biggest)
    try:
        for backing in backings:
            for n in sizes:
                reps = iterations if n >= 64 * MiB else max(iterations, 20)
                a, b = HostBuffer(n, backing), HostBuffer(n, backing)
                for direction in directions:
                    progress(f"copy {backing} {direction} {n // KiB} KiB")
                    row = {"backing": backing, "direction": direction, "nbytes": n}
                    if direction == "bidir":
                        for s in ("auto",):
                            row[f"ferry_{s}"] = 2 * gbps(
                                n, _ferry.bidirectional_ns(eng, dev_a, a.addr, b.addr, dev_b, n, s, reps))
                        row["cuda_pageable"] = 2 * gbps(
                            n, _ferry.bidirectional_ns(eng, dev_a, a.addr, b.addr, dev_b, n, "cudaMemcpy", reps))
                        rows.append(row)
                        continue
                    dst, src = (dev_a, a.addr) if direction == "h2d" else (a.addr, dev_a)
                    pdst, psrc = (dev_a, pinned) if direction == "h2d" else (pinned, dev_a)
                    for s in strategies:
                        row[f"ferry_{s}"] = gbps(n, _ferry.copy_ns(eng, dst, src, n, s, reps))
                    row["strategy_auto"] = eng.plan(dst, src, n)
                    row["cuda_pageable"] = gbps(n, _ferry.cuda_memcpy_ns(dst, src, n, reps))
                    row["cuda_pinned"] = gbps(n, _ferry.cuda_memcpy_async_ns(pdst, psrc, n, reps))
                    if backing == backings[0]:  # ferry on pinned and on registered memory (same buffers)
                        row["ferry_pinned"] = gbps(n, _ferry.copy_ns(eng, pdst, psrc, n, "auto", reps))
                        registration = _ferry.Registration(a.addr, n, 0)
                        try:
                            row["ferry_registered"] = gbps(n, _ferry.copy_ns(eng, dst, src, n, "auto", reps))
                        finally:
                            del registration
                    if torch is not None and backing == backings[0]:
                        row["torch_pageable"] = torch_gbps(torch, n, direction, reps)
                    rows.append(row)
                a.close()
                b.close()
    finally:
        _ferry.cuda_free(dev_a)
        _ferry.cuda_free(dev_b)
        _ferry.cuda_free_host(pinned)
    return rows


def torch_gbps(torch, n: int, direction: str, reps: int) -> float:
    """torch's own pageable copy: t.to('cuda') / gpu.copy_ into a pageable CPU tensor."""
    import time

    cpu = torch.empty(n, dtype=torch.uint8)
    cpu.fill_(7)
    gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        if direction == "h2d":
            gpu.copy_(cpu)
        else:
            cpu.copy_(gpu)
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter_ns() - t0)
    return gbps(n, times)


def _per_call_us(fn, n: int) -> float:
    """Median microseconds of fn() (which synchronizes), repeated for ~50 ms (5..200 calls)."""
    import time

    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(200, max(5, 0.05 / once)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def python_sweep(sizes) -> list[dict]:
    """The per-call sweep from Python: torch pageable / pinned copy_, cudaMemcpy, ferry.copy."""
    import torch

    import ferry

    from .. import _ferry

    rows = []
    for n in sizes:
        progress(f"copy sweep {n // KiB} KiB")
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        pageable = torch.empty(n, dtype=torch.uint8).random_(0, 255)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).random_(0, 255)
        sync = torch.cuda.synchronize
        for direction in ("h2d", "d2h"):
            def pair(host):
                return (dev, host) if direction == "h2d" else (host, dev)

            row = {"direction": direction, "nbytes": n}
            d, h = pair(pageable)
            row["torch_pageable"] = n / _per_call_us(lambda: (d.copy_(h), sync()), n) / 1e3
            row["ferry_auto"] = n / _per_call_us(lambda: ferry.copy(d, h), n) / 1e3
            pd, ph = pair(pinned)
            row["torch_pinned"] = n / _per_call_us(lambda: (pd.copy_(ph), sync()), n) / 1e3
            row["ferry_pinned"] = n / _per_call_us(lambda: ferry.copy(pd, ph), n) / 1e3
            reps = 5 if n >= 256 * MiB else 20
            row["cuda_pageable"] = gbps(n, _ferry.cuda_memcpy_ns(d.data_ptr(), h.data_ptr(), n, reps))
            if not torch.equal(dev.cpu() if direction == "h2d" else pageable, pageable if direction == "h2d" else dev.cpu()):
                raise AssertionError(f"copy sweep: {direction} {n} bytes arrived wrong")
            rows.append(row)
        dev = pageable = pinned = None  # free them before the next size
    return rows


def print_sweep(rows):
    cols = ["dir", "Size(KiB)", "torch pageable", "torch pinned", "cudaMemcpy pageable", "ferry.copy pageable",
            "ferry.copy pinned", "x torch pageable", "x cudaMemcpy", "pinned: ferry/torch"]
    out = []
    for r in rows:
        out.append([r["direction"], r["nbytes"] // KiB, r["torch_pageable"], r["torch_pinned"], r["cuda_pageable"],
                    r["ferry_auto"], r["ferry_pinned"], r["ferry_auto"] / r["torch_pageable"],
                    r["ferry_auto"] / r["cuda_pageable"], r["ferry_pinned"] / r["torch_pinned"]])
    print(table("Copies as a PyTorch user makes them, per call from Python (median GB/s)", cols, out))


def multi_gpu(devices, n: int, seconds: float = 1.0) -> list[dict]:
    """Each GPU alone, then all at once: one thread per GPU copying n bytes again and
    again for `seconds`; pageable through ferry.copy, pinned through torch copy_."""
    import threading
    import time

    import torch

    import ferry

    def buffers(d):
        return (torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}"),
                torch.empty(n, dtype=torch.uint8).fill_(d + 1),
                torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(d + 1))

    bufs = {d: buffers(d) for d in devices}

    def worker(d, kind, direction, stop, moved):
        dev, pageable, pinned = bufs[d]
        host = pageable if kind == "pageable" else pinned
        dst, src = (dev, host) if direction == "h2d" else (host, dev)
        with torch.cuda.device(d):
            while not stop.is_set():
                if kind == "pageable":
                    ferry.copy(dst, src)
                else:
                    dst.copy_(src)
                    torch.cuda.synchronize(d)
                moved[d] += n

    def run(devs, kind, direction):
        stop = threading.Event()
        moved = {d: 0 for d in devs}
        threads = [threading.Thread(target=worker, args=(d, kind, direction, stop, moved)) for d in devs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        return sum(moved.values()) / (time.perf_counter() - t0) / 1e9

    rows = []
    for kind in ("pageable", "pinned"):
        for direction in ("h2d", "d2h"):
            for d in devices:
                progress(f"copy gpus: GPU {d} alone, {kind} {direction}")
                rows.append({"gpus": str(d), "kind": kind, "direction": direction,
                             "gbps": run([d], kind, direction)})
            progress(f"copy gpus: all {len(devices)} at once, {kind} {direction}")
            rows.append({"gpus": "all", "kind": kind, "direction": direction, "gbps": run(devices, kind, direction)})
    return rows


def ferry_copy_warm(device: int) -> dict:
    """Makes `device`'s engine and its staging memory; returns where it runs."""
    from ..copy import engine
    from ..facts.parsers import format_cpulist

    eng = engine(device)
    eng.warm_up()
    st = eng.stats()
    return {"gpu": device, "numa_node": st["numa_node"], "crew_threads": st["crew_threads"],
            "crew_cpus": format_cpulist(st["crew_cpus"]) if st["crew_cpus"] else None}


def print_placement(rows):
    cols = ["GPU", "NUMA node", "crew threads", "crew CPUs"]
    print(table("Where each GPU's engine runs (NUMA node -1: none, a one-node host; "
                "crew CPUs -: not bound)", cols,
                [[r["gpu"], r["numa_node"], r["crew_threads"], r["crew_cpus"]] for r in rows]))


def print_multi(rows, n):
    cols = ["GPUs", "host memory", "dir", "GB/s"]
    print(table(f"Each GPU alone and all at once ({n // MiB} MiB copies, one thread per GPU; "
                "pageable: ferry.copy, pinned: torch copy_)", cols,
                [[r["gpus"], r["kind"], r["direction"], r["gbps"]] for r in rows]))


def print_table(rows, link):
    cols = ["backing", "dir", "Size(KiB)", "ferry auto(GB/s)", "strategy", "staged", "pin-in-place", "hybrid",
            "cuda pageable(GB/s)", "cuda pinned(GB/s)", "torch(GB/s)", "x cuda pageable", "% link",
            "ferry pinned", "ferry registered"]
    out = []
    for r in rows:
        auto = r.get("ferry_auto")
        base = r.get("cuda_pageable")
        out.append([r["backing"], r["direction"], r["nbytes"] // KiB, auto, r.get("strategy_auto", "-"),
                    r.get("ferry_staged"), r.get("ferry_pin-in-place"), r.get("ferry_hybrid"), base,
                    r.get("cuda_pinned"), r.get("torch_pageable"),
                    auto / base if auto and base else None,
                    100 * auto / (link * (2 if r["direction"] == "bidir" else 1)) if auto and link else None,
                    r.get("ferry_pinned"), r.get("ferry_registered")])
    print(table(f"Pageable host<->device copies (median GB/s; link limit {link or '?'} GB/s per direction)",
                cols, out))


def calibrate(iterations: int) -> str:
    """Measure the engine's choices on this machine and write the profile."""
    from .. import _ferry
    from ..copy import engine

    eng = engine(0)
    eng.warm_up()
    n = 512 * MiB
    dev = _ferry.cuda_malloc(n)
    lines = ["# ferry machine profile, written by `ferry bench copy --calibrate`"]
    try:
        print_wins(where_each_wins(eng, dev, n, iterations))
        # Per direction: the smallest size from which staging beats CUDA's
        # own pageable path at every size measured (0: staging wins throughout).
        small = HostBuffer(4 * MiB, "4k")
        sizes = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB)
        for direction in ("h2d", "d2h"):
            threshold = 0
            for size in sizes:
                dst, src = (dev, small.addr) if direction == "h2d" else (small.addr, dev)
                staged = gbps(size, _ferry.copy_ns(eng, dst, src, size, "staged", 50))
                cuda = gbps(size, _ferry.copy_ns(eng, dst, src, size, "cuda", 50))
                progress(f"calibrate: {direction} {size // KiB} KiB staged {staged:.1f} vs cuda {cuda:.1f} GB/s")
                if cuda > staged * 1.02:
                    threshold = size * 2  # CUDA's path wins here: use it up to the next size
            lines.append(f"cuda_below_bytes_{direction} = {threshold}")
        small.close()
        buf = HostBuffer(n, "4k")
        for direction in ("h2d", "d2h"):
            dst, src = (dev, buf.addr) if direction == "h2d" else (buf.addr, dev)
            best_share, best = 0.0, gbps(n, _ferry.copy_ns(eng, dst, src, n, "staged", iterations))
            progress(f"calibrate: {direction} staged {best:.1f} GB/s")
            for share in (0.25, 0.4, 0.55, 0.7, 1.0):  # 1.0: pin-in-place
                r = _hybrid_gbps(dst, src, n, share, direction, iterations)
                progress(f"calibrate: {direction} hybrid share {share} {r:.1f} GB/s")
                if r > best * 1.03:
                    best_share, best = share, r
            lines.append(f"hybrid_pinned_share_{direction} = {best_share}")
        buf.close()
    finally:
        _ferry.cuda_free(dev)
    return "\n".join(lines) + "\n"


WIN_SIZES = (64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 512 * MiB)
WIN_STRATEGIES = ("staged", "cuda", "pin-in-place", "hybrid")


def where_each_wins(eng, dev, n, iterations) -> list[dict]:
    """Each pageable strategy's median GB/s per direction and size (at most n
    bytes, one fresh 4 KiB-page buffer), and the winner. Hybrid runs with half
    the body pinned, on a private engine."""
    buf = HostBuffer(n, "4k")
    rows = []
    try:
        for direction in ("h2d", "d2h"):
            dst, src = (dev, buf.addr) if direction == "h2d" else (buf.addr, dev)
            for size in (s for s in WIN_SIZES if s <= n):
                reps = iterations if size >= 64 * MiB else max(iterations, 20)
                row = {"direction": direction, "nbytes": size}
                for strategy in WIN_STRATEGIES:
                    if strategy == "hybrid":
                        row[strategy] = _hybrid_gbps(dst, src, size, 0.5, direction, reps)
                    else:
                        row[strategy] = gbps(size, _ferry.copy_ns(eng, dst, src, size, strategy, reps))
                row["wins"] = max(WIN_STRATEGIES, key=lambda k: row[k])
                row["auto"] = eng.plan(dst, src, size)
                progress(f"calibrate: {direction} {size // KiB} KiB: {row['wins']} wins, auto picks {row['auto']}")
                rows.append(row)
    finally:
        buf.close()
    return rows


def print_wins(rows) -> None:
    cols = ["dir", "Size(KiB)", *(f"{k}(GB/s)" for k in WIN_STRATEGIES), "wins", "auto picks now"]
    print(table("Where each pageable strategy wins (median GB/s; hybrid: half the body pinned; 'auto picks now': "
                "with the profile in use before this run, which the new one replaces from the next process)", cols,
                [[r["direction"], r["nbytes"] // KiB, *(r[k] for k in WIN_STRATEGIES), r["wins"], r["auto"]]
                 for r in rows]))


def _hybrid_gbps(dst, src, n, share, direction, iterations) -> float:
    """Bandwidth of the hybrid strategy at a given pinned share (a private engine
    with that profile line: FERRY_PROFILE is read once per process)."""
    profile = f"hybrid_pinned_share_{direction} = {share}\n"
    return gbps(n, _ferry.copy_ns_with_profile(0, profile, dst, src, n, "hybrid", iterations))


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, direction in zip(axes, ("h2d", "d2h")):
        sel = [r for r in rows if r["direction"] == direction and r["backing"] == rows[0]["backing"]]
        sizes = [r["nbytes"] for r in sel]
        for key, label in (("ferry_auto", "ferry auto"), ("cuda_pageable", "cudaMemcpy pageable"),
                           ("cuda_pinned", "cudaMemcpyAsync pinned"), ("torch_pageable", "torch pageable")):
            ys = [r.get(key) for r in sel]
            if any(y is not None for y in ys):
                ax.plot(sizes, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.set_title(direction)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    progress(f"wrote {path}")


# Case names in the records, by row key (measure's and python_sweep's rows).
SWEEP_CASES = {"ferry_auto": "ferry.copy pageable", "ferry_pinned": "ferry.copy pinned",
               "torch_pageable": "torch pageable", "torch_pinned": "torch pinned",
               "cuda_pageable": "cudaMemcpy pageable"}
SWEEP_BASELINES = {"ferry.copy pageable": "torch pageable", "ferry.copy pinned": "torch pinned"}
ROW_CASES = {"ferry_auto": "ferry auto", "ferry_staged": "ferry staged", "ferry_pin-in-place": "ferry pin-in-place",
             "ferry_hybrid": "ferry hybrid", "cuda_pageable": "cudaMemcpy pageable",
             "cuda_pinned": "cudaMemcpyAsync pinned", "ferry_pinned": "ferry pinned",
             "ferry_registered": "ferry registered", "torch_pageable": "torch pageable"}
ROW_BASELINES = {"ferry auto": "cudaMemcpy pageable", "ferry staged": "cudaMemcpy pageable",
                 "ferry pin-in-place": "cudaMemcpy pageable", "ferry hybrid": "cudaMemcpy pageable",
                 "torch pageable": "cudaMemcpy pageable", "ferry pinned": "cudaMemcpyAsync pinned",
                 "ferry registered": "cudaMemcpyAsync pinned"}


def records(results: dict) -> list[dict]:
    """The run's records (bench/records.py): GB/s per case. The sweep (params
    table=sweep) compares ferry.copy with torch; the table by backing (table=
    backings) compares ferry's strategies with cudaMemcpy on the same pageable
    buffer and ferry on pinned or registered memory with cudaMemcpyAsync on
    pinned memory; "link limit" is the link's theoretical GB/s per direction;
    bidir figures are both directions together."""
    out = Records(CopySuite.key)
    for r in results.get("sweep") or []:
        out.compare({"table": "sweep", "direction": r["direction"], "nbytes": r["nbytes"]}, "bandwidth", "GB/s",
                    {case: r.get(key) for key, case in SWEEP_CASES.items()}, SWEEP_BASELINES)
    for r in results.get("gpu_placement") or []:
        for metric in ("numa_node", "crew_threads", "crew_cpus"):
            out.add("engine placement", metric, r[metric], None, table="placement", gpu=r["gpu"])
    for r in results.get("gpus") or []:
        case = "ferry.copy pageable" if r["kind"] == "pageable" else "torch copy_ pinned"
        out.add(case, "bandwidth", r["gbps"], "GB/s", table="gpus", gpus=r["gpus"], direction=r["direction"],
                nbytes=GiB)
    if results.get("link_gbps"):
        out.add("link limit", "bandwidth", results["link_gbps"], "GB/s", table="backings")
    for r in results.get("rows") or []:
        params = {"table": "backings", "backing": r["backing"], "direction": r["direction"], "nbytes": r["nbytes"]}
        made = out.compare(params, "bandwidth", "GB/s", {case: r.get(key) for key, case in ROW_CASES.items()},
                           ROW_BASELINES)
        for rec in made:
            if rec["case"] == "ferry auto" and r.get("strategy_auto"):
                rec["params"]["strategy"] = r["strategy_auto"]  # the strategy auto chose
    return out.items


class CopySuite(Suite):
    key = "copy"
    description = "pageable host<->GPU copies by size, direction and backing: ferry beside cudaMemcpy and torch"

    def add_arguments(self, p):
        p.add_argument("--sizes", type=size_list, default="4K,64K,1M,16M,64M,256M,1G,2G", help="(default: %(default)s)")
        p.add_argument("--directions", type=choices_list(("h2d", "d2h", "bidir")), default="h2d,d2h,bidir", help="(default: %(default)s)")
        p.add_argument("--backings", type=choices_list(("4k", "thp", "memfd", "memfd-thp")), default="4k,thp,memfd", help="(default: %(default)s)")
        p.add_argument("--strategies", type=choices_list(STRATEGIES), default=",".join(STRATEGIES), help="(default: %(default)s)")
        add_repeats(p, 5, "timed repeats per case", old=("--iterations",))
        p.add_argument("--no-torch", action="store_true", help="skip the torch baseline")
        p.add_argument("--plot", metavar="PNG", help="write a plot of bandwidth by size")
        p.add_argument("--calibrate", action="store_true", help="measure and write the machine profile")
        p.add_argument("--sweep-sizes", type=size_list_or_none, default="4K,64K,256K,1M,4M,16M,64M,256M,1G,2G",
                       help="sizes of the per-call sweep from Python (default: %(default)s; 'none' skips it)")
        p.add_argument("--gpus", help="'all' or a list such as 0,1: each GPU alone and all at once (1 GiB copies)")
        p.add_argument("--no-backings", action="store_true", help="only the sweep (and --gpus): skip the table "
                       "by host backing and strategy")

    def run(self, args) -> int:
        if args.calibrate:
            path, _ = _ferry.profile_file_path()  # the file the engine reads: FERRY_PROFILE's, else the cache's
            if path is None:
                print("ferry bench copy: --calibrate: nowhere to write the profile: set XDG_CACHE_HOME, HOME "
                      "or FERRY_PROFILE", file=sys.stderr)
                return 2
            text = calibrate(args.repeats)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print(text + f"(written to {path}; the copy engine reads it from the next process on)")
            return 0
        results: dict = {}
        have_torch = not args.no_torch and _torch_with_cuda()
        if have_torch and args.sweep_sizes != "none":
            results["sweep"] = python_sweep(parse_size_list(args.sweep_sizes))
            print_sweep(results["sweep"])
        if args.gpus:
            if not have_torch:
                raise Waived(f"--gpus {missing_module('torch') or 'needs PyTorch with CUDA (and no --no-torch)'}")
            if args.gpus == "all":
                devices = list(range(len(_ferry.cuda_info()["devices"])))
            else:
                devices = [int(x) for x in args.gpus.split(",")]
            # Each engine and its staging made before the timing.
            results["gpu_placement"] = [ferry_copy_warm(d) for d in devices]
            print_placement(results["gpu_placement"])
            results["gpus"] = multi_gpu(devices, GiB)
            print_multi(results["gpus"], GiB)
        if not args.no_backings:
            rows = measure(parse_size_list(args.sizes), args.directions.split(","), args.backings.split(","),
                           args.strategies.split(","), args.repeats, have_torch)
            link = link_gbps([r["cuda_pinned"] for r in rows if r.get("cuda_pinned")])
            print_table(rows, link)
            results.update({"link_gbps": link, "rows": rows})
            if args.plot:
                plot(rows, args.plot)
        write_json(args.json, self.key, records(results))
        return 0


SUITE = CopySuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
