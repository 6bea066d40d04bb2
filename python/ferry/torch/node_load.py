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

Reads: a rank reads its part piece by piece on a C++ thread of its own
(``_ferry.NodeFileRead``: node/node_file.h writes the block's words and states
down), each piece by load::read_range's threads, and adds the piece's bytes to
its word once they are in: the pieces before it are copied to the GPU while it
reads the next. Waits release the GIL.

Only a regular file is loaded: ``_ferry.File`` opens the path without waiting (a
FIFO's open does not wait for a writer) and refuses anything else (a FIFO,
/dev/zero, a directory), as load_safetensors refuses it.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading

from .. import _args, _ferry
from ..errors import InvalidArgumentError, NodeLoadTimeoutError

HEADER_BYTES = _ferry.NODE_FILE_HEADER_BYTES  # the block's first page: signal words; the file starts after it
DEFAULT_TIMEOUT = 600.0  # seconds a rank waits for the others (a slow disk, a big shard)
MAX_RANKS = _ferry.NODE_FILE_MAX_RANKS  # one claim word per rank, below the piece words
MAX_PIECES = _ferry.NODE_FILE_MAX_PIECES  # the piece words fill the rest of the header page
MIN_PIECE = _ferry.NODE_FILE_MIN_PIECE
_READ_THREADS = 8  # threads of each piece's read (load::read_range: C++, the GIL released)


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
    for small files), the last one ending at size (node/node_file.h)."""
    return _ferry.node_file_parts(size, ranks)


def piece_bytes(size: int) -> int:
    """The piece length of a file of `size` bytes: at least MIN_PIECE, 2 MiB
    multiples, at most MAX_PIECES pieces (node/node_file.h)."""
    return _ferry.node_file_piece_bytes(size)


class NodeFile:
    """A file in a node block: ``address`` (its first byte in this process),
    ``size``, ``block``, and this rank's ``stats`` (part, bytes_read,
    read_seconds, wait_seconds, made_block; complete after ``finish()``).
    ``pieces()`` yields its pieces as they come in; ``finish()`` waits for this
    rank's reads and every rank's; ``release()`` lets go of it (after
    stopping this rank's reads, if they still run). The protocol and the reads
    are C++ (``_ferry.NodeFileRead``: node/node_file.h)."""

    def __init__(self, pool, native, key):
        from ..node import NodeBlock

        self.pool, self._native, self.size, self.stats = pool, native, native.size, native.stats()
        self.block = pool._touched(NodeBlock(pool, native.handle, native.block_bytes, self.stats["made_block"], key))

    @property
    def address(self) -> int:
        return self.block.address + HEADER_BYTES

    def view(self) -> memoryview:
        return self.block.view()[HEADER_BYTES:HEADER_BYTES + self.size]

    def pieces(self):
        """(lo, hi) file byte ranges, in file order, each once every rank's bytes
        of it are in the block. NodeLoadTimeoutError after the load's timeout; this
        rank's own read error as soon as it happens."""
        native, step = self._live(), self._native.piece_bytes
        for p in range(native.piece_count):
            native.wait_piece(p)
            yield p * step, min((p + 1) * step, self.size)

    def finish(self) -> "NodeFile":
        """Waits until this rank's reads are done (raising their error) and every
        rank has read its part; fills in stats."""
        native = self._live()
        native.finish()
        self.stats = native.stats()
        return self

    def _live(self):
        if self._native is None:
            raise InvalidArgumentError("this NodeFile was released")
        return self._native

    def release(self) -> None:
        native, self._native = self._native, None
        if native is not None:
            native.release()  # stops this rank's reads, lets go of the block
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
    started (on a C++ thread): the caller takes the pieces as they come in
    (``NodeFile.pieces()``), then calls ``finish()``, and releases it."""
    timeout = check_node(pool, timeout)
    rank, ranks = node_ranks(rank, ranks)
    name = os.fsdecode(os.fspath(path))
    # InvalidArgumentError "NAME: not a regular file" for a FIFO, a device, a directory
    native = _ferry.NodeFileRead(name, name)
    try:
        key = round_key(pool.name, "load", native.identity)  # device, inode, size, mtime_ns
        native.join(pool._live("load_safetensors(node=)"), key, rank, ranks, timeout, _READ_THREADS)
        return NodeFile(pool, native, key)
    except BaseException:
        native.release()
        raise


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
