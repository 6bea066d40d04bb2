"""One pool of host memory per node, shared by every process (rank) that opens it.

``NodePool(name, capacity)`` creates the pool, or attaches to it when a live
process of the node already holds it (then ``capacity`` may be 0). All ranks see
the same bytes (one memfd, mapped by each; the pages exist once), and every
allocation, in any process, counts against the one ``capacity``: the error of an
allocation that does not fit says who holds what.

Blocks:

- ``pool.alloc(n)``: a block owned by this process, freed by ``free()``, or when
  this process closes the pool, exits or dies. Its ``handle`` (an int) opens it
  in another process: ``pool.block(handle)``; ``pool.take(block)`` makes the
  caller its owner (a consumer keeping what a producer made).
- ``pool.named(key, n)``: finds the block called ``key`` or makes it; every
  process that asked holds it, and it is freed when the last one lets go
  (``free()``, close, exit or death).
- Signal words: ``add(block, i)`` and ``wait(block, i, value)`` on the i-th 32-bit
  word of a block, across processes (a futex): completions, barriers.

Pinning: with ``device=`` (a GPU index), the pieces of the pool this process
touches (alloc, named, block) are registered with that GPU in the background;
``ready(block)`` says whether a block is, ``wait_ready(block)`` waits. Copies from
and to a block (``ferry.copy(..., block.address, ...)``) run at pinned speed once
it is ready; each process pins only what it touches.

How processes find each other: each member listens on a Unix socket in a directory
only this user may enter (FERRY_NODE_DIR, else /tmp/ferry-<euid>, mode 0700) and
passes the memfd (SCM_RIGHTS) to peers of its own uid; the attacher checks the
member's uid and the memfd's owner, so no other user can serve, block or stall an
open (docs/node.md).
The pool lives while any member does. A forked child of a member does not see
the pool: every use there of a NodePool, NodeBlock or Handoff made before the fork
raises NotSupportedError (the child opens the pool again by name if it needs it).
See docs/node.md.

Timeouts (``wait``, ``timeout=``): seconds, int or float; None or math.inf: no
limit; negative or NaN: InvalidArgumentError.

Handoff (node_handoff.py): ``Handoff(pool, key, slots, slot_bytes)`` hands batches
of blocks from one process's GPU to another's through a ring of slots in the
pool (``send``/``recv``, one copy_many per slot, completions in signal words).
"""

from __future__ import annotations

import math
import os
import threading
import time

from . import _args, _ferry
from .errors import InvalidArgumentError, NotSupportedError
from .node_handoff import Handoff, HandoffError, HandoffPeerGoneError, HandoffTimeoutError, memmove_many

__all__ = ["NodePool", "NodeBlock", "Handoff", "HandoffError", "HandoffPeerGoneError", "HandoffTimeoutError",
           "memmove_many", "DEFAULT_GRANULE"]

DEFAULT_GRANULE = 64 << 10
# NodePool.wait hands the native wait at most this many seconds at a time: a longer or
# unlimited wait is a loop of them, so Ctrl-C (a Python signal handler) is seen
# within a second while the GIL is released.
_WAIT_SLICE_S = 1.0

# Which process this is, as fork() counts: 0 in the process that imported ferry,
# one more in each forked child (os.register_at_fork). A pool remembers the count it
# was opened at; in a forked child its memory is not mapped (a touch is SIGSEGV), so
# every use checks first.
_fork_generation = 0


def _forked() -> None:
    global _fork_generation
    _fork_generation += 1


# Not a ferry._per_device cache: nothing is forgotten, each open pool checks this count on use.
os.register_at_fork(after_in_child=_forked)


class NodeBlock:
    """A block of a NodePool: ``handle`` (send it to other processes), ``nbytes``
    (whole granules), ``address`` (in this process), ``created`` (for named
    blocks: whether this call made it)."""

    __slots__ = ("pool", "handle", "nbytes", "created", "key")

    def __init__(self, pool: "NodePool", handle: int, nbytes: int, created: bool = False, key: str | None = None):
        self.pool = pool
        self.handle = handle
        self.nbytes = nbytes
        self.created = created
        self.key = key

    @property
    def address(self) -> int:
        return self.pool.address + self.handle

    def view(self) -> memoryview:
        """The block's bytes as a writable memoryview, valid while the block is. The view
        keeps this process's mapping of the pool alive (a close() meanwhile unmaps nothing)."""
        native = self.pool._live("NodeBlock.view")
        # The span holds `native`: the mapping lives as long as the view's buffer.
        return memoryview(_ferry.MemorySpan(native.address + self.handle, self.nbytes, native))

    def __repr__(self) -> str:
        name = f" {self.key!r}" if self.key else ""
        return f"<NodeBlock{name} handle={self.handle} nbytes={self.nbytes} of {self.pool._name!r}>"


def _handle(value, what: str) -> int:
    if isinstance(value, NodeBlock):
        return value.handle
    return _args.integer(value, what, 0, _args.MAX_U64, "a NodeBlock or its handle (an int >= 0)")


class NodePool:
    """A node-wide pool (see the module docstring).

    name: 1-64 characters of letters, digits, '.', '_', '-'; one NodePool object
    per name per process. capacity: the node-wide budget in bytes, given by the
    process that creates it (0: attach only; a non-zero one must agree).
    device: the GPU this process copies with (None: no pinning). granule: the
    allocation unit (creator only). label: this process in messages (default
    "pid N"; e.g. "rank 3"). timeout: seconds to wait for a concurrent creator
    (None or math.inf: no limit).
    huge_pages (creator only; None: FERRY_HUGE_PAGES, "auto" by default): "auto"
    takes 2 MiB hugetlb pages when enough are reserved and free for the whole
    pool, else shmem (THP where shmem_enabled allows it); "hugetlb" insists;
    "thp" and "off" never use hugetlb. ``stats()["page_bytes"]`` says which came.
    Huge pages fault and pin far faster: docs/node.md has the figures.
    """

    def __init__(self, name: str, capacity: int = 0, *, device: int | None = None, granule: int = DEFAULT_GRANULE,
                 label: str | None = None, timeout: float | None = 10.0, huge_pages: str | None = None):
        if not isinstance(name, str):
            raise InvalidArgumentError(f"name={_args.quote(name)}: expected a str")
        capacity = _args.size(capacity, "capacity")
        granule = _args.size(granule, "granule")
        if label is not None and not isinstance(label, str):
            raise InvalidArgumentError(f"label={_args.quote(label)}: expected a str or None")
        if device is not None:
            device = _args.integer(device, "device", 0, 1 << 30)
        if huge_pages is not None and huge_pages not in ("auto", "hugetlb", "thp", "off"):
            raise InvalidArgumentError(f"huge_pages={_args.quote(huge_pages)}: expected 'auto', 'hugetlb', "
                                       "'thp', 'off' or None (FERRY_HUGE_PAGES)")
        wait_s = _args.timeout(timeout, "timeout")
        wait_s = math.inf if wait_s is None else wait_s  # node_pool.h's kForever: no limit
        self._name, self._pid, self._generation = name, os.getpid(), _fork_generation
        self._native = _ferry.NodePool.open(name, capacity, granule, label or "", wait_s, huge_pages or "")
        self.device = device
        self._registration = _ferry.NodeRegistration(self._native, device) if device is not None else None
        self._lock = threading.Lock()

    def _live(self, what: str = "this"):
        """The native pool; NotSupportedError in a forked child, InvalidArgumentError once closed.
        Every use of the pool, its blocks and its handoffs goes through here first."""
        if self._generation != _fork_generation:
            raise NotSupportedError(
                f"{what}: NodePool {self._name!r} was opened in process {self._pid}, and this is a forked "
                f"child of it (process {os.getpid()}): the pool's memory is not mapped in a child, so its "
                f"NodePool, blocks and Handoffs cannot be used here. Open the pool again in the child, "
                f"NodePool({self._name!r}) (it attaches while another process holds the pool), and its "
                f"blocks through that object (pool.block(handle), pool.named(key, n), Handoff(pool, ...))")
        if self._native is None:
            raise InvalidArgumentError("this NodePool was closed: open it again with NodePool(name)")
        return self._native

    # --- what it is -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._live("NodePool.name").name

    @property
    def capacity(self) -> int:
        return self._live("NodePool.capacity").capacity

    @property
    def granule(self) -> int:
        return self._live("NodePool.granule").granule

    @property
    def address(self) -> int:
        """Where the pool's data starts in this process (block addresses are this + handle)."""
        return self._live("NodePool.address").address

    def stats(self) -> dict:
        """capacity, used, free, largest_free, granule, page_bytes (2 MiB: hugetlb; 4 KiB: shmem),
        repairs, created_here, members (pid, label, bytes, blocks, named, this_process; dead
        members are reclaimed first), registered_bytes and piece_bytes (this process's pins)."""
        s = self._live("NodePool.stats").stats()
        s["registered_bytes"] = self._registration.registered_bytes() if self._registration else 0
        s["piece_bytes"] = self._registration.piece_bytes if self._registration else 0
        return s

    def holders(self) -> str:
        """Who holds what, as one line (what an allocation error says)."""
        return self._live("NodePool.holders").describe_holders()

    def reclaim_dead(self) -> int:
        """Free the blocks of members that died; the bytes freed."""
        return self._live("NodePool.reclaim_dead").reclaim_dead()

    # --- blocks -----------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> NodeBlock:
        """A block of at least nbytes, owned by this process."""
        offset, n = self._live("NodePool.alloc").allocate(_args.size(nbytes))
        return self._touched(NodeBlock(self, offset, n))

    def named(self, key: str, nbytes: int) -> NodeBlock:
        """The block called key (made here if no process holds it; sizes must agree)."""
        if not isinstance(key, str):
            raise InvalidArgumentError(f"key={_args.quote(key)}: expected a str")
        offset, n, created = self._live("NodePool.named").allocate_named(key, _args.size(nbytes))
        return self._touched(NodeBlock(self, offset, n, created, key))

    def block(self, handle) -> NodeBlock:
        """The live block with this handle (from alloc() or named() in any process)."""
        offset = _handle(handle, "handle")
        return self._touched(NodeBlock(self, offset, self._live("NodePool.block").find(offset)))

    def free(self, block) -> None:
        """Frees an unnamed block (any member may), or lets go of a named one."""
        self._live("NodePool.free").release(_handle(block, "block"))

    def take(self, block) -> None:
        """This process becomes the owner of an unnamed block."""
        self._live("NodePool.take").take(_handle(block, "block"))

    # --- signal words -----------------------------------------------------------------------
    def _word(self, block, index) -> int:
        if not isinstance(block, NodeBlock):
            raise InvalidArgumentError(f"block={_args.quote(block)}: expected a NodeBlock")
        i = _args.integer(index, "index", 0, block.nbytes // 4 - 1)
        return block.handle + 4 * i

    def add(self, block: NodeBlock, index: int = 0, n: int = 1) -> int:
        """Adds n to the block's index-th 32-bit word (atomic, any process); returns the value before."""
        native = self._live("NodePool.add")
        return native.add(self._word(block, index), _args.u32(n, "n"))

    def value(self, block: NodeBlock, index: int = 0) -> int:
        native = self._live("NodePool.value")
        return native.load(self._word(block, index))

    def wait(self, block: NodeBlock, index: int = 0, value: int = 1, timeout: float | None = None) -> bool:
        """Waits until the word is >= value (counters that only grow); False after timeout
        seconds (None or math.inf: no limit; 0: looks once)."""
        native = self._live("NodePool.wait")
        word, value, limit = self._word(block, index), _args.u32(value, "value"), _args.timeout(timeout)
        if limit is not None and limit <= _WAIT_SLICE_S:
            return native.wait_at_least(word, value, limit)
        deadline = None if limit is None else time.monotonic() + limit
        while True:  # bounded native waits (see _WAIT_SLICE_S)
            left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
            if native.wait_at_least(word, value, left):
                return True
            if left < _WAIT_SLICE_S:
                return False

    # --- pinning ----------------------------------------------------------------------------
    def _touched(self, block: NodeBlock) -> NodeBlock:
        if self._registration is not None:
            self._registration.touch(block.handle, block.nbytes)
        return block

    def ready(self, block: NodeBlock) -> bool:
        """Whether the block is pinned for this process's device (True with no device)."""
        self._live("NodePool.ready")
        return self._registration is None or self._registration.ready(block.handle, block.nbytes)

    def wait_ready(self, block: NodeBlock | None = None) -> None:
        """Waits until the block (None: the whole pool, after pin_all()) is pinned for this
        process's device; raises CudaError if pinning failed."""
        self._live("NodePool.wait_ready")
        if self._registration is not None:
            if block is None:
                self._registration.wait(0, self.capacity)
            else:
                self._registration.wait(block.handle, block.nbytes)

    def pin_all(self) -> None:
        """Starts pinning the whole pool for this process's device in the background (a
        rank that will use most of it, e.g. for checkpoint loads: blocks made later are
        ready at once); wait_ready() waits for it. InvalidArgumentError without device=."""
        self._live("NodePool.pin_all")
        if self._registration is None:
            raise InvalidArgumentError("pin_all: this NodePool was opened without device=: nothing to pin for")
        self._registration.touch(0, self.capacity)

    # --- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Unpins, frees this process's unnamed blocks and lets go of its named ones (once no
        view() of a block is alive: views keep the mapping). The pool lives on while
        another process holds it. Later calls raise InvalidArgumentError. In a forked child
        it only drops this object (the parent's membership stays the parent's)."""
        self._registration = None
        self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return "<NodePool closed>"
        if self._generation != _fork_generation:
            return f"<NodePool {self._name!r} of process {self._pid}, unusable in this forked child>"
        return f"<NodePool {self.name!r} capacity={self.capacity} device={self.device}>"
