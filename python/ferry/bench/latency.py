"""`ferry bench latency`: small host<->GPU copies, like gdrcopy_copylat.

For each size (1 B .. 64 KiB) and direction: ferry's channel (write = host to
device, read = device to host) beside cudaMemcpy from a pageable buffer and
cudaMemcpyAsync + cudaStreamSynchronize from a pinned buffer, in one run.
Then the round trip of an empty request (ping, like gdrcopy_pplat), the first
request after the channel's kernel went idle, and (with torch) pings while the
GPU is saturated by matrix products on another stream. All timing loops run in
C++; figures are median, min and p99 in microseconds.
"""

from __future__ import annotations

import sys
import time

from ..measure import median, percentile
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats

SIZES = (1, 4, 64, 1024, 4096, 16384, 65536)


def stats_us(ns: list[int]) -> dict:
    return {"median_us": median(ns) / 1e3, "min_us": min(ns) / 1e3, "p99_us": percentile(ns, 99) / 1e3}


def measure(iterations: int) -> dict:
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
    rows = []
    ch = Channel(device=0)
    try:
        for n in SIZES:
            for direction in ("h2d", "d2h"):
                progress(f"latency {direction} {n} B")
                op = "write" if direction == "h2d" else "read"
                ch.time_ns(op, dev, n, 50)  # warm: the kernel is running
                chan = ch.time_ns(op, dev, n, iterations)
                dst, src = (dev, page_addr) if direction == "h2d" else (page_addr, dev)
                pdst, psrc = (dev, pinned) if direction == "h2d" else (pinned, dev)
                memcpy = _ferry.cuda_memcpy_ns(dst, src, n, iterations)
                asynch = _ferry.cuda_memcpy_async_ns(pdst, psrc, n, iterations)
                row = {"nbytes": n, "direction": direction}
                for key, ns in (("channel", chan), ("cudaMemcpy", memcpy), ("cudaMemcpyAsync_pinned", asynch)):
                    row[key] = stats_us(ns)
                rows.append(row)
        progress("ping-pong")
        ch.time_ns("ping", 0, 0, 50)
        ping = stats_us(ch.time_ns("ping", 0, 0, iterations))
        progress("first request after idle")
        after_idle = []
        for _ in range(50):
            time.sleep(max(0.002, 3 * ch.idle_us / 1e6))
            after_idle += ch.time_ns("write", dev, 4, 1)
        busy = saturated_pings(ch, iterations)
        result = {"copies": rows, "ping": ping, "first_after_idle": stats_us(after_idle),
                  "idle_us": ch.idle_us, "stats": ch.stats()}
        if busy:
            result["ping_while_gpu_busy"] = busy
        return result
    finally:
        ch.close()
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
        rows.append([row["nbytes"], row["direction"], c["median_us"], c["min_us"], c["p99_us"],
                     m["median_us"], m["p99_us"], a["median_us"], m["median_us"] / c["median_us"]])
    print(table("Small copies (channel: ferry's persistent kernel; cudaMemcpy: pageable host buffer)",
                ["Size(B)", "dir", "channel Median(us)", "Min(us)", "p99(us)", "cudaMemcpy Median(us)",
                 "p99(us)", "cudaMemcpyAsync pinned Median(us)", "x cudaMemcpy"], rows))
    print()
    extra = [["ping-pong (empty request round trip)", r["ping"]["median_us"], r["ping"]["min_us"], r["ping"]["p99_us"]],
             [f"first 4 B write after {r['idle_us']} us idle", r["first_after_idle"]["median_us"],
              r["first_after_idle"]["min_us"], r["first_after_idle"]["p99_us"]]]
    if "ping_while_gpu_busy" in r:
        b = r["ping_while_gpu_busy"]
        extra.append(["ping while the GPU runs bf16 matmuls", b["median_us"], b["min_us"], b["p99_us"]])
    print(table("Channel round trips", ["case", "Median(us)", "Min(us)", "p99(us)"], extra))


COPY_CASES = {"channel": "ferry channel", "cudaMemcpy": "cudaMemcpy pageable",
              "cudaMemcpyAsync_pinned": "cudaMemcpyAsync pinned"}


def records(r: dict) -> list[dict]:
    """Median, min and p99 microseconds per case (metrics latency_median,
    latency_min, latency_p99); small copies compare the channel with cudaMemcpy
    from pageable memory; the round trips have no baseline. The channel's
    idle_us and its counters are facts of the run (case "channel")."""
    out = Records(LatencySuite.key)
    for row in r["copies"]:
        for stat in ("median", "min", "p99"):
            out.compare({"nbytes": row["nbytes"], "direction": row["direction"]}, f"latency_{stat}", "us",
                        {case: row[key][f"{stat}_us"] for key, case in COPY_CASES.items()},
                        baseline={"ferry channel": "cudaMemcpy pageable"})
    trips = [("ferry channel ping", r["ping"], {}),
             ("ferry channel first request after idle", r["first_after_idle"], {"nbytes": 4})]
    if "ping_while_gpu_busy" in r:
        busy = r["ping_while_gpu_busy"]
        trips.append(("ferry channel ping while the GPU runs matmuls", busy,
                      {"gpu_still_busy_at_end": busy.get("gpu_still_busy_at_end")}))
    for case, stats, params in trips:
        for stat in ("median", "min", "p99"):
            out.add(case, f"latency_{stat}", stats[f"{stat}_us"], "us", idle_us=r["idle_us"], **params)
    out.add("channel", "idle_us", r["idle_us"], "us")
    for key, value in (r.get("stats") or {}).items():
        if isinstance(value, (int, float)):
            out.add("channel", key, value, None)
    return out.items


class LatencySuite(Suite):
    key = "latency"
    description = "small host<->GPU copies and round trips: ferry's channel beside cudaMemcpy, like gdrcopy_copylat"

    def add_arguments(self, p):
        add_repeats(p, 2000, "requests per case", old=("--iterations",))

    def run(self, args) -> int:
        r = measure(args.repeats)
        print_tables(r)
        write_json(args.json, self.key, records(r))
        return 0


SUITE = LatencySuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
