"""Memory registered with a NIXL agent: one object (register) or a ferry pool
chunk by chunk, kept in step with the pool (register_pool)."""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgumentError
from .descriptors import Descs, _agent, descs, reg_descs
from .library import _nixl_call


class Registration:
    """Memory registered with a NIXL agent until close() (or the end of a with
    block). Holds what it describes alive."""

    def __init__(self, agent, d: Descs, backends: Sequence[str] = ()):
        _agent(agent, "Registration")
        self.agent = agent
        self.descs = d
        self._backends = list(backends)
        self._reg = _nixl_call(f"register_memory of {len(d)} {d.mem_type} region(s), {d.nbytes} bytes",
                               agent.register_memory, reg_descs(agent, d), d.mem_type, self._backends)

    def close(self) -> None:
        if self._reg is not None:
            reg, self._reg = self._reg, None
            _nixl_call("deregister_memory", self.agent.deregister_memory, reg, self._backends)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register(agent, obj, nbytes: int | None = None, *, mem_type: str | None = None,
             device: int | None = None, backends: Sequence[str] = ()) -> Registration:
    """Register memory with `agent`: a Descs, or anything descs() takes (a GPU
    tensor becomes VRAM on its device)."""
    _agent(agent, "register")
    d = obj if isinstance(obj, Descs) else descs(obj, nbytes, mem_type=mem_type, device=device)
    return Registration(agent, d, backends)


class Changes:
    """What a PoolRegistration.sync() did: chunks registered (added) and
    deregistered (removed), as (base, nbytes). Truthy when anything changed
    (then peers need this agent's metadata again)."""

    __slots__ = ("added", "removed")

    def __init__(self, added=(), removed=()):
        self.added = list(added)
        self.removed = list(removed)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def __repr__(self) -> str:
        return f"Changes(added={len(self.added)}, removed={len(self.removed)})"


class PoolRegistration:
    """A ferry Pool's (or PinnedPool's) chunks registered with a NIXL agent as
    DRAM, one region per chunk (no allocation spans two). sync() follows the
    pool; close() deregisters everything. Not thread-safe: sync from one
    thread (or hold a lock of your own around it)."""

    mem_type = "DRAM"

    def __init__(self, agent, pool, backends: Sequence[str] = ()):
        _agent(agent, "PoolRegistration")
        chunks = getattr(pool, "chunks", None)
        if not callable(chunks) or not hasattr(pool, "chunk_generation"):
            raise InvalidArgumentError(f"register_pool needs a ferry.Pool or ferry.PinnedPool, "
                                       f"not {type(pool).__name__}")
        self.agent = agent
        self.pool = pool
        self._backends = list(backends)
        self._regs: dict[tuple[int, int], tuple[int, object]] = {}  # (base, generation) -> (nbytes, reg list)
        self._seen = None  # pool.chunk_generation at the last sync
        self._closed = False
        self.sync()

    def sync(self) -> Changes:
        """Register the pool's new chunks and deregister those it released (or
        partly returned to the OS: those are registered again). Cheap when the
        pool did not change (one lock-free read)."""
        if self._closed:
            raise InvalidArgumentError("this PoolRegistration was closed")
        generation = self.pool.chunk_generation  # before the snapshot: a later change shows next time
        if generation == self._seen:
            return Changes()
        now = {(base, gen): nbytes for base, nbytes, gen in self.pool.chunks()}
        removed = [key for key in self._regs if key not in now]
        changes = Changes()
        for key in removed:
            nbytes, reg = self._regs.pop(key)
            _nixl_call(f"deregister_memory of a pool chunk at {key[0]:#x}", self.agent.deregister_memory, reg,
                       self._backends)
            changes.removed.append((key[0], nbytes))
        for key, nbytes in sorted(now.items()):
            if key in self._regs:
                continue
            d = Descs("DRAM", [(key[0], nbytes, 0)])
            reg = _nixl_call(f"register_memory of a {nbytes}-byte pool chunk at {key[0]:#x}",
                             self.agent.register_memory, reg_descs(self.agent, d), "DRAM", self._backends)
            self._regs[key] = (nbytes, reg)
            changes.added.append((key[0], nbytes))
        self._seen = generation
        return changes

    @property
    def regions(self) -> list[tuple[int, int]]:
        """(base, nbytes) of the registered chunks, by address."""
        return sorted((base, nbytes) for (base, _), (nbytes, _) in self._regs.items())

    def check(self, d: Descs) -> None:
        """Raise InvalidArgumentError unless every row of `d` lies inside one
        registered chunk (after a sync())."""
        self.sync()
        regions = self.regions
        for i, (address, nbytes, _) in enumerate(d.rows):
            if not any(base <= address and address + nbytes <= base + size for base, size in regions):
                raise InvalidArgumentError(f"descriptor {i} ({address:#x}, {nbytes} bytes) is not inside one "
                                           f"chunk of the registered pool ({len(regions)} chunk(s))")

    def close(self) -> None:
        """Deregister every chunk (idempotent)."""
        if self._closed:
            return
        self._closed = True
        regs, self._regs = self._regs, {}
        for nbytes, reg in regs.values():
            _nixl_call("deregister_memory", self.agent.deregister_memory, reg, self._backends)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register_pool(agent, pool, *, backends: Sequence[str] = ()) -> PoolRegistration:
    """Register `pool`'s chunks with `agent` as DRAM (see PoolRegistration)."""
    _agent(agent, "register_pool")
    return PoolRegistration(agent, pool, backends)
