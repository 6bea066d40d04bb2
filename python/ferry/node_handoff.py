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
addresses (default ``ferry.copy_many(..., device=pool.device)``);
``memmove_many`` copies host memory to host memory (tests, CPU-only runs).
"""

from __future__ import annotations

import ctypes
import time

from . import _args
from ._resolve import resolve
from .units import fmt_bytes
from .errors import (HandoffError, HandoffPeerGoneError, HandoffTimeoutError, InvalidArgumentError,
                     NotSupportedError)

MAGIC = 0x48444F46  # "FODH"
ALIGN = 256  # items start at this boundary in the stream
SLOT_ALIGN = 4096  # slot_bytes is rounded up to this
MAX_SLOTS = 4096
HEADER_WORDS = 16
META_WORDS = 4  # per slot: stream bytes (lo, hi), items, the send call's number
# header words
_W_MAGIC, _W_READY, _W_SLOTS, _W_SLOT_KIB4, _W_BROKEN = 0, 1, 2, 3, 4
_W_SIDE = {"producer": 6, "consumer": 8}  # (member slot + 1, pid) of each side


class _HandoffTimeout:
    """drain()'s default: the timeout the Handoff was opened with."""

    def __repr__(self) -> str:
        return "Handoff.timeout"


HANDOFF_TIMEOUT = _HandoffTimeout()


def header_bytes(slots: int, granule: int) -> int:
    """The ring's header (signal words), whole granules: the slots start after it."""
    return _align(4 * (HEADER_WORDS + (2 + META_WORDS) * slots), granule)


def _sizes(slots: int, slot_bytes: int) -> str:
    return f"slots={slots}, slot_bytes={slot_bytes} ({fmt_bytes(slot_bytes)})"


def _numpy():
    try:
        import numpy
    except ImportError:
        raise NotSupportedError("ferry.node.Handoff needs numpy (its plans are int64 arrays): "
                                "pip install numpy") from None
    return numpy


def memmove_many(dsts, srcs, sizes) -> None:
    """copy(dsts, srcs, sizes) for host memory on both sides (ctypes.memmove per item)."""
    for d, s, n in zip(dsts.tolist(), srcs.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)


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
    return addrs, lengths


def plan(lengths, slot_bytes: int) -> tuple[int, list]:
    """(stream bytes, per slot-sized chunk (item index, offset in item, offset in slot,
    length) as arrays): item i starts at a 256-byte boundary after item i-1; the
    stream is cut every slot_bytes. Both sides compute the same plan from the sizes."""
    np = _numpy()
    lengths = np.asarray(lengths, np.int64)
    keep = np.nonzero(lengths > 0)[0]
    if len(keep) == 0:
        return 0, []
    n = lengths[keep]
    padded = (n + ALIGN - 1) // ALIGN * ALIGN
    start = np.cumsum(padded) - padded
    total = int(start[-1] + n[-1])
    first, last = start // slot_bytes, (start + n - 1) // slot_bytes
    item, off, pos, length = [keep], [np.zeros(len(keep), np.int64)], [start], [n]
    crossing = np.nonzero(first != last)[0]
    if len(crossing):  # split the items that cross a slot boundary
        whole = first == last
        item, off, pos, length = [keep[whole]], [off[0][whole]], [start[whole]], [n[whole]]
        for j in crossing.tolist():
            s, e = int(start[j]), int(start[j] + n[j])
            cut = s
            while cut < e:
                end = min(e, (cut // slot_bytes + 1) * slot_bytes)
                item.append(np.array([keep[j]]))
                off.append(np.array([cut - s]))
                pos.append(np.array([cut]))
                length.append(np.array([end - cut]))
                cut = end
    item, off, pos, length = (np.concatenate(x).astype(np.int64) for x in (item, off, pos, length))
    order = np.argsort(pos, kind="stable")
    item, off, pos, length = item[order], off[order], pos[order], length[order]
    chunk = pos // slot_bytes
    bounds = np.searchsorted(chunk, np.arange((total + slot_bytes - 1) // slot_bytes + 1))
    chunks = [(item[a:b], off[a:b], pos[a:b] - c * slot_bytes, length[a:b])
              for c, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return total, chunks


class Handoff:
    """One side of a ring of slots in the NodePool block named `key` (module docstring).

    slots: >= 1 (2 or more to overlap the two copies); slot_bytes: each slot's
    size (rounded up to 4 KiB); both sides give the same values. timeout:
    seconds a wait may take (also for the block's header to be written by the
    side that made it; None or math.inf: no limit). poll: how often a wait checks
    that the peer is still in the pool. copy: the copy function (module docstring)."""

    def __init__(self, pool, key: str, slots: int = 4, slot_bytes: int = 64 << 20, *,
                 timeout: float | None = 60.0, poll: float = 0.25, copy=None, device: int | None = None):
        self.slots = _args.integer(slots, "slots", 1, MAX_SLOTS)
        self.slot_bytes = _align(_args.integer(slot_bytes, "slot_bytes", 1, 1 << 44), SLOT_ALIGN)
        timeout = _args.timeout(timeout, "timeout")
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0 < poll < float("inf"):
            raise InvalidArgumentError(f"poll={_args.quote(poll)}: expected seconds > 0")
        if copy is not None and not callable(copy):
            raise InvalidArgumentError(f"copy={_args.quote(copy)}: expected a function copy(dsts, srcs, sizes)")
        self.pool, self.key, self.timeout, self.poll = pool, key, timeout, float(poll)
        self.device = pool.device if device is None else device
        if copy is None:
            from .copy import copy_many

            dev = self.device

            def copy(dsts, srcs, sizes):
                copy_many(dsts, srcs, sizes, device=dev)
        self._copy = copy
        header = header_bytes(self.slots, pool.granule)
        self._data_offset = header
        self.block = None
        try:
            self.block = pool.named(key, header + self.slots * self.slot_bytes)
        except InvalidArgumentError:
            other = self._other_side()
            if other is None:
                raise
            raise InvalidArgumentError(f"Handoff {key!r}: the other side opened it with {other}; this side "
                                       f"asked {_sizes(self.slots, self.slot_bytes)}: give both sides the same "
                                       "slots and slot_bytes (or another key)") from None
        try:
            self._open(header)
        except BaseException:
            self.close()  # lets go of what it holds: a failed open leaves nothing behind
            raise

    def _other_side(self) -> str | None:
        """What the process that made the named block `key` asked, when it differs in size
        from this side's (for the message); None if no such block is there."""
        native = self.pool._live(f"Handoff {self.key!r}")
        found = native.find_named(self.key)
        if found is None:
            return None
        offset, nbytes = found
        granule = self.pool.granule
        # a look without holding the block: its maker may still be writing the header, or free it
        magic, ready, slots, kib4 = (native.load(offset + 4 * w) for w in (_W_MAGIC, _W_READY, _W_SLOTS,
                                                                           _W_SLOT_KIB4))
        if magic == MAGIC and ready and 1 <= slots <= MAX_SLOTS and \
                header_bytes(slots, granule) + slots * kib4 * SLOT_ALIGN == nbytes:
            return _sizes(slots, kib4 * SLOT_ALIGN)
        return f"a block of {nbytes} bytes ({fmt_bytes(nbytes)}; its header is not a handoff's, or not written yet)"

    def _open(self, header: int) -> None:
        pool, key = self.pool, self.key
        base = self.block.address
        self._words = (ctypes.c_uint32 * (header // 4)).from_address(base)
        self._slot_base = base + header
        self._filled, self._drained = HEADER_WORDS, HEADER_WORDS + self.slots
        self._meta = HEADER_WORDS + 2 * self.slots
        # The pool zeroes a named block's first 4 KiB when it makes it, so READY
        # reads 0 until the maker has written the whole header (which may run
        # past 4 KiB: it clears that part first) and bumped READY.
        if self.block.created:
            ctypes.memset(base, 0, 4 * (HEADER_WORDS + (2 + META_WORDS) * self.slots))
            self._words[_W_MAGIC], self._words[_W_SLOTS] = MAGIC, self.slots
            self._words[_W_SLOT_KIB4] = self.slot_bytes // SLOT_ALIGN
            pool.add(self.block, _W_READY)
        elif not pool.wait(self.block, _W_READY, 1, self.timeout):
            raise HandoffTimeoutError(f"handoff {key!r}: the process that made its block did not "
                                      f"finish writing the header within {self.timeout:g} s")
        got = (self._words[_W_MAGIC], self._words[_W_SLOTS], self._words[_W_SLOT_KIB4] * SLOT_ALIGN)
        if got != (MAGIC, self.slots, self.slot_bytes):
            theirs = "a block that is not a handoff's" if got[0] != MAGIC else _sizes(got[1], got[2])
            raise InvalidArgumentError(
                f"Handoff {key!r}: the other side opened it with {theirs}; this side asked "
                f"{_sizes(self.slots, self.slot_bytes)}: give both sides the same slots and slot_bytes "
                "(or another key)")
        if pool.device is not None:
            pool.wait_ready(self.block)
        # where each side is: a side's position is what its counters say (so a reopened side resumes)
        self._sent = sum(self._words[self._filled + s] for s in range(self.slots))
        self._received = sum(self._words[self._drained + s] for s in range(self.slots))
        self._calls = {"producer": 0, "consumer": 0}
        self._roles: set[str] = set()

    # --- the two sides ----------------------------------------------------------------------
    def send(self, srcs, sizes=None) -> int:
        """Copies the items into the ring, slot by slot, one copy call per slot; returns
        the bytes sent. srcs: addresses (ints, an int64 array) with sizes, or
        tensors/buffers (sizes: None for whole objects, an int for every item, or a list)."""
        self._usable("send")
        addrs, lengths = _addresses(srcs, sizes, False, "srcs")
        self._join("producer")
        total, chunks = plan(lengths, self.slot_bytes)
        call = self._calls["producer"] = self._calls["producer"] + 1
        for item, off, pos, length in chunks:
            b = self._sent
            slot, rnd = b % self.slots, b // self.slots
            self._wait(self._drained + slot, rnd, "consumer", f"drain slot {slot} (batch {b})", self.timeout)
            self._copy(self._slot_base + slot * self.slot_bytes + pos, addrs[item] + off, length)
            m = self._meta + META_WORDS * slot
            self._words[m], self._words[m + 1] = total & 0xFFFFFFFF, total >> 32
            self._words[m + 2], self._words[m + 3] = len(lengths) & 0xFFFFFFFF, call & 0xFFFFFFFF
            self.pool.add(self.block, self._filled + slot)
            self._sent = b + 1
        return total

    def recv(self, dsts, sizes=None) -> int:
        """Copies the next send call's items into dsts (the same sizes as sent), one copy
        call per slot; returns the bytes received."""
        self._usable("recv")
        addrs, lengths = _addresses(dsts, sizes, True, "dsts")
        self._join("consumer")
        total, chunks = plan(lengths, self.slot_bytes)
        for k, (item, off, pos, length) in enumerate(chunks):
            b = self._received
            slot, rnd = b % self.slots, b // self.slots
            self._wait(self._filled + slot, rnd + 1, "producer", f"fill slot {slot} (batch {b})", self.timeout)
            m = self._meta + META_WORDS * slot
            sent = (self._words[m] | self._words[m + 1] << 32, self._words[m + 2])
            if k == 0 and sent != (total, len(lengths) & 0xFFFFFFFF):
                raise InvalidArgumentError(
                    f"handoff {self.key!r}: recv of {len(lengths)} items ({total} bytes in the stream) but "
                    f"the producer's send had {sent[1]} items ({sent[0]} bytes): give recv the sizes send had")
            self._copy(addrs[item] + off, self._slot_base + slot * self.slot_bytes + pos, length)
            self.pool.add(self.block, self._drained + slot)
            self._received = b + 1
        return total

    def drain(self, timeout: float | None = HANDOFF_TIMEOUT) -> None:
        """Producer: waits until the consumer drained every slot sent, at most `timeout`
        seconds in all (default: the Handoff's timeout; None or math.inf: no limit)."""
        self._usable("drain")
        limit = self.timeout if timeout is HANDOFF_TIMEOUT else _args.timeout(timeout, "timeout")
        deadline = None if limit is None else time.monotonic() + limit
        for s in range(self.slots):
            need = self._sent // self.slots + (1 if s < self._sent % self.slots else 0)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait(self._drained + s, need, "consumer", f"drain slot {s}", left, limit)

    @property
    def pending(self) -> int:
        """Slots sent and not yet drained."""
        self._usable("pending")
        return sum(self._words[self._filled + s] - self._words[self._drained + s] for s in range(self.slots))

    # --- waiting, watching the peer ---------------------------------------------------------
    def _usable(self, what: str) -> None:
        """NotSupportedError in a forked child (the pool's memory is not mapped there);
        InvalidArgumentError once closed."""
        self.pool._live(f"Handoff {self.key!r}.{what}")
        if self.block is None:
            raise InvalidArgumentError(f"Handoff {self.key!r}.{what}: the handoff was closed; open it again")

    def _join(self, role: str) -> None:
        """Writes this process's pool slot and pid for `role`, once, so the peer can watch it."""
        self._check_broken()
        if role in self._roles:
            return
        me = next(m for m in self.pool.stats()["members"] if m["this_process"])
        w = _W_SIDE[role]
        self._words[w + 1] = me["pid"] & 0xFFFFFFFF
        self._words[w] = me["slot"] + 1
        self._roles.add(role)

    def _peer_gone(self, peer: str) -> str | None:
        slot, pid = self._words[_W_SIDE[peer]], self._words[_W_SIDE[peer] + 1]
        if slot == 0:
            return None  # not started yet: only the timeout applies
        alive = {(m["slot"] + 1, m["pid"] & 0xFFFFFFFF) for m in self.pool.stats()["members"]}
        return None if (slot, pid) in alive else f"the {peer} (pid {pid}) left the pool"

    def _check_broken(self) -> None:
        why = self._words[_W_BROKEN]
        if why:
            side = {1: "producer", 2: "consumer"}.get(why, "other side")
            raise HandoffError(f"handoff {self.key!r} is broken: the {side} gave up after an error; "
                               f"open a new key")

    def _wait(self, word: int, value: int, peer: str, what: str, timeout: float | None,
              told: float | None = None) -> None:
        """Waits until the word reaches value, at most `timeout` seconds (None: no limit;
        `told`: the limit the message names, if not that)."""
        limit = timeout
        deadline = None if limit is None else time.monotonic() + limit
        step = self.poll if limit is None else min(self.poll, limit)
        while not self.pool.wait(self.block, word, value & 0xFFFFFFFF, step):
            self._check_broken()
            gone = self._peer_gone(peer)
            if gone or (deadline is not None and time.monotonic() >= deadline):
                self._words[_W_BROKEN] = 1 if peer == "consumer" else 2  # the peer's waits fail too
                if gone:
                    raise HandoffPeerGoneError(f"handoff {self.key!r}: waiting for the {peer} to {what}, but "
                                               f"{gone} (died, was killed or closed the pool): "
                                               f"{self.pending} slots undelivered")
                told = limit if told is None else told
                if self._words[_W_SIDE[peer]] == 0:
                    where = f"it has not started: no {'recv' if peer == 'consumer' else 'send'} call yet"
                else:
                    where = f"it is still in the pool: {self.pool.holders()}"
                raise HandoffTimeoutError(f"handoff {self.key!r}: the {peer} did not {what} within {told:g} s "
                                          f"({where}); raise timeout= if it is slow")

    # --- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Lets go of the named block (freed when both sides did). In a forked child it
        only drops this object (the block stays the parent's)."""
        if self.block is not None:
            block, self.block, self._words = self.block, None, None
            try:
                self.pool._live(f"Handoff {self.key!r}.close")
            except NotSupportedError:
                return  # a forked child: nothing here is ours to free
            self.pool.free(block)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"<Handoff {self.key!r} slots={self.slots} slot_bytes={self.slot_bytes} sent={self._sent} "
                f"received={self._received}>")
