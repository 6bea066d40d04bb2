"""Tensor-parallel slices for ``load_safetensors(..., slices=)``: each rank
loads its part of a tensor, never the whole tensor.

``slices={name: (dim, start, stop)}`` loads indexes [start, stop) of dimension
``dim`` (negative counts from the end) of tensor ``name``, with the file's
other dimensions whole: a row slice of a weight is ``(0, r0, r1)``, a column
slice ``(1, c0, c1)``. The result has the slice's shape; with ``out=``, the
out tensor must have it.

Why byte ranges: a tensor in a safetensors file is row-major. Its slice along
``dim`` is ``outer`` runs of bytes (``outer``: the product of the dimensions
before ``dim``), each ``(stop - start) * inner * itemsize`` long (``inner``: the
product of the dimensions after it), one every ``shape[dim] * inner *
itemsize`` bytes. Laid end to end, the runs are the slice as a contiguous
tensor. So a slice is a list of (file offset, size, device address) ranges,
which the loader and the node pool copy like whole tensors: a row slice is one
range, a column slice of an [R, C] matrix R ranges in one ``copy_many``.
"""

from __future__ import annotations

import math

from .. import _args
from ..errors import InvalidArgumentError


def check(slices, cat, sel) -> dict:
    """{catalog index: (dim >= 0, start, stop)} for the selected tensors that
    slices names; InvalidArgumentError for anything else."""
    if slices is None:
        return {}
    if not isinstance(slices, dict):
        raise InvalidArgumentError(f"slices: expected a dict {{name: (dim, start, stop)}}, got {type(slices).__name__}")
    chosen = set(sel)
    out = {}
    for name, spec in slices.items():
        i = cat.index.get(name) if isinstance(name, str) else None
        if i is None:
            raise InvalidArgumentError(f"slices[{name!r}]: no tensor of that name in the checkpoint")
        if i not in chosen:
            raise InvalidArgumentError(f"slices[{name!r}]: the tensor is not among those loaded (keys= or out=)")
        out[i] = _spec(cat, i, name, spec)
    return out


def _spec(cat, i, name, spec) -> tuple[int, int, int]:
    """(dim, start, stop) as ints: ints or anything with __index__ (numpy integers,
    _args' rule), not a bool or a float."""
    if not isinstance(spec, (tuple, list)) or len(spec) != 3:
        raise InvalidArgumentError(f"slices[{name!r}]={_args.quote(spec)}: expected (dim, start, stop), three ints")
    dim, start, stop = (_args.integer(v, f"slices[{name!r}] {part}", expected="an integer (dim, start, stop: three ints)")
                        for v, part in zip(spec, ("dim", "start", "stop")))
    shape = cat.shape[i]
    if cat.dtype[i] == "F4":
        raise InvalidArgumentError(f"slices[{name!r}]: {cat.where(i)} is F4 (two values per byte): it cannot be sliced")
    if not shape:
        raise InvalidArgumentError(f"slices[{name!r}]: {cat.where(i)} is a scalar: nothing to slice")
    if not -len(shape) <= dim < len(shape):
        raise InvalidArgumentError(f"slices[{name!r}]: dim {dim} is outside the tensor's {len(shape)} dimensions "
                                   f"(shape {list(shape)})")
    dim %= len(shape)
    if not 0 <= start <= stop <= shape[dim]:
        raise InvalidArgumentError(f"slices[{name!r}]: [{start}, {stop}) is not a range of dimension {dim} "
                                   f"(size {shape[dim]}; 0 <= start <= stop <= size)")
    return dim, start, stop


def shape(full, spec) -> tuple:
    dim, start, stop = spec
    return tuple(full[:dim]) + (stop - start,) + tuple(full[dim + 1:])


def runs(cat, i, spec) -> tuple[list[int], int]:
    """(file offsets of the slice's runs, bytes per run) of tensor i."""
    full = cat.shape[i]
    dim, start, stop = spec
    numel = math.prod(full)
    itemsize = cat.nbytes[i] // numel if numel else 0
    inner = math.prod(full[dim + 1:]) * itemsize
    run = (stop - start) * inner
    if run == 0:
        return [], 0
    outer = math.prod(full[:dim])
    stride = full[dim] * inner
    base = cat.offset[i] + start * inner
    if stride == run:  # the slice is whole along dim: one range
        return [base], run * outer
    return [base + k * stride for k in range(outer)], run


def load(torch, fetch, cat, sliced: dict, dts: dict, out, dev) -> dict:
    """Loads the sliced tensors ({i: spec}); returns {name: tensor}.

    fetch(indexes, offsets, sizes, addresses) copies file ranges of those
    catalog tensors to device addresses (the loader, or a node pool block).
    dts: {safetensors dtype: (file torch dtype, dtype it loads as)}. A slice
    of the file's dtype lands in its tensor; another dtype (dtype=, out=) goes
    through a raw buffer (held until the end of the call) and a cast on the
    GPU. Every range goes in one fetch."""
    result, casts = {}, []
    idx, offs, sizes, addrs = [], [], [], []
    for i, spec in sliced.items():
        name, want_shape = cat.names[i], shape(cat.shape[i], spec)
        file_dt, want = dts[cat.dtype[i]]
        if out is not None:
            t = out[name]
            if tuple(t.shape) != want_shape:
                raise InvalidArgumentError(f"{cat.where(i)} sliced by {spec} has shape {list(want_shape)} but "
                                           f"out[{name!r}] has {list(t.shape)}")
            if t.dtype != want:
                raise InvalidArgumentError(f"{cat.where(i)} loads as {want} but out[{name!r}] is {t.dtype}")
            if t.device != dev:
                raise InvalidArgumentError(f"out[{name!r}] is on {t.device}, the load goes to {dev}")
        else:
            t = torch.empty(want_shape, dtype=want, device=dev)
        result[name] = t
        raw = t if t.dtype == file_dt and t.is_contiguous() else torch.empty(want_shape, dtype=file_dt, device=dev)
        if raw is not t:
            casts.append((i, raw, t))
        starts, run = runs(cat, i, spec)
        base = raw.data_ptr()
        for k, off in enumerate(starts):
            idx.append(i)
            offs.append(off)
            sizes.append(run)
            addrs.append(base + k * run)
    if idx:
        fetch(idx, offs, sizes, addrs)
    for i, raw, t in casts:
        try:
            t.copy_(raw)
        except (RuntimeError, TypeError) as err:
            raise InvalidArgumentError(f"{cat.where(i)}: cannot cast {cat.dtype[i]} to {t.dtype}: {err}") from err
    return result
