"""`ferry bench load`'s measurements beside the loads: peak anonymous memory,
the page cache dropped, the file's read rates, and the bit-for-bit check."""

from __future__ import annotations

import os
import threading
import time

from .. import _ferry
from ..units import MiB

DROP_CACHES = "/proc/sys/vm/drop_caches"


# ---- measuring -------------------------------------------------------------------

def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """Peak RssAnon growth over a block, sampled every 5 ms by a thread."""

    def __enter__(self):
        self.base = self.peak = rss_anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_anon_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_bytes())
        self.added = self.peak - self.base
        return False


def drop_page_cache() -> str | None:
    """None when the page cache was dropped, else why not."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"cannot write {DROP_CACHES} ({e.strerror}; needs root)"


def sequential_read_rate(paths: list[str]) -> float:
    """GB/s of one thread reading the files in 16 MiB blocks (dd bs=16M), each block
    one read by src/os (``_ferry.File.read_range`` with one thread)."""
    buf = _ferry.Mapping.anonymous(16 * MiB)
    total, t0 = 0, time.perf_counter()
    try:
        for p in paths:
            with _ferry.File(p) as f:
                at = 0
                while n := f.read_range(at, buf.address, 16 * MiB, 1, allow_short=True):
                    at += n
                total += at
    finally:
        buf.close()
    return total / (time.perf_counter() - t0) / 1e9


def parallel_direct_read_rate(paths: list[str], threads: int = 16) -> float:
    """GB/s of `threads` threads reading 16 MiB O_DIRECT blocks (the disk's
    parallel rate; the page cache is bypassed). Each read is src/os's
    (``_ferry.File(direct=True).read_range``, the GIL released)."""
    jobs = []
    for p in paths:
        size = os.path.getsize(p)
        jobs += [(p, off) for off in range(0, size, 16 * MiB)]
    lock, total = threading.Lock(), [0]

    def work(k):
        buf = _ferry.Mapping.anonymous(16 * MiB)  # 2 MiB aligned, as O_DIRECT needs
        files = {}
        try:
            for p, off in jobs[k::threads]:
                if p not in files:
                    files[p] = _ferry.File(p, direct=True)
                n = files[p].read_range(off, buf.address, 16 * MiB, 1, allow_short=True)
                with lock:
                    total[0] += n
        finally:
            for f in files.values():
                f.close()
            buf.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0] / (time.perf_counter() - t0) / 1e9


def same_bits(torch, got: dict, ref: dict) -> str | None:
    """None when `got` holds exactly ref's tensors, bit for bit (ref on the GPU)."""
    if set(got) != set(ref):
        missing, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
        return f"keys differ: missing {missing[:3]}, extra {extra[:3]}"
    for k, r in ref.items():
        g = got[k]
        if not g.is_cuda:
            return f"{k}: on {g.device}"
        why = tensor_differs(torch, k, g, r)
        if why:
            return why
    return None


def tensor_differs(torch, key: str, got, ref) -> str | None:
    """None when got is ref bit for bit (dtype, shape, bytes; ref moved to got's
    device first), else what differs."""
    if got.dtype != ref.dtype or tuple(got.shape) != tuple(ref.shape):
        return f"{key}: {got.dtype}{tuple(got.shape)} instead of {ref.dtype}{tuple(ref.shape)}"
    a = got.contiguous().reshape(-1).view(torch.uint8)
    if not torch.equal(a, ref.contiguous().reshape(-1).view(torch.uint8).to(a.device)):
        return f"{key}: bytes differ"
    return None
