"""The rank processes of `ferry bench node`: each is spawned, uses GPU rank % count,
and answers the parent's commands on a pipe; commands that must run on every
rank at once meet at a barrier first (one for all ranks, one for ranks 0 and 1).

Replies are ("ok", value) or ("error", "Type: message")."""

from __future__ import annotations

import time

REGION = "bench-region"  # the named block every rank attaches and registers
POISON = 0xA5


def _shmem_kib() -> int:
    """RssShmem of this process (KiB): the memfd pages it maps and touched."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    return 0


def pattern(seed: int, nbytes: int):
    """nbytes of seeded bytes (numpy uint8)."""
    import numpy as np

    words = np.random.default_rng(seed).integers(0, 1 << 63, size=(nbytes + 7) // 8, dtype=np.uint64)
    return words.view(np.uint8)[:nbytes]


def places(seed: int, lengths):
    """int64 offsets of blocks of these lengths laid one after another in a
    seeded-shuffled order (scattered blocks of a KV cache)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(lengths))
    offsets = np.empty(len(lengths), np.int64)
    offsets[order] = np.cumsum(lengths[order]) - lengths[order]
    return offsets


def mixed_sizes(seed: int, count: int, lo: int = 64 << 10, hi: int = 2 << 20) -> list[int]:
    """`count` block sizes from lo to hi, log-uniform, whole 4 KiB pages (a KV cache's
    blocks of mixed sizes), seeded."""
    import numpy as np

    exps = np.random.default_rng(seed).uniform(np.log2(lo), np.log2(hi), count)
    return [min(hi, max(lo, int(2 ** e) // 4096 * 4096)) for e in exps]


class Rank:
    def __init__(self, rank: int, ranks: int, everyone, pair, timeout: float):
        from .. import _ferry

        self.rank, self.ranks, self.everyone, self.pair, self.timeout = rank, ranks, everyone, pair, timeout
        self.device = rank % max(1, _ferry.device_count())
        _ferry.cuda_warm_up(self.device)  # the context made before timing (it leaves the current device as it was)
        self.pool = self.region = self.pinned = self.pinned_buf = None
        self.gpu = {}  # nbytes -> device address (one buffer per size, reused)

    def gpu_buffer(self, nbytes: int) -> int:
        from .. import _ferry

        if nbytes not in self.gpu:
            self.gpu[nbytes] = _ferry.cuda_malloc(nbytes, self.device)
        return self.gpu[nbytes]

    def attach(self, name: str, capacity: int, nbytes: int) -> dict:
        """Attach (or create) the node pool and register the whole region for this GPU."""
        from ..node import NodePool

        self.everyone.wait(self.timeout)
        t0 = time.perf_counter()
        self.pool = NodePool(name, capacity, device=self.device, label=f"rank {self.rank}", timeout=self.timeout)
        self.region = self.pool.named(REGION, nbytes)
        self.pool.wait_ready(self.region)
        seconds = time.perf_counter() - t0
        self.everyone.wait(self.timeout)  # all hold it before the parent reads /proc/meminfo
        return {"seconds": seconds, "rss_shmem_bytes": _shmem_kib() << 10, "created": self.region.created,
                "stats": self.pool.stats()}

    def own_pinned(self, nbytes: int) -> dict:
        """Today's ferry: this rank's own PinnedPool of nbytes, pinned, one allocation."""
        import ferry

        self.everyone.wait(self.timeout)
        t0 = time.perf_counter()
        self.pinned = ferry.PinnedPool(device=self.device, target_bytes=nbytes)
        self.pinned.wait_ready()
        self.pinned_buf = self.pinned.alloc(nbytes)
        seconds = time.perf_counter() - t0
        self.everyone.wait(self.timeout)
        return {"seconds": seconds}

    def dma(self, where: str, direction: str, nbytes: int, iters: int) -> list[float]:
        """Seconds of each copy of nbytes between this rank's GPU and its part of the
        shared region (where="node") or its own pinned buffer, every rank at once."""
        import ferry

        host = self.region.address + self.rank * nbytes if where == "node" else self.pinned_buf.ptr
        dev = self.gpu_buffer(nbytes)
        dst, src = (dev, host) if direction == "h2d" else (host, dev)
        ferry.copy(dst, src, nbytes, device=self.device)  # warm
        self.everyone.wait(self.timeout)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            ferry.copy(dst, src, nbytes, device=self.device)
            times.append(time.perf_counter() - t0)
        return times

    def handoff(self, role: str, key: str, sizes: list[int], slots: int, slot_bytes: int, iters: int,
                seed: int, route: str, peer_sms: int | None = None) -> dict:
        """Rank 0 (producer) sends blocks of `sizes` at seeded-shuffled places of its GPU
        through a Handoff (route "pool" or "auto"); rank 1 (consumer) receives them into
        other shuffled places of its GPU, poisoned first, and times each transfer (barrier
        to recv's return), then checks every block. The consumer also says which route
        the slots took (Handoff.last_route)."""
        import numpy as np

        import ferry
        from ..node import Handoff

        lengths = np.array(sizes, np.int64)
        n = int(lengths.sum())
        base = self.gpu_buffer(n)
        src_off, dst_off = places(seed + 1, lengths), places(seed + 2, lengths)
        if role == "producer":
            ferry.copy(base, pattern(seed, n), n, device=self.device)
            addrs = base + src_off
        else:
            ferry.copy(base, np.full(n, POISON, np.uint8), n, device=self.device)
            addrs = base + dst_off
        h = Handoff(self.pool, key, slots, slot_bytes, timeout=self.timeout, route=route, peer_sms=peer_sms)
        times = []
        try:
            for i in range(iters + 1):  # the first is not timed (it also maps the consumer's ring)
                self.pair.wait(self.timeout)
                t0 = time.perf_counter()
                if role == "producer":
                    h.send(addrs, lengths)
                else:
                    h.recv(addrs, lengths)
                times.append(time.perf_counter() - t0)
            if role == "producer":
                h.drain()
                return {"seconds": times[1:], "route": h.last_route, "stats": h.stats()}
            got = np.empty(n, np.uint8)
            ferry.copy(got, base, n, device=self.device)
            expected = pattern(seed, n)
            bad = next((k for k in range(len(sizes)) if not np.array_equal(
                got[dst_off[k]:dst_off[k] + sizes[k]], expected[src_off[k]:src_off[k] + sizes[k]])), None)
            return {"seconds": times[1:], "verified": bad is None, "route": h.last_route, "stats": h.stats(),
                    "problem": None if bad is None else f"block {bad} ({sizes[bad]} bytes) differs"}
        finally:
            h.close()

    def host_path(self, sizes: list[int], iters: int, seed: int) -> list[float] | None:
        """What a rank does without the handoff, in one process: the same blocks GPU 0 ->
        pinned host (this rank's part of the node pool region, ferry.copy_many) -> GPU 1
        (ferry.copy_many), seconds each (None: one GPU)."""
        import numpy as np

        import ferry
        from .. import _ferry

        if _ferry.device_count() < 2:
            return None
        lengths = np.array(sizes, np.int64)
        n = int(lengths.sum())
        if n > self.region.nbytes:
            return None
        src = self.gpu_buffer(n) + places(seed + 1, lengths)
        dev1 = _ferry.cuda_malloc(n, 1)
        try:
            dst = dev1 + places(seed + 2, lengths)
            host = self.region.address + (np.cumsum(lengths) - lengths)
            times = []
            for _ in range(iters + 1):
                t0 = time.perf_counter()
                ferry.copy_many(host, src, lengths, device=self.device)
                ferry.copy_many(dst, host, lengths, device=1)
                times.append(time.perf_counter() - t0)
            return times[1:]
        finally:
            _ferry.cuda_free(dev1)

    def peer_copy(self, total: int, iters: int) -> list[float] | None:
        """torch: a GPU 0 tensor .to(GPU 1), one contiguous copy, seconds each (None: one GPU)."""
        import torch

        if torch.cuda.device_count() < 2:
            return None
        a = torch.empty(total, dtype=torch.uint8, device="cuda:0")
        a.to("cuda:1")
        torch.cuda.synchronize(1)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            a.to("cuda:1")
            torch.cuda.synchronize(1)
            times.append(time.perf_counter() - t0)
        return times

    def pin_all(self) -> dict:
        """Pins the whole pool for this rank's GPU (all ranks at once); the seconds it took."""
        self.everyone.wait(self.timeout)
        t0 = time.perf_counter()
        self.pool.pin_all()
        self.pool.wait_ready()
        return {"seconds": time.perf_counter() - t0}

    def load(self, path: str, node: bool, together: bool = True, route: str = "auto") -> dict:
        """load_safetensors to this rank's GPU, with node= (the shared pool; route: auto, or
        pool / alone forced) or alone; every rank at once (together: they start at a barrier)
        or this one only. With node=, the routes the files took ({route: files})."""
        import torch

        from ..torch import load_safetensors, node_plan

        kwargs = {"node": self.pool, "rank": self.rank, "ranks": self.ranks, "timeout": self.timeout} if node else {}
        node_plan.FORCE = route
        if together:
            self.everyone.wait(self.timeout)
        t0 = time.perf_counter()
        tensors = load_safetensors(path, device=f"cuda:{self.device}", **kwargs)
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        routes = {}
        for r, _ in getattr(tensors, "routes", {}).values():
            routes[r] = routes.get(r, 0) + 1
        del tensors
        return {"seconds": seconds, "bytes": nbytes, "routes": routes}

    def close(self) -> None:
        from .. import _ferry

        for p in self.gpu.values():
            _ferry.cuda_free(p)
        self.gpu = {}
        if self.pinned_buf is not None:
            self.pinned_buf.release()


def serve(conn, rank: int, ranks: int, everyone, pair, timeout: float) -> None:
    """A rank's loop: commands (name, *args) on conn until ("quit",)."""
    me = None
    try:
        me = Rank(rank, ranks, everyone, pair, timeout)
        conn.send(("ok", {"device": me.device}))
        while True:
            cmd, *args = conn.recv()
            if cmd == "quit":
                break
            try:
                conn.send(("ok", getattr(me, cmd)(*args)))
            except Exception as e:  # the parent reports it
                conn.send(("error", f"{type(e).__name__}: {e}"))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        if me is not None:
            try:
                me.close()
            except Exception:
                pass
