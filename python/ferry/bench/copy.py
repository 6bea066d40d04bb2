"""`ferry bench copy`: host<->GPU copies of pageable memory, ferry beside CUDA.

For each size, direction (h2d, d2h, bidirectional) and host backing (4 KiB
pages, THP, memfd), in one run: ferry (auto and each strategy), cudaMemcpy on the
same pageable buffer (CUDA's pageable path), cudaMemcpyAsync on pinned memory
(the link's practical ceiling), ferry on that pinned buffer and on the pageable
buffer once registered (first backing only: registered copies must match
pinned ones), and torch's `.to()` / `.copy_()` where torch is present. Bandwidth is the median of the timed repeats (GB/s = 1e9 bytes/s), also
as a share of the link's theoretical limit. Host buffers are fresh mmaps: no
registration is reused between sizes (a one-shot copy).

`--calibrate` measures the choices the engine makes (small-copy threshold,
hybrid share per direction) and writes the machine profile the engine reads.
"""

from __future__ import annotations

import os
import sys

from ..measure import HostBuffer, gbps
from ..units import KiB, MiB, link_limit, parse_size_list
from .report import progress, table, write_json
from .suite import Suite

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
        # Smallest size at which staging beats CUDA's pageable path.
        small = HostBuffer(4 * MiB, "4k")
        threshold = 4 * MiB
        for size in (64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, MiB, 2 * MiB, 4 * MiB):
            staged = gbps(size, _ferry.copy_ns(eng, dev, small.addr, size, "staged", 20))
            cuda = gbps(size, _ferry.cuda_memcpy_ns(dev, small.addr, size, 20))
            progress(f"calibrate: {size // KiB} KiB staged {staged:.1f} vs cuda {cuda:.1f} GB/s")
            if staged > cuda:
                threshold = size
                break
        small.close()
        lines.append(f"cuda_below_bytes = {threshold}")
        buf = HostBuffer(n, "4k")
        for direction in ("h2d", "d2h"):
            dst, src = (dev, buf.addr) if direction == "h2d" else (buf.addr, dev)
            best_share, best = 0.0, gbps(n, _ferry.copy_ns(eng, dst, src, n, "staged", iterations))
            progress(f"calibrate: {direction} staged {best:.1f} GB/s")
            for share in (0.25, 0.4, 0.55, 0.7):
                os.environ.pop("FERRY_PROFILE", None)
                r = _hybrid_gbps(dst, src, n, share, direction, iterations)
                progress(f"calibrate: {direction} hybrid share {share} {r:.1f} GB/s")
                if r > best * 1.03:
                    best_share, best = share, r
            lines.append(f"hybrid_pinned_share_{direction} = {best_share}")
        buf.close()
    finally:
        _ferry.cuda_free(dev)
    return "\n".join(lines) + "\n"


def _hybrid_gbps(dst, src, n, share, direction, iterations) -> float:
    """Bandwidth of the hybrid strategy at a given pinned share (a private engine)."""
    import tempfile

    from .. import _ferry

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(f"hybrid_pinned_share_{direction} = {share}\n")
        path = f.name
    old = os.environ.get("FERRY_PROFILE")
    os.environ["FERRY_PROFILE"] = path
    try:
        eng = _ferry.Engine(0)
        return gbps(n, _ferry.copy_ns(eng, dst, src, n, "hybrid", iterations))
    finally:
        if old is None:
            os.environ.pop("FERRY_PROFILE", None)
        else:
            os.environ["FERRY_PROFILE"] = old
        os.unlink(path)


def profile_path() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ferry", "profile.txt")


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


class CopySuite(Suite):
    key = "copy"
    description = "pageable host<->GPU copies by size, direction and backing: ferry beside cudaMemcpy and torch"

    def add_arguments(self, p):
        p.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M,1G,2G", help="(default: %(default)s)")
        p.add_argument("--directions", default="h2d,d2h,bidir", help="(default: %(default)s)")
        p.add_argument("--backings", default="4k,thp,memfd", help="(default: %(default)s)")
        p.add_argument("--strategies", default=",".join(STRATEGIES), help="(default: %(default)s)")
        p.add_argument("--iterations", type=int, default=5, help="timed repeats per case (default: %(default)s)")
        p.add_argument("--no-torch", action="store_true", help="skip the torch baseline")
        p.add_argument("--plot", metavar="PNG", help="write a plot of bandwidth by size")
        p.add_argument("--calibrate", action="store_true", help="measure and write the machine profile")

    def run(self, args) -> int:
        if args.calibrate:
            text = calibrate(args.iterations)
            path = profile_path()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print(text + f"(written to {path})")
            return 0
        rows = measure(parse_size_list(args.sizes), args.directions.split(","), args.backings.split(","),
                       args.strategies.split(","), args.iterations, not args.no_torch)
        link = link_gbps([r["cuda_pinned"] for r in rows if r.get("cuda_pinned")])
        print_table(rows, link)
        write_json(args.json, self.key, {"link_gbps": link, "rows": rows})
        if args.plot:
            plot(rows, args.plot)
        return 0


SUITE = CopySuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
