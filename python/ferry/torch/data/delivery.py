"""A worker's descriptor made into the batch the user gets.

``device="cpu"`` (``Delivery.device`` None): CPU tensors that are views of
the slot (pinned where there is a CUDA device). The slot comes back when the
last of them is garbage collected; copies queued by then on the current CUDA
stream (``x.to("cuda", non_blocking=True)`` and dropping ``x``: the usual
loop) complete before a worker writes the slot again: an event recorded on
that stream is waited for.
Copies on other streams are the user's to order, as with any pinned buffer.

``device="cuda:N"``: GPU tensors, each allocated on the loader's side stream
and copied there from the slot, every tensor of the batch in one ferry
``copy_many`` (``ferry.torch.transfer.copy_per_device``); the current stream
waits for the copy (an event), each tensor is recorded on the current stream
(so PyTorch's caching allocator does not reuse it early), and the slot comes
back when the copy's event has completed.
"""

from __future__ import annotations

import weakref

import torch

from ..transfer import copy_per_device
from ..containers import map_leaves
from .batch_layout import Batch, SlotWriter, TensorLeaf
from .slot_collate import leaf_nbytes, leaf_view
from .slots import Slot, SlotPool


def _is_leaf(x) -> bool:
    return isinstance(x, TensorLeaf)


def _release_after_cpu_use(slots: SlotPool, slot: Slot) -> None:
    """The batch's CPU tensors are gone: the slot is free once the copies
    queued on the current stream have read it."""
    event = None
    try:
        if torch.cuda.is_initialized():
            event = torch.cuda.Event(blocking=True)
            event.record()
    except Exception:  # pragma: no cover - a finalizer must not raise
        event = None
    slots.release(slot, event)


class Delivery:
    def __init__(self, slots: SlotPool, device):
        self.slots = slots
        self.device = device  # torch.device("cuda", N), or None for CPU batches
        self._stream = None

    def __call__(self, batch: Batch):
        slot = None if batch.slot_id is None else self.slots.slot(batch.slot_id)
        if batch.needed_bytes > batch.used_bytes or slot is None:
            batch, slot = self._rehome(batch, slot)
        if self.device is None:
            return self._on_cpu(batch, slot)
        return self._on_device(batch, slot)

    def _rehome(self, batch: Batch, slot: Slot | None):
        """A batch that did not fit its slot (the first one, before slots were
        sized; one larger than those before): slots grow to hold it, and it
        moves whole into a new one, so that it too is pinned and one piece.
        A copy in the main process, once per size."""
        import numpy as np

        self.slots.fit(batch.needed_bytes)
        new = self.slots.acquire()
        writer = SlotWriter(new.bytes)

        def move(leaf):
            region, offset = writer.take(leaf_nbytes(leaf))
            if leaf.data is not None:  # its bytes, copied as they are (no tensor made of them first)
                region.numpy()[:] = np.frombuffer(leaf.data, dtype=np.uint8)
            else:
                region.view(leaf.dtype).view(leaf.shape).copy_(leaf_view(leaf, slot.bytes))
            return TensorLeaf(offset, leaf.shape, leaf.dtype)

        tree = map_leaves(batch.tree, move, _is_leaf)
        if slot is not None:
            self.slots.release(slot)
        return Batch(batch.idx, new.id, tree, writer.used, writer.needed), new

    def _on_cpu(self, batch: Batch, slot: Slot):
        import numpy as np

        # A new array per batch: its life is the life of every tensor of the
        # batch (torch.from_numpy keeps it), so its finalizer frees the slot.
        owner = np.frombuffer(slot.buffer, dtype=np.uint8, count=slot.capacity)
        slot_bytes = torch.from_numpy(owner)
        tree = map_leaves(batch.tree, lambda leaf: leaf_view(leaf, slot_bytes), _is_leaf)
        weakref.finalize(owner, _release_after_cpu_use, self.slots, slot).atexit = False
        return tree

    def _on_device(self, batch: Batch, slot: Slot | None):
        device = self.device
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        slot_bytes = slot.bytes
        outs, srcs = [], []

        def target(leaf):
            dst = torch.empty(leaf.shape, dtype=leaf.dtype, device=device)
            outs.append(dst)
            srcs.append(leaf_view(leaf, slot_bytes))
            return dst

        with torch.cuda.stream(self._stream):
            tree = map_leaves(batch.tree, target, _is_leaf)
            # Its Copy is not kept: the sources are the slot, held until `event`
            # (recorded after the copy) has completed; the GPU tensors are freed in
            # stream order (recorded on the current stream below).
            copy_per_device(outs, srcs, stream=self._stream, wait=False)
            event = torch.cuda.Event(blocking=True)  # a wait for a slot sleeps instead of spinning a core
            event.record(self._stream)
        current.wait_event(event)
        for t in outs:
            t.record_stream(current)
        self.slots.release(slot, event)
        return tree
