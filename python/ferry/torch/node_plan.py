"""Which way a node load takes each file: through the node pool, or each rank alone.

``load_safetensors(..., node=pool)`` reads a file once per node into the pool
and every rank copies its tensors from there. That pays where reading the file
is the bottleneck: a cold file is read from disk once, not once per rank
(0.55x the time of each rank alone, two ranks, issue 39). Where the file is
already in the page cache (every restart of a job), each rank's own loader
reads it at the link's speed, and the detour through the pool made the same
load 3.5-12x slower. So the pool is the fast path or it steps aside, per file:

- "alone": at least ``ALONE_SHARE`` of the file is in the page cache (the
  loader's probe: 64 one-byte ``RWF_NOWAIT`` reads spread over it), or the
  load has one rank (nothing to share). Each rank loads what it selected of
  the file through its own loader, as without ``node=``.
- "pool": otherwise, and where the file system cannot tell what is cached.

The call is collective, so every rank must take the same route for a file:
the first rank to arrive probes and decides for all. The plan lives in a
small named block of the pool (key: the files' identities and this process's
count of node loads of them, as the file blocks are keyed), not pinned:

    word 1            ranks taking part; written by the maker after the routes
    word 2            ranks that have read the plan (each adds 1)
    word 16 + f       file f's route: 1 pool, 2 alone (f < MAX_FILES)

Each rank holds the block until the end of its load and lets go only once
every rank has read the plan, so a late rank never finds it gone, makes a new
one and decides again (by then the files are cached: a different answer).

``FERRY_NODE_LOAD=pool|alone`` forces a route (``auto``, the default, chooses);
``ferry bench node`` measures the chosen route beside the pool forced and each
rank alone (through ``FORCE``).
"""

from __future__ import annotations

import os
import time

from .. import _ferry
from ..errors import InvalidArgumentError
from ..node import NodeBlock
from . import node_load

ALONE_SHARE = 0.9  # at least this share of a file cached: each rank reads it alone
MAX_FILES = 4096  # routes per plan block; a load of more files decides once for all
POOL, ALONE = 1, 2
_W_RANKS, _W_SEEN, _W_ROUTE = 1, 2, 16


FORCE: str | None = None  # "pool" or "alone" overrides FERRY_NODE_LOAD in this process (`ferry bench node`)


def forced_route() -> str:
    """FORCE if set, else FERRY_NODE_LOAD: auto (default), pool or alone (read once
    per process, as every FERRY_* option; a bad value is an InvalidArgumentError
    naming it)."""
    if FORCE is not None:
        if FORCE not in ("auto", "pool", "alone"):
            raise InvalidArgumentError(f"node_plan.FORCE={FORCE!r}: expected auto, pool or alone")
        return FORCE
    return _ferry.option_text("FERRY_NODE_LOAD")


def choose(paths: list[str], ranks: int, forced: str = "auto") -> list[tuple[str, str]]:
    """(route, why) per file: what the rank that makes the plan decides."""
    if forced != "auto":
        return [(forced, "FERRY_NODE_LOAD=" + forced)] * len(paths)
    if ranks == 1:
        return [("alone", "one rank: nothing to share")] * len(paths)
    routes = []
    for share in _ferry.page_cache_shares(paths):
        if share < 0:
            routes.append(("pool", "the file system cannot tell what is in the page cache"))
        elif share >= ALONE_SHARE:
            routes.append(("alone", f"{share:.0%} in the page cache: each rank reads it at the link's speed"))
        else:
            routes.append(("pool", f"{share:.0%} in the page cache: read once for the node"))
    return routes


class Plan:
    """The routes of one node load, agreed by every rank. ``routes[f]`` is
    (route, why) for file f; ``close()`` lets go of the plan once every rank
    has read it (bounded by the load's timeout)."""

    def __init__(self, pool, paths: list[str], rank: int, ranks: int, timeout: float):
        self.pool, self.ranks, self.timeout = pool, ranks, timeout
        self.path = paths[0] if len(paths) == 1 else f"{len(paths)} files"
        identities = [_ferry.path_identity(p)[:4] for p in paths]  # device, inode, size, mtime_ns (stat)
        key = node_load.round_key(pool.name, "plan", ("plan", tuple(identities)))
        words = _W_ROUTE + min(len(paths), MAX_FILES)
        native = pool._live("load_safetensors(node=)")
        offset, nbytes, created = native.allocate_named(key, 4 * words)
        # Not pool.named(): the plan's words are never DMA'd, so its block is not pinned.
        self.block = NodeBlock(pool, offset, nbytes, created, key)
        try:
            self.routes = self._agree(paths, rank, created)
        except BaseException:
            pool.free(self.block)
            raise

    def _agree(self, paths, rank, created) -> list[tuple[str, str]]:
        pool, block, n = self.pool, self.block, min(len(paths), MAX_FILES)
        if created:
            routes = choose(paths, self.ranks, forced_route())
            if len(paths) > MAX_FILES:  # one decision for all: the pool unless every file is cached
                everyone = all(r == "alone" for r, _ in routes)
                routes = [routes[0] if everyone else ("pool", "more than 4096 files: decided once")] * len(paths)
            for f in range(n):
                pool.add(block, _W_ROUTE + f, ALONE if routes[f][0] == "alone" else POOL)
            pool.add(block, _W_RANKS, self.ranks)
        else:
            if not pool.wait(block, _W_RANKS, 1, self.timeout):
                raise node_load.NodeLoadTimeoutError(
                    f"{self.path}: the rank that plans this node load did not decide within {self.timeout:g} s "
                    "(it died, or was stopped); every rank of the node must call the load with the same files")
            if pool.value(block, _W_RANKS) != self.ranks:
                raise InvalidArgumentError(
                    f"{self.path}: this rank loads with ranks={self.ranks}, the rank that planned the node load "
                    f"with ranks={pool.value(block, _W_RANKS)}; every rank must pass the same ranks")
            words = [pool.value(block, _W_ROUTE + f) for f in range(n)]
            if len(paths) > MAX_FILES:
                words += [words[0]] * (len(paths) - n)
            routes = [("alone" if w == ALONE else "pool", "as the planning rank decided") for w in words]
        pool.add(block, _W_SEEN)
        return routes

    def close(self) -> None:
        """Lets go of the plan once every rank has read it (at most the load's
        timeout: a rank that never came cannot be waited for longer)."""
        block, self.block = self.block, None
        if block is None:
            return
        try:
            self.pool.wait(block, _W_SEEN, self.ranks, self.timeout)
        finally:
            self.pool.free(block)


def plan(pool, paths, rank: int, ranks: int, timeout: float) -> Plan:
    t0 = time.monotonic()
    p = Plan(pool, [os.fsdecode(os.fspath(x)) for x in paths], rank, ranks, timeout)
    p.seconds = time.monotonic() - t0
    return p
