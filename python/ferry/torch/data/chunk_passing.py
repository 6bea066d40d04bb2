"""How a worker gets the batch memory: each slot chunk's memfd, passed over a
Unix socket (SCM_RIGHTS), never opened through ``/proc/<pid>/fd`` (which a
main process that is not dumpable, as in hardened containers, closes to
processes without CAP_SYS_PTRACE).

One ``socketpair(AF_UNIX, SOCK_SEQPACKET)`` per worker (``_ferry.packet_socket_pair``:
src/os/unix_socket.h, the same calls as the node pool's), made before the worker
starts: the worker's end reaches it by inheritance (fork) or through
multiprocessing's descriptor passing (spawn, forkserver: ``DupFd``, registered
below as multiprocessing registers it for sockets), and the main process closes
its copy of that end once the worker has started.

The protocol, one message per chunk: before the main process queues a task
whose slot lies in a chunk that worker has not been sent, it sends the chunk's
fd with a header (the chunk's key: generation, fd number in the main process).
The send completes before the task is queued, so the worker, on a task whose
chunk it has not mapped, reads messages (without waiting: they are there) until
it has that key; it maps each chunk it receives and closes the fd at once.

Forgetting, the same rule on both ends, so that each knows what the other
holds: on a task of a newer generation (slots grew), chunks of older
generations are forgotten (``ChunkSender`` when it sends the task, the worker
when it takes it; a worker's queue is FIFO). A chunk needed again after that
(an older slot still in use) is simply sent again.

A slot given later: the first tasks of a loader go out before any batch has
sized the slots (all of PyTorch's first window at once, so that the workers
fetch what PyTorch's would: a dataset sees the same ``__getitem__`` calls).
The first is collated as bytes; each of the others carries a ``SlotLater``
token, and its worker, once it fetched the samples, waits on its socket for
the token's assignment (``ASSIGN``): a slot (its chunk's fd sent before, as
above), ``BYTES`` (collate as bytes: no size known yet) or ``DROP`` (the
iterator ended or started a new epoch: send nothing). The main process sends
the assignments, in task order, when the first result comes back, before any
later task; a worker keeps assignments it read while looking for a chunk, and
forgets those of tokens older than the one it waits for (tasks it skipped).

Descriptors: the main process opens none per chunk (the pool owns its memfds);
a worker closes each one it receives at once (its ``_ferry.Mapping`` keeps the
memory, not the descriptor) and unmaps a chunk once it is forgotten and its
tensors are gone; the sockets close with their iterator. Every system call is
src/os's, through ``_ferry``.
"""

from __future__ import annotations

import struct
from multiprocessing import reduction

from ... import _ferry

from ...errors import DataLoaderError

# (generation, fd in the main process): the chunk's key, with the chunk's fd
HEADER = struct.Struct("<qq")
# A task's slot given later: (token, state, slot id, generation, fd, offset, capacity)
ASSIGN = struct.Struct("<qqqqqqq")
SLOT, BYTES, DROP = 0, 1, 2
DROPPED = object()  # SlotMappings.slot_later's answer for DROP
RECV_BYTES = 64  # more than either message: a longer one is malformed (MSG_TRUNC)
# A send blocks only while the worker's socket buffer is full (it holds
# hundreds of these messages; a worker has at most a few unread).
SEND_TIMEOUT_S = 60.0


class SlotLater:
    """A task's slot message, for a task sent before the slots were sized:
    the worker fetches, then waits for the token's assignment."""

    __slots__ = ("token",)

    def __init__(self, token: int):
        self.token = token

    def __getstate__(self):
        return self.token

    def __setstate__(self, token):
        self.token = token


def socket_pair():
    """(main's end, the worker's end) for one worker: two ``_ferry.PacketSocket``."""
    return _ferry.packet_socket_pair()


def _rebuild_socket(dup):
    return _ferry.PacketSocket(dup.detach())


def _reduce_socket(sock):
    """A worker's end for a spawned worker: its descriptor passed as multiprocessing
    passes a socket's (``reduction.DupFd``)."""
    return _rebuild_socket, (reduction.DupFd(sock.fileno()),)


reduction.register(_ferry.PacketSocket, _reduce_socket)


class ChunkSender:
    """The main process's end of one worker's socket."""

    def __init__(self, sock, worker_id: int):
        self._sock = sock
        self._worker_id = worker_id
        self._sent: set[tuple[int, int]] = set()
        self._generation = 0

    def before_task(self, slot) -> None:
        """Makes sure the worker has (or will read before the task) the chunk of `slot`.
        Preconditions: called before the task naming slot is queued."""
        if slot.generation > self._generation:  # the worker forgets older chunks at this task
            self._sent = {key for key in self._sent if key[0] >= slot.generation}
            self._generation = slot.generation
        key = slot.chunk
        if key in self._sent:
            return
        try:
            if not self._sock.send(HEADER.pack(*key), slot.fd, SEND_TIMEOUT_S):
                return  # the worker is gone: PyTorch's checks report its death
        except OSError as e:
            raise DataLoaderError(f"ferry DataLoader: cannot send the batch memory to worker {self._worker_id}: {e}") \
                from e
        self._sent.add(key)

    def assign(self, token: int, slot=None, state: int = SLOT) -> None:
        """The assignment of a SlotLater task: `slot` (state SLOT), or the state
        BYTES or DROP. Preconditions: the assignments of this worker's earlier
        tokens were sent, and no task after this one was queued with a slot."""
        if state == SLOT:
            self.before_task(slot)
            message = ASSIGN.pack(token, SLOT, slot.id, slot.generation, slot.fd, slot.offset, slot.capacity)
        else:
            message = ASSIGN.pack(token, state, -1, 0, -1, 0, 0)
        try:
            self._sock.send(message, -1, SEND_TIMEOUT_S)  # False: the worker is gone, nothing waits for it
        except OSError as e:
            raise DataLoaderError(f"ferry DataLoader: cannot send a slot to worker {self._worker_id}: {e}") from e

    def close(self) -> None:
        self._sock.close()


class SlotMappings:
    """A worker's mappings of the main process's slot chunks, by chunk key."""

    def __init__(self, sock):
        self._sock = sock
        self._chunks: dict[tuple[int, int], object] = {}  # key -> uint8 tensor over the chunk
        self._generation = 0
        self._assigned: dict[int, tuple] = {}  # token -> (state, slot message or None), read ahead

    def slot_later(self, token: int, stop, interval: float):
        """The slot message of a SlotLater task (as Slot.message), None (collate
        as bytes), or DROPPED (send nothing). Waits on the socket; stop() is asked
        every `interval` seconds and a True makes it DROP (the iterator ended,
        the main process died), as does the main process closing its end."""
        while token not in self._assigned:
            got = self._read_one(None, interval)
            if got is None:  # nothing within the interval
                if stop():
                    return DROPPED
                continue
            if not got:
                return DROPPED  # end of file: the main process closed the socket
        for t in [t for t in self._assigned if t < token]:
            del self._assigned[t]  # tasks this worker skipped
        state, message = self._assigned.pop(token)
        return message if state == SLOT else (None if state == BYTES else DROPPED)

    def slot_bytes(self, message):
        """The slot of a task message (Slot.message) as a uint8 tensor."""
        _id, generation, fd, offset, capacity = message
        if generation > self._generation:  # the main process forgot older chunks at this task too
            self._chunks = {key: c for key, c in self._chunks.items() if key[0] >= generation}
            self._generation = generation
        key = (generation, fd)
        while key not in self._chunks:
            self._receive(key)
        return self._chunks[key][offset:offset + capacity]

    def _receive(self, wanted) -> None:
        if self._read_one(wanted, 0):
            return
        raise DataLoaderError(f"ferry DataLoader worker: the main process sent no descriptor for the batch "
                              f"memory chunk {wanted} before the task that needs it")

    def _read_one(self, wanted, timeout: float):
        """Reads one message, waiting at most `timeout` seconds: a chunk (mapped)
        or an assignment (kept): True; False at end of file; None when none came.
        wanted: the chunk being looked for, for messages."""
        import torch

        got = self._sock.receive(RECV_BYTES, timeout)
        if got is None:
            return None
        data, fd, truncated = got
        try:
            if not data and fd < 0:
                return False
            if len(data) == ASSIGN.size and fd < 0 and not truncated:
                token, state, *slot = ASSIGN.unpack(data)
                self._assigned[token] = (state, tuple(slot) if state == SLOT else None)
                return True
            if len(data) != HEADER.size or fd < 0 or truncated:
                raise DataLoaderError(f"ferry DataLoader worker: a malformed batch memory message ({len(data)} bytes, "
                                      f"{'a' if fd >= 0 else 'no'} descriptor{', truncated' if truncated else ''}) "
                                      f"while waiting for chunk {wanted}")
            key = HEADER.unpack(data)
            m = _ferry.Mapping.shared(fd)
        finally:
            if fd >= 0:
                _ferry.close_descriptor(fd)
        self._chunks[key] = torch.frombuffer(m, dtype=torch.uint8)
        return True
