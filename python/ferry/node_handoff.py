"""KV handoff between two processes of a node through a NodePool: a ring of slots.

    # producer (rank 0, GPU 0)                # consumer (rank 1, GPU 1)
    pool = NodePool("kv", 8 << 30, device=0)  pool = NodePool("kv", device=1)
    h = Handoff(pool, "req-7", slots=4, slot_bytes=64 << 20)   # the same key, slots, slot_bytes
    h.send(block_ptrs, 2 << 20)              h.recv(block_ptrs, 2 << 20)
    h.drain()   # before closing: the consumer has everything

Both sides open the named block ``key``: a header (signal words) and ``slots``
slots of ``slot_bytes``. ``send(srcs, sizes)`` lays the items one after another
(each at a 256-byte boundary) into a stream cut into slots; per slot it waits
until the consumer drained that slot's previous use, copies the slot's pieces
with ONE copy call (``ferry.copy_many``: GPU -> pinned slot), then bumps the
slot's ``filled`` word. ``recv(dsts, sizes)`` waits for ``filled``, copies the
slot into its GPU with one copy call and bumps ``drained``. So while the
consumer reads slot k, the producer fills slot k+1: the two links run at once.

Rules: one producer and one consumer per key, one Handoff object per key in a
process (a process holds a named block once); each ``recv`` call mirrors one
``send`` call (the same sizes, in order: checked, a mismatch is
InvalidArgumentError and consumes nothing). Sizes are anything (an item larger
than a slot is split across slots). The named block is freed when both let go,
so a producer that leaves early loses what was not received: call ``drain()``.

Waits are bounded (``timeout``: seconds; None or math.inf: no limit) and watch
the peer: a peer that left the pool (exited, killed, closed) is noticed within
``poll`` seconds and raises HandoffPeerGoneError; a live peer that does not keep
up raises HandoffTimeoutError after ``timeout``. After either, the handoff is
broken (the peer's waits fail too): open a new key.

``copy``: the copy function, ``copy(dsts, srcs, sizes)`` with int64 arrays of
addresses (default: the copy engine of ``device``, in C++ with no Python call
per slot; ``ferry.copy_many(...)`` where there is no device); ``memmove_many``
copies host memory to host memory (tests, CPU-only runs; in C++ as well).

Routes (``route=``): where the two GPUs reach each other (the same GPU, or peer
access over NVLink or PCIe), the consumer publishes a ring on its GPU at its
first ``recv`` (CUDA IPC) and the producer copies each slot GPU to GPU into it;
"auto" (default) does so when the consumer's destinations are on its GPU and
the producer's GPU reaches it, else the slots go through the pool (host
destinations, an offload tier, take the pool); "pool" never uses the device
ring; "peer" insists (NotSupportedError where it cannot). Slots sent before
the consumer published go through the pool; each slot records which way it
went and the consumer reads it from there. ``last_route`` says which way the
last send or recv call went ("pool", "peer", "mixed", None: nothing moved);
``stats()`` counts slots by route.

``peer_sms`` (default ``PEER_SMS``, 32): on the GPU-to-GPU route, where a
slot's blocks are all memory of this side's GPU (or the ring), those under
1 MiB are copied by an SM kernel on at most that many SMs, in one launch per
slot, and the larger ones by the copy engines at the same time, instead of one
copy-engine descriptor per block (~5 us each over NVLink, so small blocks
crossed slowly; see docs/node.md). 0: copy engines only; then
"auto" also sends blocks averaging < 256 KiB through the pool, which was faster
for them.

The protocol (block layout, words, slot states, ordering) is written down in
src/node/handoff.h; this class binds it.
"""

from __future__ import annotations

import math

from . import _args, _ferry
from ._resolve import resolve
from .errors import (HandoffError, HandoffPeerGoneError, HandoffTimeoutError, InvalidArgumentError,
                     NotSupportedError)

__all__ = ["Handoff", "HandoffError", "HandoffPeerGoneError", "HandoffTimeoutError", "memmove_many", "plan",
           "header_bytes", "HANDOFF_TIMEOUT", "ROUTES"]

# The protocol's constants, from src/node/handoff.h (one source).
MAGIC = _ferry.HANDOFF_MAGIC
ALIGN = _ferry.HANDOFF_ALIGN  # items start at this boundary in the stream
SLOT_ALIGN = _ferry.HANDOFF_SLOT_ALIGN  # slot_bytes is rounded up to this
MAX_SLOTS = _ferry.HANDOFF_MAX_SLOTS
HEADER_WORDS = _ferry.HANDOFF_HEADER_WORDS
META_WORDS = _ferry.HANDOFF_META_WORDS
PEER_SMS = _ferry.HANDOFF_PEER_SMS  # peer_sms's default: SMs of the GPU-to-GPU route's copy kernel
ROUTES = ("auto", "pool", "peer")


class _HandoffTimeout:
    """drain()'s default: the timeout the Handoff was opened with."""

    def __repr__(self) -> str:
        return "Handoff.timeout"


HANDOFF_TIMEOUT = _HandoffTimeout()


def header_bytes(slots: int, granule: int) -> int:
    """The ring's header (signal words), whole granules: the slots start after it."""
    return _ferry.handoff_header_bytes(slots, granule)


def _numpy():
    try:
        import numpy
    except ImportError:
        raise NotSupportedError("ferry.node.Handoff needs numpy (its plans are int64 arrays): "
                                "pip install numpy") from None
    return numpy


def memmove_many(dsts, srcs, sizes) -> None:
    """copy(dsts, srcs, sizes) for host memory on both sides (a memmove per item; a
    Handoff given this function runs it in C++, with no Python call per slot)."""
    np = _numpy()
    _ferry.host_copy_many(*(np.ascontiguousarray(a, np.int64) for a in (dsts, srcs, sizes)))


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _addresses(items, sizes, writable: bool, what: str):
    """(addresses, sizes) as int64 arrays from ints, an int64 array or copy arguments."""
    np = _numpy()
    if isinstance(items, np.ndarray) and items.ndim == 1 and items.dtype.kind in "iu":
        addrs, known = items.astype(np.int64), None
    else:
        objs = _args.items(items, what, "a sequence of addresses, tensors or buffers")
        addrs, known = np.empty(len(objs), np.int64), []
        for i, obj in enumerate(objs):
            if type(obj) is int:
                addrs[i] = obj
                known.append(None)
                continue
            a, n, _ = resolve(obj, writable=writable)
            addrs[i] = a
            known.append(n)
    if sizes is None:
        if known is None or any(n is None for n in known):
            raise InvalidArgumentError(f"{what}: addresses given as ints need sizes")
        lengths = np.array(known, np.int64)
    elif isinstance(sizes, np.ndarray) and sizes.ndim == 1 and sizes.dtype.kind in "iu":
        lengths = sizes.astype(np.int64)  # an array of sizes (numpy arrays also have __index__)
        if len(lengths) != len(addrs):
            raise InvalidArgumentError(f"sizes: {len(lengths)} sizes for {len(addrs)} items of {what}")
        if len(lengths) and int(lengths.min()) < 0:
            raise InvalidArgumentError(f"sizes: {int(lengths.min())} is negative")
    elif hasattr(type(sizes), "__index__") and not isinstance(sizes, bool):
        lengths = np.full(len(addrs), _args.size(sizes, "sizes"), np.int64)
    else:
        lengths = np.array(_args.sizes(sizes), np.int64)
        if len(lengths) != len(addrs):
            raise InvalidArgumentError(f"sizes: {len(lengths)} sizes for {len(addrs)} items of {what}")
    if known is not None:
        for i, n in enumerate(known):
            if n is not None and lengths[i] > n:
                raise InvalidArgumentError(f"sizes[{i}]={int(lengths[i])}: {what}[{i}] holds only {n} bytes")
    return np.ascontiguousarray(addrs, np.int64), np.ascontiguousarray(lengths, np.int64)


def plan(lengths, slot_bytes: int) -> tuple[int, list]:
    """(stream bytes, per slot-sized chunk (item index, offset in item, offset in slot,
    length) as arrays): item i starts at a 256-byte boundary after item i-1; the
    stream is cut every slot_bytes. Both sides compute the same plan from the sizes
    (src/node/handoff.h's plan_handoff, which send and recv run)."""
    np = _numpy()
    total, pieces, bounds = _ferry.handoff_plan(np.ascontiguousarray(lengths, np.int64), slot_bytes)
    cols = np.array(pieces, np.int64).reshape(-1, 4)
    return total, [tuple(cols[a:b, k].copy() for k in range(4)) for a, b in zip(bounds[:-1], bounds[1:])]


class Handoff:
    """One side of a ring of slots in the NodePool block named `key` (module docstring).

    slots: >= 1 (2 or more to overlap the two copies); slot_bytes: each slot's
    size (rounded up to 4 KiB); both sides give the same values. timeout:
    seconds a wait may take (also for the block's header to be written by the
    side that made it; None or math.inf: no limit). poll: how often a wait checks
    that the peer is still in the pool. copy: the copy function (module docstring).
    route: "auto", "pool" or "peer" (module docstring). device: the GPU this side
    copies with (default: the pool's). peer_sms: SMs of the GPU-to-GPU route's
    copy kernel (module docstring; None: PEER_SMS; 0: copy engines only)."""

    def __init__(self, pool, key: str, slots: int = 4, slot_bytes: int = 64 << 20, *,
                 timeout: float | None = 60.0, poll: float = 0.25, copy=None, device: int | None = None,
                 route: str = "auto", peer_sms: int | None = None):
        self.slots = _args.integer(slots, "slots", 1, MAX_SLOTS)
        self.slot_bytes = _align(_args.integer(slot_bytes, "slot_bytes", 1, 1 << 44), SLOT_ALIGN)
        timeout = _args.timeout(timeout, "timeout")
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0 < poll < float("inf"):
            raise InvalidArgumentError(f"poll={_args.quote(poll)}: expected seconds > 0")
        if copy is not None and not callable(copy):
            raise InvalidArgumentError(f"copy={_args.quote(copy)}: expected a function copy(dsts, srcs, sizes)")
        if route not in ROUTES:
            raise InvalidArgumentError(f"route={_args.quote(route)}: expected 'auto', 'pool' or 'peer'")
        if not isinstance(key, str):
            raise InvalidArgumentError(f"key={_args.quote(key)}: expected a str")
        self.peer_sms = PEER_SMS if peer_sms is None else _args.integer(peer_sms, "peer_sms", 0, 1024)
        self.pool, self.key, self.poll, self.route = pool, key, float(poll), route
        self.device = pool.device if device is None else _args.integer(device, "device", 0, 1 << 30)
        self.block = None
        self._native = None
        native_pool = pool._live(f"Handoff {key!r}")
        if copy is memmove_many:
            mode, fn = "host", None
        elif copy is None and self.device is not None:
            mode, fn = "engine", None
        else:
            if copy is None:
                from .copy import copy_many

                def copy(dsts, srcs, sizes):
                    copy_many(dsts, srcs, sizes, device=None)
            np = _numpy()
            user = copy

            def fn(dsts, srcs, sizes):
                user(np.array(dsts, np.int64), np.array(srcs, np.int64), np.array(sizes, np.int64))
            mode = "python"
        self._native = _ferry.Handoff(native_pool, key, self.slots, self.slot_bytes,
                                      math.inf if timeout is None else timeout, self.poll, route, mode, fn,
                                      -1 if self.device is None else self.device, self.peer_sms)
        try:
            handle, _, created = self._native.block
            self.block = pool.block(handle)  # this process's view of it, pinned for pool.device
            self.block.created, self.block.key = created, key
            if pool.device is not None:
                pool.wait_ready(self.block)
        except BaseException:
            self.close()  # lets go of what it holds: a failed open leaves nothing behind
            raise

    @property
    def timeout(self) -> float | None:
        """Seconds a wait may take (None: no limit); settable."""
        t = self._native.timeout if self._native is not None else math.inf
        return None if math.isinf(t) else t

    @timeout.setter
    def timeout(self, value) -> None:
        t = _args.timeout(value, "timeout")
        if self._native is not None:
            self._native.timeout = math.inf if t is None else t

    @property
    def _sent(self) -> int:
        return self._native.sent if self._native is not None else 0

    @property
    def _received(self) -> int:
        return self._native.received if self._native is not None else 0

    # --- the two sides ----------------------------------------------------------------------
    def send(self, srcs, sizes=None) -> int:
        """Copies the items into the ring, slot by slot, one copy call per slot; returns
        the bytes sent. srcs: addresses (ints, an int64 array) with sizes, or
        tensors/buffers (sizes: None for whole objects, an int for every item, or a list)."""
        self._usable("send")
        addrs, lengths = _addresses(srcs, sizes, False, "srcs")
        return self._native.send(addrs, lengths)

    def recv(self, dsts, sizes=None) -> int:
        """Copies the next send call's items into dsts (the same sizes as sent), one copy
        call per slot; returns the bytes received."""
        self._usable("recv")
        addrs, lengths = _addresses(dsts, sizes, True, "dsts")
        return self._native.recv(addrs, lengths)

    def drain(self, timeout: float | None = HANDOFF_TIMEOUT) -> None:
        """Producer: waits until the consumer drained every slot sent, at most `timeout`
        seconds in all (default: the Handoff's timeout; None or math.inf: no limit)."""
        self._usable("drain")
        limit = self.timeout if timeout is HANDOFF_TIMEOUT else _args.timeout(timeout, "timeout")
        self._native.drain(math.inf if limit is None else limit)

    @property
    def pending(self) -> int:
        """Slots sent and not yet drained."""
        self._usable("pending")
        return self._native.pending

    @property
    def last_route(self) -> str | None:
        """Which way the last send or recv call's slots went: "pool" (host slots of the
        node pool), "peer" (GPU to GPU through the consumer's device ring), "mixed", or
        None when it moved nothing."""
        self._usable("last_route")
        s = self._native.stats()
        pool, peer = s["last_pool_slots"], s["last_peer_slots"]
        return ("mixed" if pool and peer else "peer" if peer else "pool" if pool else None)

    def stats(self) -> dict:
        """Slots this process sent and received since it opened the handoff, and how many
        went each way: sent, received, pool_slots, peer_slots, last_pool_slots,
        last_peer_slots (the last call's), route_note (why slots went through the pool
        where the device ring might have been used; "" if no reason was seen)."""
        self._usable("stats")
        return self._native.stats()

    def _usable(self, what: str) -> None:
        """NotSupportedError in a forked child (the pool's memory is not mapped there);
        InvalidArgumentError once closed."""
        self.pool._live(f"Handoff {self.key!r}.{what}")
        if self._native is None:
            raise InvalidArgumentError(f"Handoff {self.key!r}.{what}: the handoff was closed; open it again")

    # --- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Lets go of the named block (freed when both sides did); a consumer's device
        ring is freed once the producer let go of it (at most the timeout). In a forked
        child it only drops this object (the block stays the parent's)."""
        native, self._native, self.block = self._native, None, None
        if native is None:
            return
        try:
            self.pool._live(f"Handoff {self.key!r}.close")
        except NotSupportedError:
            return  # a forked child: nothing here is ours to free (the native object knows it too)
        native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"<Handoff {self.key!r} slots={self.slots} slot_bytes={self.slot_bytes} sent={self._sent} "
                f"received={self._received}>")
