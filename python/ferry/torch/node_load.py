"""Read once per node: ``load_safetensors(..., node=pool)``.

Every rank of a node calls the load with the same files. For each file, one
named block of the node pool (``ferry.node.NodePool``) holds a 4 KiB page of
signal words and then the file's bytes; each of the ``ranks`` processes reads
its contiguous part of the file into it (``read_file_once``), all wait until
every part is in, and then each rank copies the tensors it wants from the
block to its GPU (``copy_from_block``: one ``ferry.copy_many``). The block is
freed when the last rank lets go of it, so no second barrier is needed.

The signal words start at zero: the pool zeroes a named block's first 4 KiB
when it makes it. The rank that made the block writes the number of ranks
there last; the others wait for it before they trust the words.

Keys: a hash of the file's identity (device, inode, size, mtime) and this
process's count of node loads of that file, so a new load never joins the
signal words of an earlier one (calls are collective: every rank counts the
same). A rank that dies, or never comes, makes the others fail after
``timeout`` seconds with NodeLoadTimeout (how many ranks arrived); none hangs.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import _args
from ..errors import FerryError, InvalidArgumentError

HEADER_BYTES = 4096  # the block's first page: signal words; the file starts after it
DEFAULT_TIMEOUT = 600.0  # seconds a rank waits for the others (a slow disk, a big shard)
MAX_RANKS = 1000  # one claim word per rank fits the header page
_READ_CHUNK = 32 << 20  # one os.preadv; a rank's part is read by several threads
_READ_THREADS = 8

# signal words (32-bit) of the header page
_W_RANKS = 1  # set by the block's maker: the ranks taking part
_W_ARRIVED = 2  # each rank adds 1 once its part is in the block
_W_CLAIM = 8  # word _W_CLAIM + r: rank r took its part (a rank given twice is refused)


class NodeLoadTimeout(FerryError, TimeoutError):
    """Ranks of a node load did not all arrive within the timeout."""


_rounds: dict = {}  # (pool name, file identity) -> node loads of it started by this process
_rounds_lock = threading.Lock()


def _next_round(pool_name: str, identity: tuple) -> int:
    with _rounds_lock:
        n = _rounds.get((pool_name, identity), 0)
        _rounds[(pool_name, identity)] = n + 1
        return n


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
    """node must be a ferry.node.NodePool; the timeout in seconds (> 0)."""
    from ..node import NodePool

    if not isinstance(node, NodePool):
        raise InvalidArgumentError(f"node={_args.quote(node)}: expected a ferry.node.NodePool (or None)")
    if node._native is None:
        raise InvalidArgumentError(f"node={node!r}: the pool is closed")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"timeout={_args.quote(timeout)}: expected seconds > 0")
    return float(timeout)


def parts(size: int, ranks: int) -> list[int]:
    """The ranks+1 bounds of the file's parts: contiguous, 2 MiB aligned (4 KiB
    for small files), the last one ending at size."""
    align = (2 << 20) if size >= ranks * (8 << 20) else 4096
    return [size * r // ranks // align * align for r in range(ranks)] + [size]


class NodeFile:
    """A file in a node block: ``address`` (its first byte in this process),
    ``size``, ``block``, and this rank's ``stats`` (part, bytes_read,
    read_seconds, wait_seconds, made_block). ``release()`` lets go of it."""

    def __init__(self, pool, block, size, stats):
        self.pool, self.block, self.size, self.stats = pool, block, size, stats

    @property
    def address(self) -> int:
        return self.block.address + HEADER_BYTES

    def view(self) -> memoryview:
        return self.block.view()[HEADER_BYTES:HEADER_BYTES + self.size]

    def release(self) -> None:
        if self.block is not None:
            self.pool.free(self.block)
            self.block = None


def read_file_once(pool, path, rank: int, ranks: int, *, timeout: float = DEFAULT_TIMEOUT) -> NodeFile:
    """Collective: every one of `ranks` processes of the node calls it with the
    same file; each reads its part into one named block of `pool` and returns
    once all parts are in (NodeLoadTimeout after `timeout` seconds). The
    caller releases the returned NodeFile."""
    timeout = check_node(pool, timeout)
    rank, ranks = node_ranks(rank, ranks)
    name = os.fsdecode(os.fspath(path))
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        digest = hashlib.blake2b(repr(identity).encode(), digest_size=16).hexdigest()
        key = f"ferry.load:{digest}:{_next_round(pool.name, identity)}"
        block = pool.named(key, HEADER_BYTES + st.st_size)
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
            bounds = parts(st.st_size, ranks)
            lo, hi = bounds[rank], bounds[rank + 1]
            t0 = time.monotonic()
            _read_part(fd, name, block.view(), lo, hi)
            t1 = time.monotonic()
            if os.fstat(fd).st_mtime_ns != st.st_mtime_ns:
                raise InvalidArgumentError(f"{name}: the file changed while it was read; load it again")
            pool.add(block, _W_ARRIVED)
            left = max(0.0, deadline - time.monotonic())
            if not pool.wait(block, _W_ARRIVED, ranks, left):
                arrived = pool.value(block, _W_ARRIVED)
                raise NodeLoadTimeout(
                    f"{name}: {arrived} of {ranks} ranks had read their part after {timeout:g} s (a rank died, "
                    "did not call the load, or reads slowly); every rank of the node must call it with the same "
                    "files (a larger timeout= waits longer)")
            stats = {"part": (lo, hi), "bytes_read": hi - lo, "read_seconds": t1 - t0,
                     "wait_seconds": time.monotonic() - t1, "made_block": block.created}
            return NodeFile(pool, block, st.st_size, stats)
        except BaseException:
            pool.free(block)
            raise
    finally:
        os.close(fd)


def _read_part(fd: int, name: str, view: memoryview, lo: int, hi: int) -> None:
    """Reads bytes [lo, hi) of the file into view[HEADER_BYTES + lo:], in chunks on
    threads (os.preadv releases the GIL)."""
    chunks = [(o, min(o + _READ_CHUNK, hi)) for o in range(lo, hi, _READ_CHUNK)]

    def read(chunk):
        a, b = chunk
        while a < b:
            n = os.preadv(fd, [view[HEADER_BYTES + a:HEADER_BYTES + b]], a)
            if n == 0:
                raise InvalidArgumentError(f"{name}: ends at byte {a}, before {b} (the file shrank while it was read)")
            a += n

    if len(chunks) <= 1:
        for c in chunks:
            read(c)
        return
    with ThreadPoolExecutor(min(_READ_THREADS, len(chunks)), thread_name_prefix="ferry-node-read") as ex:
        for f in [ex.submit(read, c) for c in chunks]:
            f.result()


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
