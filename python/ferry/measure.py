"""The measurements of `ferry doctor`: one function per figure, plain numbers out.

Units: GB/s are 10^9 bytes per second in one direction; seconds; microseconds
(us). Bandwidth is the median of the timed repeats (each function warms up
once first); timing loops run in C++ (`ferry._ferry`), so Python is not measured.

Every function raises on failure: `Skipped` when the measurement does not apply
on this machine (its message says why), anything else when it broke.
`guarded()` turns either into a reason, so that `ferry doctor` lists the
measurement as skipped instead of stopping. The GPU functions need a CUDA device
(`gpu_absent_reason()` says why there is none) and free what they allocate.
No function here imports torch.

Also the tools every measurement shares, the doctor's and the bench suites':
`HostBuffer` (touched pageable memory of a chosen backing), `gbps` (the rate of
the median timing), `median` / `percentile`, and `gpu_absent_reason` (the one
"is there a GPU" check, from ``ferry.gpu_check``). Memory is mapped and inspected by
src/os through ``_ferry.Mapping`` (no mmap, memfd or /proc reads of this module's own).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable

from . import _ferry, gpu_check
from .errors import InvalidArgumentError, MeasurementError
from .pool import PinnedPool, Pool
from .units import HUGE_PAGE, KiB, MiB


class Skipped(Exception):
    """A measurement that does not apply on this machine; the message says why."""


def guarded(fn: Callable, *args, **kwargs) -> tuple[Any, str | None]:
    """(fn's result, None), or (None, why) when it raised."""
    try:
        return fn(*args, **kwargs), None
    except Skipped as e:
        return None, str(e)
    except Exception as e:  # a broken measurement must not stop the doctor
        return None, f"{type(e).__name__}: {e}"


def median(values: list[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank), NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, round(p / 100 * (len(v) - 1))))
    return v[k]


def gbps(nbytes: int, ns: list[int]) -> float:
    """GB/s of nbytes moved in the median of the timings `ns` (nanoseconds); NaN when
    there is no usable timing (the bench tables print it as '-')."""
    m = median(ns)
    return nbytes / m if m == m and m > 0 else float("nan")  # bytes per ns == GB/s


def _usable_gbps(nbytes: int, ns: list[int]) -> float:
    """gbps(), or MeasurementError when there is no usable timing (the doctor lists it)."""
    rate = gbps(nbytes, ns)
    if not (rate > 0 and math.isfinite(rate)):
        raise MeasurementError(f"no usable timing of {nbytes} bytes: {list(ns)[:5]} ns")
    return rate


gpu_absent_reason = gpu_check.gpu_absent_reason  # the one check, re-exported for the doctor and benches


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_counts(cpus: int, most: int | None = 16) -> list[int]:
    """1, 2, 4, 8, ... up to min(cpus, most), plus that cap itself: 12 -> 1, 2, 4, 8, 12."""
    cap = max(1, cpus if most is None else min(cpus, most))
    counts = []
    t = 1
    while t <= cap:
        counts.append(t)
        t *= 2
    if counts[-1] != cap:
        counts.append(cap)
    return counts


class HostBuffer:
    """Touched pageable host memory of one backing; .addr is its address, .map a
    memoryview of it (its ``_ferry.Mapping``: src/os maps and advises it).

    backing: "4k" (anonymous, MADV_NOHUGEPAGE), "thp" (anonymous, MADV_HUGEPAGE),
    "memfd" (shmem) or "memfd-thp" (shmem, MADV_HUGEPAGE: huge only where
    transparent_hugepage/shmem_enabled allows). The mapping is nbytes rounded up to
    2 MiB, 2 MiB aligned; every page is written (random bytes) so a copy measures the
    copy, not faults."""

    BACKINGS = ("4k", "thp", "memfd", "memfd-thp")

    def __init__(self, nbytes: int, backing: str):
        if backing not in self.BACKINGS:
            raise InvalidArgumentError(f"backing {backing!r}: expected one of {', '.join(self.BACKINGS)}")
        self.nbytes = nbytes
        if backing.startswith("memfd"):
            self.mapping = _ferry.Mapping.memfd(nbytes, True if backing == "memfd-thp" else None, "ferry-host-buffer")
        else:
            self.mapping = _ferry.Mapping.anonymous(nbytes, backing == "thp")
        self.map = memoryview(self.mapping)
        size = len(self.map)
        pattern = os.urandom(MiB)
        for off in range(0, size, MiB):
            self.map[off : off + min(MiB, size - off)] = pattern[: min(MiB, size - off)]
        self.addr = self.mapping.address

    def huge_bytes(self) -> int:
        """Bytes of this buffer backed by huge pages (/proc/self/smaps, read by src/os),
        at most its size: smaps reports whole mappings, and the kernel merges this one
        with a neighbour of the same flags (another THP-advised anonymous mapping of
        the process), whose huge pages it then counts too (72 MiB for an 8 MiB buffer
        once in CI's whole suite)."""
        return min(self.mapping.huge_bytes(), len(self.map))

    def close(self) -> None:
        self.map.release()
        try:
            self.mapping.close()
        except BufferError:  # a view of it is still alive: unmapped when the last one goes
            pass


# ---- host ----------------------------------------------------------------------


def memcpy_gbps_by_threads(nbytes: int, counts: list[int], reps: int = 3) -> dict[str, float]:
    """{"threads": GB/s} of a host memcpy of nbytes split over that many threads."""
    return {str(t): _usable_gbps(nbytes, _ferry.host_memcpy_ns(nbytes, t, reps)) for t in counts}


def first_touch(nbytes: int, huge: bool, threads: int) -> tuple[float, dict]:
    """GB/s of the first touch of nbytes through a fresh pool chunk, and the pool's stats.

    The pool reserves one chunk of exactly nbytes (a multiple of 2 MiB) and touches
    it with `threads` threads (0 = one per core, at most 16): 4 KiB pages
    (MADV_NOHUGEPAGE) or THP (MADV_HUGEPAGE)."""
    pool = Pool(chunk_bytes=nbytes, huge_pages="thp" if huge else "off",
                touch_threads=threads, zero_recycled=False)
    buf = pool.alloc(nbytes, huge=huge)
    stats = pool.stats()
    buf.release()
    pool.trim()
    seconds = stats["touch_seconds"]
    if seconds <= 0:
        raise Skipped("the pool timed no first touch")
    return nbytes / seconds / 1e9, stats


# ---- GPU -----------------------------------------------------------------------


def pinned_gbps(device: int, nbytes: int, reps: int) -> dict[str, float]:
    """{"h2d", "d2h"}: GB/s of cudaMemcpyAsync between cudaHostAlloc memory and the GPU
    (the link's practical ceiling; `ferry bench copy`'s "cuda pinned")."""
    _ferry.cuda_warm_up(device)  # also makes `device` current for the allocations
    dev = _ferry.cuda_malloc(nbytes)
    try:
        host = _ferry.cuda_host_alloc(nbytes)
        try:
            return {
                "h2d": _usable_gbps(nbytes, _ferry.cuda_memcpy_async_ns(dev, host, nbytes, reps)),
                "d2h": _usable_gbps(nbytes, _ferry.cuda_memcpy_async_ns(host, dev, nbytes, reps)),
            }
        finally:
            _ferry.cuda_free_host(host)
    finally:
        _ferry.cuda_free(dev)


def aggregate_pinned_gbps(devices: list[int], nbytes: int, reps: int) -> dict[str, float]:
    """{"h2d", "d2h"}: GB/s of pinned cudaMemcpyAsync to all `devices` at once (one
    thread per GPU, each its own cudaHostAlloc buffer; total bytes over the longest
    thread's time). The timing calls release the GIL, so the threads overlap."""
    import threading

    buffers = {}
    for d in devices:
        _ferry.cuda_warm_up(d)
        buffers[d] = (_ferry.cuda_malloc(nbytes), _ferry.cuda_host_alloc(nbytes))
    try:
        out = {}
        for direction in ("h2d", "d2h"):
            times: dict[int, float] = {}
            start = threading.Barrier(len(devices))

            def run(d):
                _ferry.cuda_warm_up(d)  # this thread's current device
                dev, host = buffers[d]
                dst, src = (dev, host) if direction == "h2d" else (host, dev)
                start.wait()
                times[d] = sum(_ferry.cuda_memcpy_async_ns(dst, src, nbytes, reps))

            threads = [threading.Thread(target=run, args=(d,)) for d in devices]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if len(times) != len(devices):
                raise MeasurementError("a GPU's copy thread failed")
            out[direction] = len(devices) * nbytes * reps / (max(times.values()) / 1e9) / 1e9
        return out
    finally:
        for d, (dev, host) in buffers.items():
            _ferry.cuda_warm_up(d)
            _ferry.cuda_free_host(host)
            _ferry.cuda_free(dev)


def pageable_gbps(device: int, nbytes: int, reps: int) -> dict[str, float]:
    """{"h2d_ferry", "h2d_cuda", "d2h_ferry", "d2h_cuda"}: GB/s of ferry's automatic copy
    and of cudaMemcpy on the same fresh mmap'd buffer of 4 KiB pages (touched first)."""
    from .copy import engine

    _ferry.cuda_warm_up(device)
    eng = engine(device)
    eng.warm_up()  # staging memory and streams exist before the timing
    dev = _ferry.cuda_malloc(nbytes)
    buf = None
    try:
        buf = HostBuffer(nbytes, "4k")
        out = {}
        for d in ("h2d", "d2h"):
            dst, src = (dev, buf.addr) if d == "h2d" else (buf.addr, dev)
            out[f"{d}_ferry"] = _usable_gbps(nbytes, _ferry.copy_ns(eng, dst, src, nbytes, "auto", reps))
            out[f"{d}_cuda"] = _usable_gbps(nbytes, _ferry.cuda_memcpy_ns(dst, src, nbytes, reps))
        return out
    finally:
        if buf is not None:
            buf.close()
        _ferry.cuda_free(dev)


def pinned_alloc_seconds(device: int, nbytes: int) -> tuple[dict[str, float], dict]:
    """({"cuda", "ferry"}, pool stats): seconds until nbytes of pinned memory are usable,
    by cudaHostAlloc and by PinnedPool(target_bytes=nbytes).wait_ready()."""
    cuda_s, _ = _ferry.cuda_host_alloc_seconds(nbytes, device)  # creates the context first
    t0 = time.perf_counter()
    pool = PinnedPool(device=device, target_bytes=nbytes, zero_recycled=False)
    pool.wait_ready()
    ferry_s = time.perf_counter() - t0
    stats = pool.stats()
    pool.trim()
    return {"cuda": cuda_s, "ferry": ferry_s}, stats


def small_copy_us(device: int, iterations: int, nbytes: int = 4) -> dict[str, float]:
    """{"cuda_h2d", "cuda_d2h", "channel_h2d", "channel_d2h"}: median microseconds of an
    nbytes copy by cudaMemcpy (pageable host buffer) and by ferry's channel."""
    from .channel import Channel

    _ferry.cuda_warm_up(device)
    dev = _ferry.cuda_malloc(4 * KiB)
    host = bytearray(4 * KiB)
    addr = _ferry.buffer_address(host, True)[0]
    try:
        out = {
            "cuda_h2d": median(_ferry.cuda_memcpy_ns(dev, addr, nbytes, iterations)) / 1e3,
            "cuda_d2h": median(_ferry.cuda_memcpy_ns(addr, dev, nbytes, iterations)) / 1e3,
        }
        with Channel(device=device) as ch:
            for d, op in (("h2d", "write"), ("d2h", "read")):
                ch.time_ns(op, dev, nbytes, 50)  # warm: the kernel is running
                out[f"channel_{d}"] = median(ch.time_ns(op, dev, nbytes, iterations)) / 1e3
        return out
    finally:
        _ferry.cuda_free(dev)


_REGISTER_KINDS = {  # kind: (pool options, the chunk backing that proves it was used)
    "4k": (dict(huge_pages="off", target_huge=False), "small_pages"),
    "thp": (dict(huge_pages="thp"), "thp"),
    "hugetlb": (dict(huge_pages="hugetlb"), "hugetlb_2m"),
}


def hugetlb_free_bytes(host: dict) -> int:
    """Bytes of free 2 MiB hugetlb pages, from the host facts (0 when unknown)."""
    for entry in host.get("hugetlb") or []:
        if entry.get("page_size_bytes") == HUGE_PAGE:
            return (entry.get("free") or 0) * HUGE_PAGE
    return 0


def register_gbps(device: int, nbytes: int, kind: str) -> float:
    """GB/s of cudaHostRegister of a PinnedPool's target of nbytes backed by `kind`
    ("4k", "thp" or "hugetlb" 2 MiB pages; the target is one chunk)."""
    options, proof = _REGISTER_KINDS[kind]
    # register_lead_bytes=nbytes: registered after the whole touch, so the
    # time is the registration's alone (by default it overlaps the touch).
    pool = PinnedPool(device=device, target_bytes=nbytes, chunk_bytes=min(nbytes, 512 * MiB),
                      zero_recycled=False, register_lead_bytes=nbytes, **options)
    try:
        pool.wait_ready()
        stats = pool.stats()
    finally:
        pool.trim()
    used = {k: v for k, v in stats["chunks"].items() if v}
    if set(used) != {proof}:
        notes = "; ".join(stats["notes"]) or "no note"
        raise Skipped(f"asked for {kind} chunks, got {used} ({notes})")
    registered = stats["huge"]["reserved"]["peak"] + stats["small"]["reserved"]["peak"]
    if stats["register_seconds"] <= 0:
        raise Skipped("the pool timed no registration")
    return registered / stats["register_seconds"] / 1e9
