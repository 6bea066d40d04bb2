"""`ferry bench apiperf`: the time of each API call, like gdrcopy_apiperf.

Pool create / first allocation / recycled alloc+free, ferry.register and
unregister beside cudaHostRegister / cudaHostUnregister for 64 KiB .. 1 GiB of
touched pageable memory, and the channel's create, first request (kernel
launch) and request after the kernel went idle. Median of --repeats runs, in
microseconds.
"""

from __future__ import annotations

import sys
import time

from ..measure import median
from ..units import GiB, KiB, MiB
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def pool_calls(reps: int) -> list[list]:
    import ferry
    from .. import _ferry

    rows = []
    rows.append(["Pool() (host)", median([timed(lambda: ferry.Pool()) for _ in range(reps)])])
    rows.append(["PinnedPool()", median([timed(lambda: ferry.PinnedPool(device=0)) for _ in range(reps)])])
    first = []
    for _ in range(reps):
        p = ferry.PinnedPool(device=0)
        first.append(timed(lambda: p.alloc(MiB)))  # reserves, touches and pins a 64 MiB chunk
    rows.append(["PinnedPool.alloc(1 MiB), first (pins a 64 MiB chunk)", median(first)])
    pool = ferry.PinnedPool(device=0, zero_recycled=False)
    ns = _ferry.pool_recycle_ns(pool._native, MiB, 256, 1000)
    rows.append(["alloc+free 1 MiB, recycled (C++ loop)", median(ns) / 1e3])
    return rows


def register_calls(reps: int) -> list[list]:
    import ferry
    from .. import _ferry

    rows = []
    for n in (64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB):
        progress(f"register {n // KiB} KiB")
        m = _ferry.Mapping.anonymous(n + 4 * MiB, False)  # 4 KiB pages (MADV_NOHUGEPAGE), through src/os
        view = memoryview(m)
        for off in range(0, len(view), 4096):
            view[off] = 1
        view.release()
        addr = m.address
        base = (addr + 2 * MiB - 1) & ~(2 * MiB - 1)
        reg, unreg, cuda_reg, cuda_unreg = [], [], [], []
        for _ in range(reps):
            r = None

            def do_register():
                nonlocal r
                r = ferry.register(base, n)

            reg.append(timed(do_register))
            unreg.append(timed(r.unregister))
            a, b = _ferry.cuda_host_register_seconds(base, n, 0)
            cuda_reg.append(a * 1e6)
            cuda_unreg.append(b * 1e6)
        rows.append([f"register {n // KiB} KiB", median(reg), median(cuda_reg)])
        rows.append([f"unregister {n // KiB} KiB", median(unreg), median(cuda_unreg)])
        m.close()
    return rows


def channel_calls(reps: int) -> list[list]:
    from .. import _ferry
    from ..channel import Channel

    dev = _ferry.cuda_malloc(MiB)
    create, first, after_idle = [], [], []
    try:
        for _ in range(reps):
            ch = None

            def make():
                nonlocal ch
                ch = Channel(device=0)

            create.append(timed(make))
            first.append(ch.time_ns("write", dev, 4, 1)[0] / 1e3)
            time.sleep(0.005)
            after_idle.append(ch.time_ns("write", dev, 4, 1)[0] / 1e3)
            ch.close()
    finally:
        _ferry.cuda_free(dev)
    return [["Channel() (no kernel yet)", median(create)], ["first request (launches the kernel)", median(first)],
            ["request after 5 ms idle (relaunch)", median(after_idle)]]


def records(pools: list[list], regs: list[list], chans: list[list]) -> list[dict]:
    """Median microseconds per call; registration rows compare ferry with
    cudaHostRegister / cudaHostUnregister on the same memory (params: nbytes)."""
    out = Records(ApiperfSuite.key)
    for call, us in pools:
        out.add(call, "time_median", us, "us", table="pool")
    for call, ferry_us, cuda_us in regs:
        verb, size = call.split(" ", 1)  # "register 64 KiB"
        nbytes = int(size.split()[0]) * KiB
        cuda = "cudaHostRegister" if verb == "register" else "cudaHostUnregister"
        out.compare({"table": "registration", "nbytes": nbytes}, "time_median", "us",
                    {f"ferry {verb}": ferry_us, cuda: cuda_us}, baseline=cuda)
    for call, us in chans:
        out.add(call, "time_median", us, "us", table="channel")
    return out.items


class ApiperfSuite(Suite):
    key = "apiperf"
    description = "the time of each API call (pool, registration, channel) beside CUDA's, like gdrcopy_apiperf"

    def add_arguments(self, p):
        add_repeats(p, 5, "runs per call", old=("--reps",))

    def run(self, args) -> int:
        from .. import _ferry

        _ferry.cuda_warm_up(0)
        pools = pool_calls(args.repeats)
        regs = register_calls(args.repeats)
        chans = channel_calls(args.repeats)
        print(table("Pool calls", ["call", "Median(us)"], pools))
        print()
        print(table("Registration (4 KiB pages, touched; ferry widens a range to whole 2 MiB pages)",
                    ["call", "ferry Median(us)", "cudaHost(Un)Register Median(us)"], regs))
        print()
        print(table("Channel calls", ["call", "Median(us)"], chans))
        write_json(args.json, self.key, records(pools, regs, chans))
        return 0


SUITE = ApiperfSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
