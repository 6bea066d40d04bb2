"""Tensors, and any nesting of dicts, lists and tuples of them (a state_dict, a
batch), to and from the GPU by ferry's engine in ONE call per GPU: every tensor
of the structure on that GPU moves through one pipelined copy
(``ferry.copy_many``, which serves one device a call: ``copy_per_device``
groups the tensors), so the CPU copy of one tensor overlaps the DMA of the one
before and small tensors share staging chunks.

The structure comes back with the same keys, order, container types
(dict subclasses such as OrderedDict, lists, tuples, named tuples), shapes,
dtypes and strides of contiguous tensors; leaves that are not tensors are
returned as they are.
"""

from __future__ import annotations

import threading

from ._torch import torch_module as _torch
from .containers import leaves_of, map_leaves
from .devices import cuda_device, with_index

_pending_lock = threading.Lock()
_pending: list = []  # async copies whose tensors must stay alive until done


class HostTarget:
    """Base of the objects ``to_host(out=)`` fills through their ``tensors``
    (host tensors of obj's shape): ``ferry.torch.Snapshot``. An explicit base,
    so that no other object with a ``tensors`` attribute is taken for one, and
    so that transfer imports nothing of the snapshot (which imports it)."""

    tensors: dict


def _keep_until_done(c) -> None:
    with _pending_lock:
        _pending[:] = [p for p in _pending if not p.done]
        _pending.append(c)


class _Slot:
    """A tensor's place in the template: its index in the leaves."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _flatten(obj, torch, leaves: list):
    """A template of obj: each tensor replaced by its _Slot in `leaves` (appended
    in order), containers (dict, list, tuple: ferry.torch.containers) kept."""

    def take(t):
        leaves.append(t)
        return _Slot(len(leaves) - 1)

    return map_leaves(obj, take, lambda x: isinstance(x, torch.Tensor), any_container=False)


def _build(template, out: list):
    """The template with each _Slot replaced by out[index]."""
    return map_leaves(template, lambda slot: out[slot.index], lambda x: isinstance(x, _Slot), any_container=False)


def copy_per_device(dsts, srcs, *, stream=None, wait: bool = True) -> list:
    """dsts[i] <- srcs[i] (contiguous tensors of equal byte size, one of each
    pair on a GPU) in ONE ferry copy_many call per GPU: the native call serves
    one device (copy_bindings.cpp), so the pairs are grouped by the GPU they
    touch, keeping their order. Each call runs on `stream` (a torch.cuda.Stream,
    for pairs of one GPU) or else on that GPU's current torch stream. Empty
    tensors are skipped. wait=False: returns each call's ``ferry.Copy`` once
    queued; the caller keeps the tensors alive until it is done (a Copy kept
    does that)."""
    from ..copy import copy_many, copy_many_async

    torch = _torch()
    groups: dict = {}
    for d, s in zip(dsts, srcs):
        if d.numel():
            ds, ss = groups.setdefault(d.device if d.is_cuda else s.device, ([], []))
            ds.append(d)
            ss.append(s)
    if stream is not None and len(groups) > 1:
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(f"copy_per_device: one stream was given for copies on {len(groups)} GPUs "
                                   f"({', '.join(map(str, groups))}): a stream belongs to one")
    copies = []
    for dev, (ds, ss) in groups.items():
        on = stream if stream is not None else torch.cuda.current_stream(dev)
        if wait:
            copy_many(ds, ss, stream=on)
        else:
            copies.append(copy_many_async(ds, ss, stream=on))
    return copies


def _values(t):
    """t's values as one contiguous block for a byte copy: a conjugate or negative
    view (its memory holds x, it means conj(x) or -x) resolved, a strided view made
    contiguous; t itself when it is both already."""
    t = t.resolve_conj().resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def to_device(obj, device=None, non_blocking: bool = False):
    """obj (a CPU tensor, pageable or pinned, or any nesting of dicts, lists and
    tuples of them) on the GPU, moved by ferry's engine in one call.

    device: "cuda:N", N or a torch.device; None or "cuda": the current CUDA
    device (ferry.torch's one rule for ``device``).

    Tensors already on `device` are returned as they are (as ``Tensor.to``
    does); CUDA tensors on another device are moved by PyTorch. The copy is
    ordered on the device's current stream. non_blocking=True returns once the
    sources have been read (ferry keeps them alive until the copy is done);
    the results are ready for work queued on that stream."""
    torch = _torch()
    dev = with_index(cuda_device(device, "to_device"), "to_device")
    leaves: list = []
    template = _flatten(obj, torch, leaves)
    out: list = [None] * len(leaves)
    dsts, srcs = [], []
    for i, t in enumerate(leaves):
        if t.is_cuda:
            out[i] = t.to(dev, non_blocking=non_blocking)
            continue
        src = _values(t)
        out[i] = torch.empty(src.shape, dtype=src.dtype, device=dev)
        dsts.append(out[i])
        srcs.append(src)
    for c in copy_per_device(dsts, srcs, wait=not non_blocking):
        _keep_until_done(c)
    return _build(template, out)


# New host tensors of at least this size get transparent huge pages before the
# copy writes them: the copy's first touch of fresh 4 KiB pages ran at 13.5 GB/s
# on the H200 VM (all threads), of THP at 42.9 GB/s.
_HUGE_MIN_BYTES = 4 << 20


def _new_host(torch, src):
    from .. import _ferry

    t = torch.empty(src.shape, dtype=src.dtype)
    n = t.numel() * t.element_size()
    if n >= _HUGE_MIN_BYTES:
        _ferry.advise_huge(t.data_ptr(), n)
    return t


def to_host(obj, out=None, non_blocking: bool = False):
    """A CPU copy of obj (a CUDA tensor or any nesting of dicts, lists and
    tuples of them), moved by ferry's engine in one call per GPU it reads from.

    `out`: a structure of the same shape whose tensors (CPU tensors of the same
    shapes and dtypes, e.g. pinned buffers from ferry.torch.empty_pinned) are
    filled in place and returned, or a ``ferry.torch.Snapshot`` (its tensors,
    in order: the same copy as ``snapshot(obj, out=out)`` for any nesting of
    obj, without waiting for the snapshot's save); else new (pageable) tensors
    are made. CPU tensors in obj are returned as they are, or copied into `out`.
    The copy is ordered on the current stream of each GPU it reads from.
    non_blocking=True returns before the copy is done: read the results after
    torch.cuda.current_stream(d).synchronize() for each such GPU d (one GPU:
    torch.cuda.current_stream().synchronize())."""
    torch = _torch()
    from ..errors import InvalidArgumentError

    leaves: list = []
    template = _flatten(obj, torch, leaves)
    targets: list = [None] * len(leaves)
    if isinstance(out, HostTarget):
        out = out.tensors  # a Snapshot
    elif out is not None and not isinstance(out, (dict, list, tuple, torch.Tensor)):
        raise InvalidArgumentError(f"to_host: out must be a tensor, a dict, list or tuple of them, or a "
                                   f"ferry.torch.Snapshot, not {type(out).__name__}")
    if out is not None:
        out_leaves = leaves_of(out, lambda x: isinstance(x, torch.Tensor), any_container=False)
        if len(out_leaves) != len(leaves):
            raise InvalidArgumentError(f"to_host: out holds {len(out_leaves)} tensors, obj {len(leaves)}")
        for i, (t, o) in enumerate(zip(leaves, out_leaves)):
            if o.is_cuda or o.shape != t.shape or o.dtype != t.dtype or not o.is_contiguous():
                raise InvalidArgumentError(
                    f"to_host: out tensor {i} must be a contiguous CPU tensor of shape {tuple(t.shape)} and "
                    f"dtype {t.dtype}, not {o.device} {tuple(o.shape)} {o.dtype}")
            targets[i] = o
    dsts, srcs = [], []
    for i, t in enumerate(leaves):
        if not t.is_cuda:
            if targets[i] is None:
                targets[i] = t
            else:
                targets[i].copy_(t)
            continue
        src = _values(t)
        if targets[i] is None:
            targets[i] = _new_host(torch, src)
        dsts.append(targets[i])
        srcs.append(src)
    for c in copy_per_device(dsts, srcs, wait=not non_blocking):
        _keep_until_done(c)
    return _build(template, targets)
