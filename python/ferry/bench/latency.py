"""`ferry bench latency`: small host<->GPU copies, like gdrcopy_copylat.

For each size (1 B .. 64 KiB) and direction: ferry's channel (write = host to
device, read = device to host) beside cudaMemcpy from a pageable buffer and
cudaMemcpyAsync + cudaStreamSynchronize from a pinned buffer, in one run.
Then the round trip of an empty request (ping, like gdrcopy_pplat), the first
request after the channel's kernel went idle, and (with torch) pings while the
GPU is saturated by matrix products on another stream. The channel cases run
once per --pollers value (the kernel's polling warps; one channel at a time),
the baselines once. All timing loops run in C++; figures are median, min and
p99 in microseconds.
"""

from __future__ import annotations

import argparse
import sys
import time

from .report import waived_without_device, median, percentile, progress, table, write_json

SIZES = (1, 4, 64, 1024, 4096, 16384, 65536)
MAX_POLLERS = 8  # ChannelOptions::pollers


def stats_us(ns: list[int]) -> dict:
    return {"median_us": median(ns) / 1e3, "min_us": min(ns) / 1e3, "p99_us": percentile(ns, 99) / 1e3}


def parse_pollers(text: str) -> list[int]:
    """'1,4' -> [1, 4]: polling-warp counts, each 1 .. 8, in the given order."""
    from ..errors import InvalidArgumentError

    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            n = int(item)
        except ValueError:
            raise InvalidArgumentError(f"--pollers '{text}': '{item}' is not a number (expected e.g. 1,4)") from None
        if not 1 <= n <= MAX_POLLERS:
            raise InvalidArgumentError(f"--pollers '{text}': {n} is outside 1 .. {MAX_POLLERS}")
        if n not in values:
            values.append(n)
    if not values:
        raise InvalidArgumentError(f"--pollers '{text}': expected at least one number, e.g. 1,4")
    return values


def measure(iterations: int, pollers: list[int]) -> dict:
    try:  # torch (for the saturated case) is imported before ferry starts its kernel
        import torch  # noqa: F401
    except ImportError:
        pass
    from .. import _ferry
    from ..channel import Channel

    dev = _ferry.cuda_malloc(1 << 20)
    pinned = _ferry.cuda_host_alloc(1 << 20)
    pageable = bytearray(1 << 20)
    page_addr = _ferry.buffer_address(pageable, True)[0]
    try:
        baselines = {}  # (nbytes, direction) -> the two baselines, measured once
        for n in SIZES:
            for direction in ("h2d", "d2h"):
                progress(f"latency baselines {direction} {n} B")
                dst, src = (dev, page_addr) if direction == "h2d" else (page_addr, dev)
                pdst, psrc = (dev, pinned) if direction == "h2d" else (pinned, dev)
                baselines[n, direction] = {
                    "cudaMemcpy": stats_us(_ferry.cuda_memcpy_ns(dst, src, n, iterations)),
                    "cudaMemcpyAsync_pinned": stats_us(_ferry.cuda_memcpy_async_ns(pdst, psrc, n, iterations)),
                }
        rows, round_trips, idle_us = [], [], None
        for k in pollers:
            ch = Channel(device=0, pollers=k)
            try:
                idle_us = ch.idle_us
                for n in SIZES:
                    for direction in ("h2d", "d2h"):
                        progress(f"latency {direction} {n} B, pollers={k}")
                        op = "write" if direction == "h2d" else "read"
                        ch.time_ns(op, dev, n, 50)  # warm: the kernel is running
                        row = {"pollers": k, "nbytes": n, "direction": direction,
                               "channel": stats_us(ch.time_ns(op, dev, n, iterations))}
                        row.update(baselines[n, direction])
                        rows.append(row)
                progress(f"ping-pong, pollers={k}")
                ch.time_ns("ping", 0, 0, 50)
                trip = {"pollers": k, "ping": stats_us(ch.time_ns("ping", 0, 0, iterations))}
                progress(f"first request after idle, pollers={k}")
                after_idle = []
                for _ in range(50):
                    time.sleep(max(0.002, 3 * ch.idle_us / 1e6))
                    after_idle += ch.time_ns("write", dev, 4, 1)
                trip["first_after_idle"] = stats_us(after_idle)
                busy = saturated_pings(ch, iterations)
                if busy:
                    trip["ping_while_gpu_busy"] = busy
                trip["stats"] = ch.stats()
                round_trips.append(trip)
            finally:
                ch.close()
        return {"pollers": pollers, "copies": rows, "round_trips": round_trips, "idle_us": idle_us}
    finally:
        _ferry.cuda_free(dev)
        _ferry.cuda_free_host(pinned)


def saturated_pings(ch, iterations: int) -> dict | None:
    """Ping latency while another stream runs matrix products (needs torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    progress("pings while the GPU runs matrix products")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        for _ in range(60):
            a @ a
    ns = ch.time_ns("ping", 0, 0, min(iterations, 500))
    busy = s.query() is False
    torch.cuda.synchronize()
    out = stats_us(ns)
    out["gpu_still_busy_at_end"] = busy
    return out


def print_tables(r: dict) -> None:
    rows = []
    for row in r["copies"]:
        c, m, a = row["channel"], row["cudaMemcpy"], row["cudaMemcpyAsync_pinned"]
        rows.append([row["nbytes"], row["direction"], row["pollers"], c["median_us"], c["min_us"], c["p99_us"],
                     m["median_us"], m["p99_us"], a["median_us"], m["median_us"] / c["median_us"]])
    print(table("Small copies (channel: ferry's persistent kernel; cudaMemcpy: pageable host buffer)",
                ["Size(B)", "dir", "pollers", "channel Median(us)", "Min(us)", "p99(us)", "cudaMemcpy Median(us)",
                 "p99(us)", "cudaMemcpyAsync pinned Median(us)", "x cudaMemcpy"], rows))
    print()
    extra = []
    for t in r["round_trips"]:
        k = t["pollers"]
        extra.append(["ping-pong (empty request round trip)", k, t["ping"]["median_us"], t["ping"]["min_us"],
                      t["ping"]["p99_us"]])
        extra.append([f"first 4 B write after {r['idle_us']} us idle", k, t["first_after_idle"]["median_us"],
                      t["first_after_idle"]["min_us"], t["first_after_idle"]["p99_us"]])
        if "ping_while_gpu_busy" in t:
            b = t["ping_while_gpu_busy"]
            extra.append(["ping while the GPU runs bf16 matmuls", k, b["median_us"], b["min_us"], b["p99_us"]])
    print(table("Channel round trips", ["case", "pollers", "Median(us)", "Min(us)", "p99(us)"], extra))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ferry bench latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=2000, help="requests per case (default: %(default)s)")
    p.add_argument("--pollers", metavar="LIST", default="1,4",
                   help="the channel's polling warps (1 .. 8), one set of channel rows each "
                        "(default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write results as JSON")
    args = p.parse_args(argv)
    pollers = parse_pollers(args.pollers)

    if waived_without_device("latency"):
        return 0
    r = measure(args.iterations, pollers)
    print_tables(r)
    write_json(args.json, "latency", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
