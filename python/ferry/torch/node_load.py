"""Read once per node: ``load_safetensors(..., node=pool)``.

Every rank of a node calls the load with the same files. For each file, one
named block of the node pool (``ferry.node.NodePool``) holds a 4 KiB page of
signal words and then the file's bytes; each of the ``ranks`` processes reads
its contiguous part of the file into it (``read_file_once``), all wait until
every part is in, and then each rank copies the tensors it wants from the
block to its GPU (``copy_from_block``: one ``ferry.copy_many``). The block is
freed when the last rank lets go of it, so no second barrier is needed.

Pieces: the loader does not wait for the whole file. The file is cut into at
most 512 pieces of at least 64 MiB; each rank adds the bytes it has read of a
piece to that piece's word, so a piece is in once its word reaches its length.
``open_file_once`` starts this rank's reads on threads and returns; its
``NodeFile.pieces()`` yields the pieces in file order as each comes in (from
any rank), so the copies to the GPU run while the file is still being read.

The signal words start at zero: the pool zeroes a named block's first 4 KiB
when it makes it. The rank that made the block writes the number of ranks
there last; the others wait for it before they trust the words.

Keys: a hash of the file's identity (device, inode, size, mtime) and this
process's count of node loads of that file, so a new load never joins the
signal words of an earlier one (calls are collective: every rank counts the
same). A rank that dies, or never comes, makes the others fail after
``timeout`` seconds with NodeLoadTimeoutError (how many ranks arrived); none hangs
(``timeout=None`` or ``math.inf``: no limit, a rank waits for the others for good).

Reads: a rank reads its part piece by piece on one thread of its own, each
piece by ``_ferry.File.read_range`` (C++ threads on src/os's pread loop, the
GIL released), and adds the piece's bytes to its word once they are in: the
pieces before it are copied to the GPU while it reads the next.

Only a regular file is loaded: ``_ferry.File`` opens the path without waiting (a
FIFO's open does not wait for a writer) and refuses anything else (a FIFO,
/dev/zero, a directory), as load_safetensors refuses it.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time

from .. import _args, _ferry
from ..errors import InvalidArgumentError, NodeLoadTimeoutError

HEADER_BYTES = 4096  # the block's first page: signal words; the file starts after it
DEFAULT_TIMEOUT = 600.0  # seconds a rank waits for the others (a slow disk, a big shard)
MAX_RANKS = 256  # one claim word per rank, below the piece words
_READ_THREADS = 8  # threads of each piece's read (_ferry.File.read_range: C++, the GIL released)

# signal words (32-bit) of the header page
_W_RANKS = 1  # set by the block's maker: the ranks taking part
_W_ARRIVED = 2  # each rank adds 1 once its part is in the block
_W_CLAIM = 8  # word _W_CLAIM + r: rank r took its part (a rank given twice is refused)
_W_PIECE = 512  # word _W_PIECE + p: bytes of piece p read so far, by every rank
MAX_PIECES = 512  # the piece words fill the rest of the header page
MIN_PIECE = 64 << 20
_POLL_S = 0.25  # how often a piece wait looks at this rank's own readers


# Ranks of a node load did not all arrive within the timeout: ferry.errors'
# NodeLoadTimeoutError (a ferry.errors.FerryTimeoutError); NodeLoadTimeout, its name
# before issue 43, is kept for one release.
NodeLoadTimeout = NodeLoadTimeoutError


_rounds: dict = {}  # (pool name, file identity) -> node loads of it started by this process
_rounds_lock = threading.Lock()


def _next_round(pool_name: str, identity: tuple) -> int:
    with _rounds_lock:
        n = _rounds.get((pool_name, identity), 0)
        _rounds[(pool_name, identity)] = n + 1
        return n


def round_key(pool_name: str, kind: str, identity: tuple) -> str:
    """The named-block key of this process's next node load of `identity` (files'
    device, inode, size, mtime): ``ferry.KIND:HASH:ROUND``. Every rank counts the
    same rounds (calls are collective), so a new load never meets an earlier one's
    words."""
    digest = hashlib.blake2b(repr(identity).encode(), digest_size=16).hexdigest()
    return f"ferry.{kind}:{digest}:{_next_round(pool_name, identity)}"


def node_ranks(rank, ranks) -> tuple[int, int]:
    """(rank, ranks): as given, else LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun
    sets them for every process it starts); InvalidArgumentError if neither."""
    if rank is None:
        rank = _env_int("LOCAL_RANK", "rank")
    if ranks is None:
        ranks = _env_int("LOCAL_WORLD_SIZE", "ranks")
    ranks = _args.integer(ranks, "ranks", 1, MAX_RANKS, f"the number of this node's processes taking part (1-{MAX_RANKS})")
    rank = _args.integer(rank, "rank", 0, ranks - 1, f"this process's index among the node's {ranks} ranks (0-{ranks - 1})")
    return rank, ranks


def _env_int(var: str, what: str) -> int:
    value = os.environ.get(var)
    if value is None:
        raise InvalidArgumentError(
            f"node=: {what} not given and {var} is not set (torchrun sets LOCAL_RANK and LOCAL_WORLD_SIZE); "
            "pass rank= (this process's index on the node) and ranks= (how many processes of the node load)")
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"node=: {var}={value!r} is not an integer; pass rank= and ranks=") from None


def check_node(node, timeout) -> float:
    """node must be a ferry.node.NodePool (open, of this process); the timeout in
    seconds (_args.timeout's rule; no limit: math.inf)."""
    from ..node import NodePool

    if not isinstance(node, NodePool):
        raise InvalidArgumentError(f"node={_args.quote(node)}: expected a ferry.node.NodePool (or None)")
    node._live("load_safetensors(node=)")  # closed, or a forked child's: refused
    limit = _args.timeout(timeout, "timeout")
    return math.inf if limit is None else limit


def parts(size: int, ranks: int) -> list[int]:
    """The ranks+1 bounds of the file's parts: contiguous, 2 MiB aligned (4 KiB
    for small files), the last one ending at size."""
    align = (2 << 20) if size >= ranks * (8 << 20) else 4096
    return [size * r // ranks // align * align for r in range(ranks)] + [size]


def piece_bytes(size: int) -> int:
    """The piece length of a file of `size` bytes: at least MIN_PIECE, 2 MiB
    multiples, at most MAX_PIECES pieces."""
    need = -(-size // MAX_PIECES)
    return max(MIN_PIECE, -(-need // (2 << 20)) * (2 << 20))


class NodeFile:
    """A file in a node block: ``address`` (its first byte in this process),
    ``size``, ``block``, and this rank's ``stats`` (part, bytes_read,
    read_seconds, wait_seconds, made_block; complete after ``finish()``).
    ``pieces()`` yields its pieces as they come in; ``finish()`` waits for this
    rank's reads and every rank's; ``release()`` lets go of it (after
    stopping this rank's reads, if they still run)."""

    def __init__(self, pool, block, size, stats, reading=None, load=None):
        self.pool, self.block, self.size, self.stats = pool, block, size, stats
        self._reading = reading  # this rank's _Reads while they run
        # (path, ranks, timeout, deadline) of the load, for waits and their messages
        self._load = load or ("", 1, DEFAULT_TIMEOUT, time.monotonic() + DEFAULT_TIMEOUT)

    @property
    def address(self) -> int:
        return self.block.address + HEADER_BYTES

    def view(self) -> memoryview:
        return self.block.view()[HEADER_BYTES:HEADER_BYTES + self.size]

    def pieces(self):
        """(lo, hi) file byte ranges, in file order, each once every rank's bytes
        of it are in the block. NodeLoadTimeoutError after the load's timeout; this
        rank's own read error as soon as it happens."""
        step = piece_bytes(self.size)
        for p, lo in enumerate(range(0, self.size, step)):
            hi = min(lo + step, self.size)
            self._wait_word(_W_PIECE + p, hi - lo, f"bytes [{lo}, {hi})")
            yield lo, hi

    def finish(self) -> "NodeFile":
        """Waits until this rank's reads are done (raising their error) and every
        rank has read its part; fills in stats."""
        r, self._reading = self._reading, None
        if r is not None:
            r.join()
            self.stats.update(read_seconds=r.seconds)
        t1 = time.monotonic()
        self._wait_word(_W_ARRIVED, self._load[1], "its part")
        self.stats["wait_seconds"] = time.monotonic() - t1
        return self

    def _wait_word(self, word: int, value: int, what: str) -> None:
        pool, block, r = self.pool, self.block, self._reading
        path, ranks, timeout, deadline = self._load
        while True:
            left = deadline - time.monotonic()
            step = left if r is None else min(left, _POLL_S)
            if pool.wait(block, word, value, max(0.0, step)):
                return
            if r is not None:
                r.raise_error()
            if time.monotonic() >= deadline:
                arrived = pool.value(block, _W_ARRIVED)
                raise NodeLoadTimeoutError(
                    f"{path}: {arrived} of {ranks} ranks had read their part after "
                    f"{timeout:g} s, and {what} of the file was not in (a rank died, did not call "
                    "the load, or reads slowly); every rank of the node must call it with the same files "
                    "(a larger timeout= waits longer)")

    def release(self) -> None:
        r, self._reading = self._reading, None
        if r is not None:
            r.stop()
        if self.block is not None:
            self.pool.free(self.block)
            self.block = None


def read_file_once(pool, path, rank: int, ranks: int, *, timeout: float = DEFAULT_TIMEOUT) -> NodeFile:
    """Collective: every one of `ranks` processes of the node calls it with the
    same file; each reads its part into one named block of `pool` and returns
    once all parts are in (NodeLoadTimeoutError after `timeout` seconds). The
    caller releases the returned NodeFile."""
    nf = open_file_once(pool, path, rank, ranks, timeout=timeout)
    try:
        for _ in nf.pieces():
            pass
        return nf.finish()
    except BaseException:
        nf.release()
        raise


def open_file_once(pool, path, rank: int, ranks: int, *, timeout: float = DEFAULT_TIMEOUT) -> NodeFile:
    """Collective, like read_file_once, but returns once this rank's reads have
    started (on threads): the caller takes the pieces as they come in
    (``NodeFile.pieces()``), then calls ``finish()``, and releases it."""
    timeout = check_node(pool, timeout)
    rank, ranks = node_ranks(rank, ranks)
    name = os.fsdecode(os.fspath(path))
    file = _ferry.File(name)  # InvalidArgumentError "NAME: not a regular file" for a FIFO, a device, a directory
    try:
        identity = file.identity()[:4]  # device, inode, size, mtime_ns
        size = identity[2]
        key = round_key(pool.name, "load", identity)
        if piece_bytes(size) >= 1 << 32:  # a piece's word counts its bytes in 32 bits
            raise InvalidArgumentError(f"{name}: {size} bytes is more than a node load reads in one file "
                                       f"({MAX_PIECES} pieces of under 4 GiB); split it into shards")
        block = pool.named(key, HEADER_BYTES + size)
    except BaseException:
        file.close()
        raise
    try:
        deadline = time.monotonic() + timeout
        if block.created:
            pool.add(block, _W_RANKS, ranks)
        elif not pool.wait(block, _W_RANKS, 1, timeout):
            raise NodeLoadTimeout(
                f"{name}: the rank that made this file's node block did not set it up within {timeout:g} s "
                "(it died, or was stopped); every rank of the node must call the load with the same files")
        elif pool.value(block, _W_RANKS) != ranks:
            raise InvalidArgumentError(
                f"{name}: this rank loads with ranks={ranks}, the rank that made the node block with "
                f"ranks={pool.value(block, _W_RANKS)}; every rank must pass the same ranks")
        if pool.add(block, _W_CLAIM + rank) != 0:
            raise InvalidArgumentError(f"{name}: rank={rank} is taken by another process of this load; "
                                       "each process of the node needs its own rank")
        bounds = parts(size, ranks)
        lo, hi = bounds[rank], bounds[rank + 1]
        stats = {"part": (lo, hi), "bytes_read": hi - lo, "read_seconds": None, "wait_seconds": None,
                 "made_block": block.created}
        reading = _Reads(pool, block, file, identity, lo, hi)
        file = None  # the reads own it now
        return NodeFile(pool, block, size, stats, reading, (name, ranks, timeout, deadline))
    except BaseException:
        if file is not None:
            file.close()
        pool.free(block)
        raise


class _Reads:
    """This rank's part of a file read into the block on a thread of its own,
    piece by piece (each piece by C++ threads, the GIL released); each piece,
    once read, adds its bytes to its word; once all are read (and the file did
    not change meanwhile), the rank's arrival."""

    def __init__(self, pool, block, file, identity, lo, hi):
        self.pool, self.block, self.file, self.identity = pool, block, file, identity
        self.step = piece_bytes(identity[2])
        self.base = block.address + HEADER_BYTES
        self.stopping = False
        self.error = None
        self.seconds = None
        self.t0 = time.monotonic()
        # (lo, hi, piece) of the part, cut where pieces end
        self.spans = [(max(lo, p * self.step), min(hi, (p + 1) * self.step), p)
                      for p in range(lo // self.step, -(-hi // self.step))] if hi > lo else []
        self.lock = threading.Lock()  # guards error
        self.thread = threading.Thread(target=self._run, name="ferry-node-read", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for a, b, p in self.spans:
                if self.stopping:
                    return
                self.file.read_range(a, self.base + a, b - a, _READ_THREADS)  # a short file: InvalidArgumentError
                self.pool.add(self.block, _W_PIECE + p, b - a)
            if self.file.identity()[3] != self.identity[3]:
                raise InvalidArgumentError(f"{self.file.name}: the file changed while it was read; load it again")
            self.seconds = time.monotonic() - self.t0
            self.pool.add(self.block, _W_ARRIVED)
        except BaseException as e:  # noqa: BLE001 - raised by the loading thread
            with self.lock:
                self.error = self.error or e

    def raise_error(self) -> None:
        with self.lock:
            e = self.error
        if e is not None:
            self.join()
            raise e

    def join(self) -> None:
        """Waits for the reads (raising their error) and closes the file."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            self.file.close()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """After an error elsewhere: no new piece starts; waits for the one being read."""
        self.stopping = True
        try:
            self.join()
        except BaseException:  # noqa: BLE001 - the first error was raised already, or is moot
            pass


def piece_items(items, lo: int, hi: int, start: int = 0):
    """The parts of `items` [(file offset, size, device address)], sorted by
    offset and not overlapping, that lie in file bytes [lo, hi): (offsets,
    sizes, addresses, where the next piece's search starts). Pieces are asked
    in file order."""
    offsets, sizes, addresses = [], [], []
    k, n = start, len(items)
    while k < n and items[k][0] + items[k][1] <= lo:
        k += 1
    nxt = k
    while k < n and items[k][0] < hi:
        off, size, dst = items[k]
        a, b = max(off, lo), min(off + size, hi)
        offsets.append(a)
        sizes.append(b - a)
        addresses.append(dst + (a - off))
        if off + size <= hi:
            nxt = k + 1
        k += 1
    return offsets, sizes, addresses, nxt


def copy_from_block(nf: NodeFile, offsets, sizes, addresses, stream, device) -> None:
    """Copies file bytes [offsets[i], +sizes[i]) from the node block to device
    `addresses[i]`, in one copy_many (the copy engine cuts an item where the
    pool's pinned pieces end: each piece is its own registration)."""
    from ..copy import copy_many

    base = nf.address
    dsts, srcs, lens = [], [], []
    for off, n, dst in zip(offsets, sizes, addresses):
        if n > 0:
            dsts.append(dst)
            srcs.append(base + off)
            lens.append(n)
    if dsts:
        nf.pool.wait_ready(nf.block)
        copy_many(dsts, srcs, lens, stream=stream, device=device)
