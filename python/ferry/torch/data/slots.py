"""The batches' memory, in the main process: slots of one memfd-backed ferry
pool, shared with the workers, pinned once.

Slots are allocations of a ``ferry.PinnedPool`` (``ferry.Pool`` where there
is no usable CUDA device) with ``memfd=True``: each chunk is registered with
CUDA once, when the pool makes it; a slot is recycled, never re-pinned. The
workers get each chunk's memfd through a socket (``chunk_passing``). A slot's
states and their transitions:

    free --acquire--> with a task --batch delivered--> held --released--> free
      ^                    |
      |                    | the iterator ended while the task was outstanding
      |                    v (sent to a worker, its result not received)
      +--writers exited-- quarantined

- held: by the GPU copy (device=...) until its event completes; by the CPU
  tensors (device="cpu") until they are garbage collected, then by the copies
  queued on the current stream, until its event.
- quarantined: a worker of an ended iterator may still write the slot (one
  that outlived PyTorch's shutdown: busy in ``__getitem__``, SIGTERM ignored).
  The slot stays out of use, with the worker processes that may write it,
  until they have all exited. ``acquire`` checks that (a ``waitpid`` that does
  not wait) and makes a new slot meanwhile: a new epoch never waits for a
  stale worker and never gets a slot one may still write.

Slots are made on demand: as many as tasks in flight (workers x
prefetch_factor) plus those held, so memory is bounded by what the loader and
the user hold, and reused across batches and epochs. Their size comes from the
first batch; a batch that needs more grows the size (by 1.25x over the largest
seen, a new ``generation`` and a new pool), and slots of older generations are
dropped as they come back. Within a generation, ``(generation, fd)`` names a
chunk for as long as it lives (the pool releases no chunk while it lives).

Fork: a SlotPool belongs to the process that made it. Used in a forked child
(``os.getpid()`` differs), it forgets the parent's pool and slots without
touching them (ferry's objects made before fork are inert in a child, and the
slots' memory is shared with the parent: the child must never write it) and
starts over with a new pool; a parent's slot released in the child is ignored.

Locking: ``_lock`` guards every field but ``_held``: capacity, generation,
``_pool``, ``_by_id``, ``_next_id``, ``_free``, ``_quarantined``, ``made``,
``_pid``. ``_held`` is a deque appended to without the lock (``release`` runs
in finalizers, which may run in a thread that holds ``_lock``) and popped from
the left by acquirers; each popped entry belongs to the thread that popped it.
No CUDA call (event query, synchronize, a pool's creation or allocation) runs
under the lock.
"""

from __future__ import annotations

import collections
import os
import threading

from ...errors import InternalError
from .batch_layout import align_up

# Slots start on a page; their chunks are 2 MiB multiples (the pool's granule).
SLOT_ALIGNMENT = 4096
CHUNK_GRANULE = 2 << 20
# A batch larger than the slots: the new size leaves this much room, so that a
# loader of growing batches (variable-length text) does not grow every batch.
GROWTH = 1.25


class Slot:
    __slots__ = ("id", "buffer", "bytes", "fd", "offset", "capacity", "generation", "pid")

    def __init__(self, id, buffer, bytes_view, fd, offset, capacity, generation):
        self.id, self.buffer, self.bytes = id, buffer, bytes_view
        self.fd, self.offset, self.capacity, self.generation = fd, offset, capacity, generation
        self.pid = os.getpid()

    @property
    def chunk(self) -> tuple[int, int]:
        """The key of the memfd chunk the slot lies in (see the module's docstring)."""
        return (self.generation, self.fd)

    def message(self):
        """What a worker needs to write into this slot (picklable, small); the
        chunk's memfd goes beforehand through the worker's socket."""
        return (self.id, self.generation, self.fd, self.offset, self.capacity)


def _let_go(slots) -> None:
    """Slots of an older size back to their pool (the pool goes with its last
    slot: a pinned one unregisters, so never under the lock)."""
    for slot in slots:
        slot.bytes = None  # the view exports the buffer: let it go first
        slot.buffer = None


def _exited(process) -> bool:
    try:
        return not process.is_alive()  # waitpid(WNOHANG) on a multiprocessing child
    except ValueError:  # closed: close() needs the process to have exited
        return True


class SlotPool:
    """Slots for one DataLoader (kept across its iterators and epochs, shared
    by the iterators of every thread).

    pinned_device: a function returning the CUDA device to pin on, or None for
    pageable shared memory; asked once per process (again in a forked child).
    """

    def __init__(self, pinned_device, expected_slots: int):
        self._pinned_device = pinned_device
        self.expected_slots = max(1, expected_slots)
        self.capacity: int | None = None  # bytes per slot; None until a batch sized it
        self.generation = 0  # grows with capacity; slots of older generations are dropped
        self.made = 0  # slots made, for stats and tests
        self._lock = threading.Lock()
        self._start_locked(pinned_device())

    def _start_locked(self, pinned_device) -> None:
        self.pinned_device = pinned_device  # int, or None: pageable
        self._pid = os.getpid()
        self._pool = None
        self._by_id: dict[int, Slot] = {}
        self._next_id = 0
        self._free: collections.deque = collections.deque()
        self._held: collections.deque = collections.deque()  # (slot, event or None)
        self._quarantined: list = []  # (slot, worker processes that may write it)

    def _start_over_if_forked(self) -> None:
        """In a forked child, the first call starts over (see the module).
        Preconditions: the lock is not held (the device is asked of CUDA)."""
        if self._pid == os.getpid():
            return
        pinned = self._pinned_device()
        with self._lock:
            if self._pid != os.getpid():
                self.generation += 1  # a parent's slot that came back anyway is of another size: dropped
                self._start_locked(pinned)  # the parent's pool and slots: forgotten, untouched

    # ---- sizing ---------------------------------------------------------

    def fit(self, needed_bytes: int) -> None:
        """Make later slots hold a batch of needed_bytes."""
        self._start_over_if_forked()
        with self._lock:
            if self.capacity is not None and needed_bytes <= self.capacity:
                return
            room = needed_bytes if self.capacity is None else int(needed_bytes * GROWTH)
            self.capacity = align_up(max(room, 1), SLOT_ALIGNMENT)
            self.generation += 1
            old, self._pool = self._pool, None  # the next slot comes from a pool sized for the new capacity
        del old  # outside the lock: a pinned pool unregisters when its last slot is gone

    # ---- acquire (any thread) -------------------------------------------

    def acquire(self) -> Slot:
        """A free slot of the current size (at least as large as the last
        fit()): one given back, else one whose holder's copies completed, else
        the oldest held by a GPU copy (waited for), else a new one.
        Preconditions: a batch sized the slots (fit)."""
        self._start_over_if_forked()
        while True:
            self._collect_completed()
            dropped = []
            with self._lock:
                if self._quarantined:
                    self._lift_quarantine_locked()
                slot = self._pop_free_locked(dropped)
                plan = (self._pool, self.capacity, self.generation)
            _let_go(dropped)
            if slot is not None:
                return slot
            if not self._wait_for_oldest_copy():
                return self._new_slot(*plan)

    def _pop_free_locked(self, dropped: list) -> Slot | None:
        """A free slot of the current generation; older ones go to `dropped`."""
        while self._free:
            slot = self._free.popleft()
            if slot.generation == self.generation:
                return slot
            self._by_id.pop(slot.id, None)
            dropped.append(slot)
        return None

    def _collect_completed(self) -> None:
        """Held slots whose copies completed become free (event queries: no lock)."""
        done = []
        for _ in range(len(self._held)):
            try:
                slot, event = self._held.popleft()
            except IndexError:  # another thread took the rest
                break
            if event is not None and not event.query():
                self._held.appendleft((slot, event))
                break
            done.append(slot)
        if done:
            with self._lock:
                self._free.extend(s for s in done if s.pid == self._pid)

    def _wait_for_oldest_copy(self) -> bool:
        """Waits for the oldest slot held by a copy and frees it; False when none is."""
        try:
            slot, event = self._held.popleft()
        except IndexError:
            return False
        if event is not None:
            event.synchronize()
        with self._lock:
            if slot.pid == self._pid:
                self._free.appendleft(slot)
        return True

    def _new_slot(self, pool, capacity: int, generation: int) -> Slot:
        import torch

        if pool is None:
            pool = self._install_pool(capacity, generation)
        # huge=False: the exact size (a huge allocation is rounded to 2 MiB, and
        # expected_slots of them would no longer fit the chunk).
        buf = pool.alloc(capacity, alignment=SLOT_ALIGNMENT, huge=False)
        where = pool.shared_location(buf)
        if where is None:  # pragma: no cover - the pool is memfd-backed
            raise InternalError("ferry DataLoader: a slot is not in shared memory")
        view = torch.frombuffer(buf, dtype=torch.uint8)
        with self._lock:
            slot = Slot(self._next_id, buf, view, where[0], where[1], capacity, generation)
            self._next_id += 1
            self._by_id[slot.id] = slot
            self.made += 1
        return slot

    def _install_pool(self, capacity: int, generation: int):
        """The pool of `generation`: made without the lock (a pinned pool
        registers with CUDA), installed unless another thread was first."""
        pool = self._make_pool(capacity)
        with self._lock:
            if self.generation != generation:
                return pool  # sized for an older generation: serves this one slot, then goes with it
            if self._pool is None:
                self._pool = pool
            return self._pool

    def _make_pool(self, capacity: int):
        """The expected slots in one chunk (the target: one mapping, one
        registration, made at once); a slot beyond them gets a chunk of its own,
        so memory follows the slots in use."""
        from ...pool import PinnedPool, Pool

        options = dict(memfd=True, release_delay_ms=0, chunk_bytes=align_up(capacity, CHUNK_GRANULE),
                       target_bytes=align_up(capacity * self.expected_slots, CHUNK_GRANULE), target_huge=False)
        if self.pinned_device is None:
            return Pool(**options)
        return PinnedPool(device=self.pinned_device, **options)

    def _lift_quarantine_locked(self) -> None:
        still = []
        for slot, writers in self._quarantined:
            if all(_exited(w) for w in writers):
                self._free.append(slot)
            else:
                still.append((slot, writers))
        self._quarantined = still

    def slot(self, slot_id: int) -> Slot:
        return self._by_id[slot_id]

    # ---- give back (any thread) -----------------------------------------

    def release(self, slot: Slot, event=None) -> None:
        """slot is free once `event` (a torch.cuda.Event, or None: now) completed.
        Takes no lock: it runs in finalizers."""
        if slot.pid == os.getpid():  # a parent's slot released in a forked child: not ours
            self._held.append((slot, event))

    def quarantine(self, slot: Slot, writers) -> None:
        """slot may still be written by `writers` (multiprocessing processes: the
        workers of an ended iterator): out of use until they have all exited."""
        with self._lock:
            if slot.pid == self._pid:
                self._quarantined.append((slot, tuple(writers)))

    def stats(self) -> dict:
        self._start_over_if_forked()
        with self._lock:
            if self._quarantined:
                self._lift_quarantine_locked()
            return {"capacity": self.capacity, "slots": len(self._by_id), "free": len(self._free),
                    "held": len(self._held), "quarantined": len(self._quarantined), "made": self.made,
                    "pinned": self.pinned_device is not None}
