"""How a worker gets the batch memory: each slot chunk's memfd, passed over a
Unix socket (SCM_RIGHTS), never opened through ``/proc/<pid>/fd`` (which a
main process that is not dumpable, as in hardened containers, closes to
processes without CAP_SYS_PTRACE).

One ``socketpair(AF_UNIX, SOCK_SEQPACKET)`` per worker, made before the worker
starts: the worker's end reaches it by inheritance (fork) or through
multiprocessing's reduction of sockets (spawn, forkserver), and the main
process closes its copy of that end once the worker has started.

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

Descriptors: the main process opens none per chunk (the pool owns its memfds);
a worker closes each one it receives and holds one per chunk it maps (Python's
mmap keeps a duplicate) until the chunk is forgotten; the sockets close with
their iterator.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct

# (generation, fd in the main process): the chunk's key
HEADER = struct.Struct("<qq")
# A send blocks only while the worker's socket buffer is full (it holds
# hundreds of these messages; a worker has at most a few unread).
SEND_TIMEOUT_S = 60.0


def socket_pair():
    """(main's end, the worker's end) for one worker."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class ChunkSender:
    """The main process's end of one worker's socket."""

    def __init__(self, sock, worker_id: int):
        self._sock = sock
        self._sock.settimeout(SEND_TIMEOUT_S)
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
            socket.send_fds(self._sock, [HEADER.pack(*key)], [slot.fd])
        except (BrokenPipeError, ConnectionResetError):
            return  # the worker is gone: PyTorch's checks report its death
        except OSError as e:
            raise RuntimeError(f"ferry DataLoader: cannot send the batch memory to worker {self._worker_id}: {e}") \
                from e
        self._sent.add(key)

    def close(self) -> None:
        self._sock.close()


class SlotMappings:
    """A worker's mappings of the main process's slot chunks, by chunk key."""

    def __init__(self, sock):
        self._sock = sock
        self._chunks: dict[tuple[int, int], object] = {}  # key -> uint8 tensor over the chunk
        self._generation = 0

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
        import torch

        try:
            data, fds, flags, _ = socket.recv_fds(self._sock, HEADER.size, 1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            raise RuntimeError(f"ferry DataLoader worker: the main process sent no descriptor for the batch "
                               f"memory chunk {wanted} before the task that needs it") from None
        try:
            if len(data) != HEADER.size or len(fds) != 1 or flags & socket.MSG_CTRUNC:
                raise RuntimeError(f"ferry DataLoader worker: a malformed batch memory message ({len(data)} bytes, "
                                   f"{len(fds)} descriptors, flags {flags:#x}) while waiting for chunk {wanted}")
            m = mmap.mmap(fds[0], os.fstat(fds[0]).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            for fd in fds:
                os.close(fd)
        self._chunks[HEADER.unpack(data)] = torch.frombuffer(m, dtype=torch.uint8)
