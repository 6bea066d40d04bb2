"""Collation straight into a slot, in the worker (or in the main process when
num_workers=0).

With the default ``collate_fn`` the batch is PyTorch's own ``collate`` walk with
one change: a list of tensors is stacked into the slot (``torch.stack(...,
out=view)``) where PyTorch stacks into a new shared-memory segment. The view
has the dtype ``torch.stack`` would give (the samples' dtypes promoted, as
``default_collate`` in the main process does; PyTorch's own workers stack into
the first sample's dtype, so ``[1.5, 1e-300]`` of float64 after a float32
sample would come back ``[1.5, 0.0]``), in every mode. Numbers, numpy arrays
and strings follow PyTorch's rules unchanged. A custom ``collate_fn`` runs as
it is; its tensors are then copied into the slot (conjugate and negative views
resolved first). Either way the result is a descriptor (``batch_layout``): the
structure with each CPU tensor replaced by a ``TensorLeaf``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.utils.data import default_collate

from .. import _torch_private as pt
from ..containers import map_leaves
from .batch_layout import SlotWriter, TensorLeaf


def _tensor_bytes(t) -> bytes:
    """A CPU tensor's bytes, contiguous (any dtype: bfloat16 and bool too)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


class SlotCollator:
    """Collates fetched samples into a SlotWriter's slot and returns the descriptor tree."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn
        self.stacks_into_slot = collate_fn is default_collate
        self._writer: SlotWriter | None = None
        self._map = pt.default_collate_fn_map()
        self._map[torch.Tensor] = self._stack

    def __call__(self, raw, writer: SlotWriter):
        """The descriptor tree of the batch made from `raw` (what the fetcher
        returned: a list of samples, or one sample without batching)."""
        self._writer = writer
        try:
            data = pt.collate(raw, self._map) if self.stacks_into_slot else self.collate_fn(raw)
            return self.pack(data, writer)
        finally:
            self._writer = None

    def _stack(self, batch, *, collate_fn_map=None):
        elem = batch[0]
        if elem.is_nested or elem.layout is not torch.strided or elem.device.type != "cpu":
            return pt.collate_tensors(batch, collate_fn_map)  # PyTorch's rules and errors
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in batch))  # torch.stack's result type
        shape = (len(batch), *elem.shape)
        nbytes = dtype.itemsize * math.prod(shape)
        if self._writer.fits(nbytes):  # else pack() counts it, once, and sends its bytes
            region, _ = self._writer.take(nbytes)
            try:
                return torch.stack(batch, 0, out=region.view(dtype).view(shape))
            except (RuntimeError, TypeError):
                pass  # mixed shapes, autograd: PyTorch's own stack says what is wrong
        return torch.stack(batch, 0)

    @staticmethod
    def pack(data, writer: SlotWriter):
        """data with each CPU tensor replaced by its TensorLeaf: in place where
        it already lies in the slot, else copied into the slot, else as bytes."""

        def leaf(t):
            if t.is_nested or t.layout is not torch.strided or t.device.type != "cpu":
                return t  # travels the way PyTorch pickles it
            t = t.resolve_conj().resolve_neg()  # the values, not the view's raw bytes
            shape = tuple(t.shape)
            if writer.holds(t) and t.is_contiguous():
                return TensorLeaf(t.data_ptr() - writer.base, shape, t.dtype)
            region, offset = writer.take(t.numel() * t.element_size())
            if region is None:
                return TensorLeaf(None, shape, t.dtype, _tensor_bytes(t))
            region.view(t.dtype).view(shape).copy_(t)
            return TensorLeaf(offset, shape, t.dtype)

        return map_leaves(data, leaf, lambda x: isinstance(x, torch.Tensor))


def leaf_nbytes(leaf: TensorLeaf) -> int:
    return math.prod(leaf.shape) * leaf.dtype.itemsize


def leaf_view(leaf: TensorLeaf, slot_bytes):
    """The CPU tensor of a leaf: a view of `slot_bytes` (the slot as a uint8
    tensor), or a new tensor holding the leaf's own bytes."""
    if leaf.data is None:
        n = leaf_nbytes(leaf)
        return slot_bytes[leaf.offset:leaf.offset + n].view(leaf.dtype).view(leaf.shape)
    if not leaf.data:
        return torch.empty(leaf.shape, dtype=leaf.dtype)
    return torch.frombuffer(bytearray(leaf.data), dtype=torch.uint8).view(leaf.dtype).view(leaf.shape)
