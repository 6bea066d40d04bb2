"""`ferry bench blocks`: KV-cache blocks between pinned memory and the GPU.

The KV offload pattern: blocks of every size from 4 KiB to 2 MiB, `--bytes` per
call (1 GiB: 262,144 blocks of 4 KiB), between a ferry pinned pool and device
memory, in two layouts: scattered (both sides' blocks at shuffled places) and
adjacent (block i next to block i-1 on both sides: ferry merges them), each
direction alone and both at once (two threads, one per direction, no stream
given). Compared in one run:

  ferry            ferry.copy_many_async(int64 address arrays, one size), as a
                   connector calls it: the path ferry chooses (its `path`)
  ferry sm / dma   the same call forced through the SM kernel / the copy engines
  cuMemcpyBatchAsync  cudaMemcpyBatchAsync called directly from C++ on a
                   non-blocking stream per direction (vLLM's path; the baseline)
  torch loop       dst.copy_(src, non_blocking=True) per block (torch present,
                   blocks of 64 KiB and up, one direction, scattered)

GB/s = bytes of the call / median wall time (call to completion). CPU us/block
= median time inside the submitting call / blocks. With torch present (and
--gemm), the slowdown of a bf16 GEMM stream while ferry copies both ways:
8192^3 matmuls on their own stream, alone and beside the copies.
`--calibrate` writes the profile line batch_sm_below_bytes (the smallest size
from which the copy engines came within 5% of the SM kernel in this run: they
take no SMs from the model) into the machine profile file, keeping its other
lines; `ferry doctor` shows which profile file the engine reads.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from ..measure import median
from ..units import KiB, MiB, parse_size
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, size as size_arg, size_list

SIZES = "4K,8K,16K,32K,64K,128K,256K,512K,1M,2M"
LAYOUTS = ("scattered", "adjacent")
DIRECTIONS = ("h2d", "d2h", "both")
TORCH_FROM = 64 * KiB  # the torch loop's per-call cost makes smaller blocks minutes long
GEMMS = 20  # matmuls per timed sample


def _offsets(count: int, size: int, layout: str, seed: int):
    """Byte offsets of `count` blocks in a region of count * size: in order, or shuffled."""
    import numpy as np

    idx = np.arange(count, dtype=np.int64)
    if layout == "scattered":
        np.random.default_rng(seed).shuffle(idx)
    return idx * size


class _Region:
    """A pinned-pool region and a device region of `nbytes` each, blocks at the same indices."""

    def __init__(self, pool, nbytes: int):
        from .. import _ferry

        self.host = pool.alloc(nbytes, alignment=2 * MiB)
        self.dev = _ferry.cuda_malloc(nbytes)

    def release(self):
        from .. import _ferry

        _ferry.cuda_free(self.dev)
        self.host.release()


def _timed(call, repeats: int):
    """(median wall ns, median submit ns) of call() -> Copy, then its wait()."""
    walls, submits = [], []
    for i in range(-1, repeats):
        t0 = time.perf_counter_ns()
        c = call()
        t1 = time.perf_counter_ns()
        c.wait()
        t2 = time.perf_counter_ns()
        if i >= 0:
            walls.append(t2 - t0)
            submits.append(t1 - t0)
    return median(walls), median(submits)


def _timed_both(calls, repeats: int):
    """Both directions at once: one thread per call, started together; median
    wall ns until both are done, and the median of the slower submit."""
    walls, submits = [], []
    for i in range(-1, repeats):
        start = threading.Barrier(len(calls) + 1)
        ends, subs, errors = [0] * len(calls), [0] * len(calls), []

        def one(k):
            try:
                start.wait()
                t0 = time.perf_counter_ns()
                c = calls[k]()
                subs[k] = time.perf_counter_ns() - t0
                c.wait()
                ends[k] = time.perf_counter_ns()
            except BaseException as e:  # reported below, in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(calls))]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter_ns()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        if i >= 0:
            walls.append(max(ends) - t0)
            submits.append(max(subs))
    return median(walls), median(submits)


def _torch_loop_ns(pairs, repeats: int):
    import torch

    stream = torch.cuda.current_stream()
    walls = []
    for i in range(-1, repeats):
        t0 = time.perf_counter_ns()
        for d, s in pairs:
            d.copy_(s, non_blocking=True)
        stream.synchronize()
        if i >= 0:
            walls.append(time.perf_counter_ns() - t0)
    return median(walls)


def _ways(r_up, r_down, offs, size):
    """Address arrays per direction: h2d from region up's host blocks to its device
    blocks, d2h from region down's device blocks to its host blocks."""
    h_off, d_off = offs
    up = (r_up.dev + d_off, r_up.host.ptr + h_off)
    down = (r_down.host.ptr + h_off, r_down.dev + d_off)
    return {"h2d": up, "d2h": down}


def measure_case(count: int, size: int, layout: str, directions, regions, private, repeats: int, torch_loop: bool,
                 seed: int) -> list[dict]:
    import numpy as np

    from .. import _ferry
    from ..copy import copy_many_async

    total = count * size
    offs = (_offsets(count, size, layout, seed), _offsets(count, size, layout, seed + 1))
    ways = _ways(regions[0], regions[1], offs, size)
    sizes = np.full(count, size, dtype=np.int64)
    rows = []
    for direction in directions:
        legs = ("h2d", "d2h") if direction == "both" else (direction,)
        row = {"blocks": count, "block_bytes": size, "layout": layout, "direction": direction}

        def ferry_calls(strategy, engine=None):
            if engine is None:
                return [lambda w=ways[k]: copy_many_async(w[0], w[1], size, strategy=strategy) for k in legs]
            return [lambda w=ways[k]: engine.copy_many_async(w[0], w[1], sizes, None, strategy) for k in legs]

        def run(calls):
            wall, sub = (_timed(calls[0], repeats) if len(calls) == 1 else _timed_both(calls, repeats))
            return total * len(calls) / wall, sub / 1e3 / count

        probe = copy_many_async(ways[legs[0]][0], ways[legs[0]][1], size)
        probe.wait()
        row["path"] = probe.strategy
        row["ferry"], row["ferry_cpu_us"] = run(ferry_calls(None))
        row["ferry_sm"], _ = run(ferry_calls("sm"))
        row["ferry_dma"], _ = run(ferry_calls("direct"))
        for key, (_, _, engine) in private.items():
            row[key], _ = run(ferry_calls("sm", engine))
        walls, subs = _ferry.memcpy_batch_ns([(ways[k][0], ways[k][1], sizes) for k in legs], repeats)
        row["batch"] = total * len(legs) / median(walls)
        row["batch_cpu_us"] = median(subs) / 1e3 / count
        row["torch_loop"] = None
        if torch_loop and direction != "both" and layout == "scattered" and size >= TORCH_FROM:
            row["torch_loop"] = total / _torch_loop_ns(_torch_pairs(ways[direction], direction, count, size), repeats)
        rows.append(row)
        progress(f"{size // KiB} KiB {layout} {direction}: ferry {row['ferry']:.1f} GB/s ({row['path']}), "
                 f"cuMemcpyBatchAsync {row['batch']:.1f}, CPU {row['ferry_cpu_us']:.3f} us/block")
    return rows


def _torch_pairs(way, direction: str, count: int, size: int):
    """torch views (dst, src) of one direction's blocks, over ferry's memory (no copy)."""
    dsts, srcs = way
    dev_is_dst = direction == "h2d"
    return [(_view(int(dsts[k]), size, dev_is_dst), _view(int(srcs[k]), size, not dev_is_dst)) for k in range(count)]


class _DeviceBlock:
    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


def _view(address: int, nbytes: int, device: bool):
    """A uint8 torch tensor over `nbytes` at `address` (device, or ferry's pinned host memory)."""
    import torch

    from .. import _ferry

    if device:
        return torch.as_tensor(_DeviceBlock(address, nbytes), device="cuda")
    # No owner: the bench's regions (measure_case's caller) outlive every view of them.
    return torch.frombuffer(_ferry.MemorySpan(address, nbytes, None), dtype=torch.uint8)


def gemm_slowdown(regions, size: int, total: int, variant: tuple | None, repeats: int) -> dict:
    """A bf16 8192^3 matmul stream alone, then beside ferry copying `total` bytes
    in `size` blocks both ways in a loop (scattered; the default path, or the SM
    kernel through variant = (sms, launch_bytes, engine): an engine whose profile
    sets one of them): the GEMMs' slowdown and the copies' GB/s meanwhile."""
    import numpy as np
    import torch

    from ..copy import copy_many_async

    count = total // size
    offs = (_offsets(count, size, "scattered", 7), _offsets(count, size, "scattered", 8))
    ways = _ways(regions[0], regions[1], offs, size)
    sms, launch_bytes, engine = variant if variant is not None else (0, None, None)
    sizes = np.full(count, size, dtype=np.int64)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    stream = torch.cuda.Stream()

    def gemms(n=GEMMS):
        t0 = time.perf_counter_ns()
        with torch.cuda.stream(stream):
            for _ in range(n):
                torch.matmul(a, b, out=c)
        stream.synchronize()
        return time.perf_counter_ns() - t0

    gemms(3)
    alone = [gemms() for _ in range(repeats)]
    stop = threading.Event()
    moved = [0, 0]

    failed = []

    def copier(k, w):
        try:
            while not stop.is_set():
                if engine is None:
                    copy_many_async(w[0], w[1], size).wait()
                else:
                    engine.copy_many_async(w[0], w[1], sizes, None, "sm").wait()
                moved[k] += total
        except BaseException as e:  # raised in the main thread below, not printed by the thread
            failed.append(e)
            stop.set()

    threads = [threading.Thread(target=copier, args=(k, ways[d])) for k, d in enumerate(("h2d", "d2h"))]
    for t in threads:
        t.start()
    time.sleep(0.05)
    t0, before = time.perf_counter_ns(), sum(moved)
    beside = median([gemms() for _ in range(repeats)])
    copied = (sum(moved) - before) / (time.perf_counter_ns() - t0)
    stop.set()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    alone = median(alone + [gemms() for _ in range(repeats)])  # before and after: the clocks drift
    return {"block_bytes": size, "sms": sms or 0, "launch_bytes": launch_bytes, "gemm_alone_ms": alone / 1e6 / GEMMS,
            "gemm_beside_ms": beside / 1e6 / GEMMS, "slowdown_pct": (beside / alone - 1) * 100,
            "copies_gbps": copied}


def _variants(sm_counts, launch_bytes) -> dict:
    """Engines of their own for --sm-counts and --sm-launch-bytes: row key ->
    (sms, launch bytes per SM, engine); 0 / None: the profile's."""
    from .. import _ferry

    out = {f"ferry_sm{n}": (n, None, _ferry.Engine(0, profile=f"batch_sm_max_sms = {n}")) for n in sm_counts}
    out.update({f"ferry_launch{b}": (0, b, _ferry.Engine(0, profile=f"batch_sm_launch_bytes = {b}"))
                for b in launch_bytes})
    return out


def variant_label(key: str) -> str:
    """A _variants key as a column: 'SM x4', 'SM launch 1024 KiB' ('one launch' for 0)."""
    if key.startswith("ferry_sm"):
        return f"SM x{key[8:]}"
    b = int(key[12:])
    return f"SM launch {b // KiB} KiB" if b else "SM one launch"


def measure(cases, layouts, directions, repeats: int, sm_counts=(), gemm=True, torch_loop=True,
            launch_bytes=()) -> dict:
    from ..copy import engine
    from ..pool import PinnedPool

    have_torch = False
    if torch_loop or gemm:
        try:
            import torch

            have_torch = torch.cuda.is_available()
        except ImportError:
            pass
    eng = engine(0)
    eng.warm_up()
    largest = max(c * s for c, s in cases)
    pool = PinnedPool(device=0, zero_recycled=False)
    regions = [_Region(pool, largest), _Region(pool, largest)]
    private = _variants(sm_counts, launch_bytes)
    out = {"rows": [], "gemm": []}
    try:
        for count, size in cases:
            for layout in layouts:
                out["rows"] += measure_case(count, size, layout, directions, regions, private, repeats,
                                            torch_loop and have_torch, seed=count * size)
        if gemm and have_torch:
            total = min(largest, 256 * MiB)
            for size, key in [(4 * KiB, None), *[(4 * KiB, k) for k in private], (2 * MiB, None)]:
                if total < size:  # no whole block in the largest case's regions (a small --blocks)
                    continue
                g = gemm_slowdown(regions, size, total, private.get(key), repeats)
                g["engine"] = variant_label(key) if key else "default"
                out["gemm"].append(g)
                progress(f"GEMM beside {size // KiB} KiB copies ({g['engine']}): "
                         f"{g['slowdown_pct']:+.1f}%, copies {g['copies_gbps']:.1f} GB/s")
    finally:
        for r in regions:
            r.release()
    return out


CASES = {"ferry": "ferry copy_many", "ferry_sm": "ferry sm", "ferry_dma": "ferry dma",
         "batch": "cuMemcpyBatchAsync", "torch_loop": "torch copy_ loop"}
BASELINE = "cuMemcpyBatchAsync"


def records(result) -> list[dict]:
    """GB/s of each way of copying the blocks beside cuMemcpyBatchAsync; CPU us per block;
    the GEMM slowdowns."""
    rows = result["rows"] if isinstance(result, dict) else result
    out = Records(BlocksSuite.key)
    for r in rows:
        params = {"blocks": r["blocks"], "block_bytes": r["block_bytes"], "layout": r.get("layout", "scattered"),
                  "direction": "bidir" if r["direction"] == "both" else r["direction"]}
        values = {case: r.get(key) for key, case in CASES.items()}
        values.update({f"ferry sm {k[8:]} SMs": v for k, v in r.items() if k.startswith("ferry_sm") and k[8:]})
        values.update({f"ferry {variant_label(k)}": v for k, v in r.items() if k.startswith("ferry_launch")})
        out.compare(params, "bandwidth", "GB/s", values, baseline=BASELINE)
        out.compare(params, "submit_per_block", "us", {"ferry copy_many": r.get("ferry_cpu_us"),
                                                      BASELINE: r.get("batch_cpu_us")}, baseline=BASELINE)
    for g in (result.get("gemm", []) if isinstance(result, dict) else []):
        out.add("bf16 GEMM beside ferry copies", "slowdown", g["slowdown_pct"], "%", block_bytes=g["block_bytes"],
                sms=g["sms"], launch_bytes=g.get("launch_bytes"), direction="bidir")
    return out.items


# The copy engines take no SMs from the model: they are preferred wherever they
# come this close to the SM kernel.
DMA_WITHIN = 0.95


def calibrate(rows) -> str | None:
    """batch_sm_below_bytes: the smallest scattered block size from which the copy
    engines reach DMA_WITHIN of the SM kernel in every direction (and at every
    larger size), or None."""
    by = {}
    for r in rows:
        if r.get("layout", "scattered") == "scattered" and r["direction"] != "both":
            by.setdefault(r["block_bytes"], []).append(r["ferry_dma"] >= DMA_WITHIN * r["ferry_sm"])
    for size in sorted(by):
        if all(by[size]) and all(all(by[s]) for s in by if s > size):
            return f"batch_sm_below_bytes = {size}"
    return None


def write_calibration(line: str) -> str | None:
    """Puts `line` (key = value) into the machine profile file the engine reads
    (FERRY_PROFILE's, else the cache's), keeping its other lines; the path, or
    None when there is nowhere to write."""
    import os

    from .. import _ferry

    path, _ = _ferry.profile_file_path()
    if path is None:
        return None
    key = line.split("=", 1)[0].strip()
    try:
        with open(path) as f:
            old = f.read().splitlines()
    except FileNotFoundError:
        old = ["# ferry machine profile"]
    kept = [x for x in old if x.split("#", 1)[0].split("=", 1)[0].strip() != key]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(kept + [f"{line}  # ferry bench blocks --calibrate"]) + "\n")
    return path


def launch_bytes_list(text: str) -> list[int]:
    """--sm-launch-bytes: sizes, 0 among them (one launch per call)."""
    return [0 if x.strip() == "0" else parse_size(x) for x in text.split(",") if x.strip()]


class BlocksSuite(Suite):
    key = "blocks"
    description = ("KV-cache blocks 4 KiB-2 MiB, pinned pool <-> GPU, scattered and adjacent, each way and both: "
                   "ferry beside cuMemcpyBatchAsync and a torch loop; CPU per block; GEMM slowdown")

    def add_arguments(self, p):
        p.add_argument("--sizes", type=size_list, default=SIZES, help="block sizes (default: %(default)s)")
        p.add_argument("--bytes", type=size_arg, default="1G", help="bytes per call (default: %(default)s)")
        p.add_argument("--blocks", default=None,
                       help="COUNTxSIZE list instead of --sizes/--bytes (e.g. 1024x16K,1024x64K)")
        p.add_argument("--layouts", default=",".join(LAYOUTS), help="scattered,adjacent (default: %(default)s)")
        p.add_argument("--directions", default=",".join(DIRECTIONS), help="h2d,d2h,both (default: %(default)s)")
        p.add_argument("--sm-counts", default="", help="also the SM kernel on these SM counts, e.g. 4,16")
        p.add_argument("--sm-launch-bytes", type=launch_bytes_list, default=[],
                       help="also the SM kernel with these bytes per SM per launch (profile batch_sm_launch_bytes; "
                            "0: one launch per call), e.g. 0,1M")
        p.add_argument("--gemm", action=argparse.BooleanOptionalAction, default=True,
                       help="measure a concurrent bf16 GEMM's slowdown (needs torch; default: on)")
        p.add_argument("--torch-loop", action=argparse.BooleanOptionalAction, default=True,
                       help="time a torch copy_ loop too (needs torch; default: on)")
        p.add_argument("--calibrate", action="store_true",
                       help="write batch_sm_below_bytes, measured in this run, into the machine profile")
        add_repeats(p, 5, "timed calls per case", old=("--iterations",))

    def run(self, args) -> int:
        from ..units import parse_size_list

        if args.blocks:
            cases = []
            for item in args.blocks.split(","):
                count, sz = item.lower().split("x")
                cases.append((int(count), parse_size(sz)))
        else:
            per_call = parse_size(args.bytes)
            cases = [(max(1, per_call // s), s) for s in parse_size_list(args.sizes)]
        layouts = [x for x in args.layouts.split(",") if x]
        directions = [x for x in args.directions.split(",") if x]
        bad = [x for x in layouts if x not in LAYOUTS] + [x for x in directions if x not in DIRECTIONS]
        if bad:
            print(f"ferry bench blocks: unknown layout or direction {bad}", file=sys.stderr)
            return 2
        sm_counts = [int(x) for x in args.sm_counts.split(",") if x]
        launch_bytes = args.sm_launch_bytes
        result = measure(cases, layouts, directions, args.repeats, sm_counts, args.gemm, args.torch_loop,
                         launch_bytes)
        rows = result["rows"]
        extra = [f"ferry_sm{n}" for n in sm_counts] + [f"ferry_launch{b}" for b in launch_bytes]
        out = [[r["block_bytes"] // KiB, r["blocks"], r["layout"], r["direction"], r["ferry"], r["path"],
                r["ferry_sm"], r["ferry_dma"], *[r[k] for k in extra], r["batch"], r["ferry"] / r["batch"],
                r["torch_loop"], r["ferry_cpu_us"], r["batch_cpu_us"]] for r in rows]
        print(table("KV blocks, pinned pool <-> device (GB/s; both: the two directions together)",
                    ["KiB", "blocks", "layout", "dir", "ferry", "path", "ferry SM", "ferry DMA",
                     *[variant_label(k) for k in extra], "cuMemcpyBatch", "ferry x batch", "torch loop",
                     "ferry us/blk", "batch us/blk"], out))
        if result["gemm"]:
            print(table("bf16 8192^3 GEMM beside ferry copies both ways (256 MiB calls, scattered)",
                        ["block KiB", "engine", "GEMM alone ms", "GEMM beside ms", "slowdown %", "copies GB/s"],
                        [[g["block_bytes"] // KiB, g["engine"], g["gemm_alone_ms"], g["gemm_beside_ms"],
                          g["slowdown_pct"], g["copies_gbps"]] for g in result["gemm"]]))
        if args.calibrate:
            line = calibrate(rows)
            if line is None:
                print("calibrate: the SM kernel won at every size measured; the profile keeps its value")
            else:
                path = write_calibration(line)
                print(f"{line}\n(written to {path}; the copy engine reads it from the next process on)" if path
                      else f"{line}\n(nowhere to write it: set XDG_CACHE_HOME, HOME or FERRY_PROFILE)")
        write_json(args.json, self.key, records(result))
        return 0


SUITE = BlocksSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
