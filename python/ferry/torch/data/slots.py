"""The batches' memory: slots of one memfd-backed ferry pool, shared with the
workers, pinned once in the main process.

Main process (``SlotPool``): slots are allocations of a ``ferry.PinnedPool``
(``ferry.Pool`` where there is no CUDA device) with ``memfd=True``: each chunk is
registered with CUDA once, when the pool makes it; a slot is recycled, never
re-pinned. A slot's life:

    free --acquire--> with a task --batch delivered--> held --released--> free
                                                        |
            (device=...: by the GPU copy, until its event completes;
             device=None: by the CPU tensors, until they are garbage collected,
             then by the copies queued on the current stream, until its event)

Slots are made on demand: as many as tasks in flight (workers x
prefetch_factor) plus those held, so memory is bounded by what the loader and
the user hold, and reused across batches and epochs. Their size comes from the
first batch; a batch that needs more grows the size (by 1.25x over the largest
seen), and slots of the old size are dropped as they come back.

Worker process (``SlotMappings``): maps a slot's chunk through
``/proc/<main pid>/fd/<fd>`` (any start method: fork, spawn, forkserver),
once per chunk, and writes the batch there.

Threads: only the main thread acquires; releases come from any thread (a
tensor's finalizer runs where its last reference goes). ``_free`` and
``_held`` are deques: append and popleft are atomic in CPython, so no lock is
needed, and no CUDA call (event record, query, synchronize) runs under one.
"""

from __future__ import annotations

import collections
import mmap
import os

from .batch_layout import align_up

# Slots start on a page; their chunks are 2 MiB multiples (the pool's granule).
SLOT_ALIGNMENT = 4096
CHUNK_GRANULE = 2 << 20
# A batch larger than the slots: the new size leaves this much room, so that a
# loader of growing batches (variable-length text) does not grow every batch.
GROWTH = 1.25


class Slot:
    __slots__ = ("id", "buffer", "bytes", "fd", "offset", "capacity", "generation")

    def __init__(self, id, buffer, bytes_view, fd, offset, capacity, generation):
        self.id, self.buffer, self.bytes = id, buffer, bytes_view
        self.fd, self.offset, self.capacity, self.generation = fd, offset, capacity, generation

    def message(self, pid: int):
        """What a worker needs to write into this slot (picklable, small)."""
        return (self.id, self.generation, pid, self.fd, self.offset, self.capacity)


class SlotPool:
    """Slots for one DataLoader (kept across its iterators and epochs)."""

    def __init__(self, pinned_device: int | None, expected_slots: int):
        self.pinned_device = pinned_device  # None: pageable shared memory (no CUDA device)
        self.expected_slots = max(1, expected_slots)
        self.capacity: int | None = None  # bytes per slot; None until a batch sized it
        self.generation = 0  # grows with capacity; slots of older generations are dropped
        self._pool = None
        self._by_id: dict[int, Slot] = {}
        self._next_id = 0
        self._free: collections.deque = collections.deque()
        self._held: collections.deque = collections.deque()  # (slot, event or None)
        self.grown = 0  # slots made, for stats and tests

    # ---- sizing ---------------------------------------------------------

    def fit(self, needed_bytes: int) -> None:
        """Make later slots hold a batch of needed_bytes."""
        if self.capacity is not None and needed_bytes <= self.capacity:
            return
        room = needed_bytes if self.capacity is None else int(needed_bytes * GROWTH)
        self.capacity = align_up(max(room, 1), SLOT_ALIGNMENT)
        self.generation += 1
        self._pool = None  # the next slot comes from a pool sized for the new capacity

    # ---- the main thread ------------------------------------------------

    def acquire(self) -> Slot:
        """A free slot of the current size: one given back, else one whose
        holder's copies completed, else the oldest held by a GPU copy (waited
        for), else a new one."""
        while True:
            self._collect_completed()
            while self._free:
                slot = self._free.popleft()
                if slot.generation == self.generation:
                    return slot
                self._drop(slot)
            if self._held and self._held[0][1] is not None:
                slot, event = self._held.popleft()
                event.synchronize()
                self._free.appendleft(slot)
                continue
            return self._new_slot()

    def _collect_completed(self) -> None:
        for _ in range(len(self._held)):
            slot, event = self._held[0]
            if event is not None and not event.query():
                return
            self._held.popleft()
            self._free.append(slot)

    def _new_slot(self) -> Slot:
        import torch

        if self._pool is None:
            self._pool = self._make_pool(align_up(self.capacity * self.expected_slots, CHUNK_GRANULE))
        # huge=False: the exact size (a huge allocation is rounded to 2 MiB, and
        # expected_slots of them would no longer fit the chunk).
        buf = self._pool.alloc(self.capacity, alignment=SLOT_ALIGNMENT, huge=False)
        where = self._pool.shared_location(buf)
        if where is None:  # pragma: no cover - the pool is memfd-backed
            raise RuntimeError("ferry DataLoader: a slot is not in shared memory")
        slot = Slot(self._next_id, buf, torch.frombuffer(buf, dtype=torch.uint8), where[0], where[1],
                    self.capacity, self.generation)
        self._next_id += 1
        self._by_id[slot.id] = slot
        self.grown += 1
        return slot

    def _make_pool(self, chunk_bytes: int):
        from ...pool import PinnedPool, Pool

        options = dict(memfd=True, chunk_bytes=chunk_bytes, release_delay_ms=0)
        if self.pinned_device is None:
            return Pool(**options)
        return PinnedPool(device=self.pinned_device, **options)

    def _drop(self, slot: Slot) -> None:
        self._by_id.pop(slot.id, None)
        slot.bytes = None  # the view exports the buffer: let it go first
        slot.buffer = None  # back to its pool; the pool goes with its last slot

    def slot(self, slot_id: int) -> Slot:
        return self._by_id[slot_id]

    # ---- any thread ------------------------------------------------------

    def release(self, slot: Slot, event=None) -> None:
        """slot is free once `event` (a torch.cuda.Event, or None: now) completed."""
        self._held.append((slot, event))

    def stats(self) -> dict:
        return {"capacity": self.capacity, "slots": len(self._by_id), "free": len(self._free),
                "held": len(self._held), "made": self.grown, "pinned": self.pinned_device is not None}


class SlotMappings:
    """A worker's mappings of the main process's slot chunks, by chunk."""

    def __init__(self):
        self._chunks: dict[tuple[int, int], object] = {}  # (generation, fd) -> uint8 tensor over the chunk
        self._generation = 0

    def slot_bytes(self, message):
        """The slot of a task message (Slot.message) as a uint8 tensor."""
        import torch

        _id, generation, pid, fd, offset, capacity = message
        if generation > self._generation:  # slots of older sizes never come again
            self._chunks.clear()
            self._generation = generation
        chunk = self._chunks.get((generation, fd))
        if chunk is None:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                f = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as e:
                raise RuntimeError(f"ferry DataLoader worker: cannot open the shared batch memory {path}: {e}") from e
            try:
                m = mmap.mmap(f, os.fstat(f).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(f)
            chunk = self._chunks[(generation, fd)] = torch.frombuffer(m, dtype=torch.uint8)
        return chunk[offset:offset + capacity]
