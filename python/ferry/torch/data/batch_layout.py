"""A batch laid out in a slot: what a worker writes and what crosses the queue.

A worker collates a batch straight into its slot (``SlotWriter``: aligned
ranges bumped from the slot's start) and sends only a descriptor: the batch's
structure with each tensor replaced by a ``TensorLeaf`` (offset, shape,
dtype). The main process walks the same structure back (``map_leaves``) and
makes each leaf a view of the slot, or a GPU tensor copied from it.

A tensor that does not fit in the slot (the first batch, before slots are sized;
a batch larger than the ones before) travels as bytes in its leaf instead
(``TensorLeaf.data``): correct, slower, and the main process sizes later slots
from ``Batch.needed_bytes``.

Structures are walked the way PyTorch's ``pin_memory`` walks them
(``ferry.torch.containers.map_leaves``): mappings, named tuples, tuples,
sequences; anything else is a leaf that is passed as it is (and pickled by
PyTorch's own rules).
"""

from __future__ import annotations

# Each tensor starts on this boundary in its slot: any dtype's view is aligned,
# and no two tensors share a cache line.
LEAF_ALIGNMENT = 64


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class TensorLeaf:
    """One tensor of a batch: at ``offset`` in the batch's slot, or in ``data``
    (bytes) when it did not fit."""

    __slots__ = ("offset", "shape", "dtype", "data")

    def __init__(self, offset, shape, dtype, data=None):
        self.offset, self.shape, self.dtype, self.data = offset, shape, dtype, data

    def __getstate__(self):
        return (self.offset, self.shape, self.dtype, self.data)

    def __setstate__(self, state):
        self.offset, self.shape, self.dtype, self.data = state


class Batch:
    """What a worker sends for one task: the slot it wrote, the structure with
    TensorLeafs, the bytes used in the slot and the bytes the whole batch needs."""

    __slots__ = ("idx", "slot_id", "tree", "used_bytes", "needed_bytes")

    def __init__(self, idx, slot_id, tree, used_bytes, needed_bytes):
        self.idx, self.slot_id, self.tree = idx, slot_id, tree
        self.used_bytes, self.needed_bytes = used_bytes, needed_bytes

    def __getstate__(self):
        return (self.idx, self.slot_id, self.tree, self.used_bytes, self.needed_bytes)

    def __setstate__(self, state):
        self.idx, self.slot_id, self.tree, self.used_bytes, self.needed_bytes = state


class WorkerFailure:
    """A task that raised in the worker: the slot it held, and torch's
    ExceptionWrapper (re-raised in the main process with the worker's traceback)."""

    __slots__ = ("idx", "slot_id", "error")

    def __init__(self, idx, slot_id, error):
        self.idx, self.slot_id, self.error = idx, slot_id, error

    def __getstate__(self):
        return (self.idx, self.slot_id, self.error)

    def __setstate__(self, state):
        self.idx, self.slot_id, self.error = state


class SlotWriter:
    """Bump allocation of aligned ranges in one slot (a uint8 tensor), or in
    none (``slot=None``: every tensor overflows into bytes). ``needed`` counts
    what the batch would take in a slot, fitting or not."""

    def __init__(self, slot):
        self.slot = slot
        self.capacity = 0 if slot is None else slot.numel()
        self.base = 0 if slot is None else slot.data_ptr()
        self.used = 0
        self.needed = 0

    def take(self, nbytes: int):
        """A uint8 view of nbytes in the slot and its offset, or None when it
        does not fit."""
        start = align_up(self.needed, LEAF_ALIGNMENT)
        self.needed = start + nbytes
        if self.slot is None:
            return None, None
        begin = align_up(self.used, LEAF_ALIGNMENT)
        if begin + nbytes > self.capacity:
            return None, None  # later, smaller tensors may still fit
        self.used = begin + nbytes
        return self.slot[begin:begin + nbytes], begin

    def fits(self, nbytes: int) -> bool:
        """Whether take(nbytes) would find room (counts nothing)."""
        return self.slot is not None and align_up(self.used, LEAF_ALIGNMENT) + nbytes <= self.capacity

    def holds(self, tensor) -> bool:
        """Whether tensor's bytes lie inside this writer's slot."""
        if self.slot is None:
            return False
        p = tensor.data_ptr()
        return self.base <= p and p + tensor.numel() * tensor.element_size() <= self.base + self.capacity
