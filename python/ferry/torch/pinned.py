"""Pinned CPU tensors whose storage is ferry pinned-pool memory.

``empty_pinned(shape, dtype)`` returns a tensor that ``is_pinned()``, so
``t.to("cuda", non_blocking=True)`` is a real asynchronous DMA, and whose memory
returns to the pool (recycled, not unpinned) when the tensor is freed. Unlike
PyTorch's pinned allocator, the size is exact: a 2.1 GiB tensor pins 2.1 GiB,
not 4 GiB. Like ``torch.empty``, the tensor is uninitialized where its memory is
recycled (``zero=True`` clears it: see ferry.pool for the cost).

Each tensor is one pool allocation handed to PyTorch as a DLPack capsule with
its final dtype and shape (``_ferry.pool_tensor``): about the cost of
``torch.empty(..., pin_memory=True)`` from PyTorch's cache, where a Buffer,
``torch.from_dlpack``, a slice and two views cost 12.5 us on our CPU machine.
"""

from __future__ import annotations

from .. import _args, _device, _ferry
from .._per_device import PerDevice
from ..pool import PinnedPool
from . import _torch_private
from ._torch import torch_module as _torch

_dlpack_dtypes: dict = {}  # torch dtype -> (DLPack type code, bits); filled on first use
_from_capsule = None  # torch's DLPack capsule -> tensor


def _new_pool(device: int) -> PinnedPool:
    return PinnedPool(device=device)


_default_pools: PerDevice[PinnedPool] = PerDevice(_new_pool)  # forgotten in a forked child (_per_device.py)


def default_pinned_pool(device: int | None = None) -> PinnedPool:
    """The process-wide pinned pool for `device` (None: the current CUDA device,
    docs/api.md), created on first use (recycled memory uninitialized, unless
    FERRY_ZERO_RECYCLED=1)."""
    return _default_pools.get(_device.index(device))


def _fill_dlpack_table(torch) -> None:
    global _from_capsule
    _from_capsule = _torch_private.dlpack_capsule_converter()
    table = {
        torch.bool: (6, 8), torch.uint8: (1, 8), torch.int8: (0, 8), torch.int16: (0, 16),
        torch.int32: (0, 32), torch.int64: (0, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
        torch.float32: (2, 32), torch.float64: (2, 64), torch.complex64: (5, 64), torch.complex128: (5, 128),
    }
    for name, bits in (("uint16", 16), ("uint32", 32), ("uint64", 64)):
        dt = getattr(torch, name, None)
        if dt is not None:
            table[dt] = (1, bits)
    _dlpack_dtypes.update(table)


def empty_pinned(shape, dtype=None, pool: PinnedPool | None = None, *, zero: bool = False):
    """An uninitialized pinned CPU tensor of `shape` (an int or a sequence of
    ints) and `dtype` (default: torch's default dtype) from `pool` (default:
    the process's pinned pool for device 0: the one exception to the device=None
    rule of docs/api.md, kept while asking costs this per-tensor path ~0.3 us).
    zero=True: it reads as zero (only
    recycled bytes are cleared)."""
    code_bits = _dlpack_dtypes.get(dtype)  # kept short: this is the per-tensor path
    if code_bits is None:
        return _empty_pinned_other(shape, dtype, pool, zero)
    if pool is None:
        pool = _default_pools.peek(0)
        if pool is None:  # the first call: a bad shape is refused before a device is touched
            _args.shape(shape)
            pool = default_pinned_pool(0)  # GPU 0's pool, not the device=None rule's: docs/api.md
    return _from_capsule(_ferry.pool_tensor(pool._native, shape, code_bits[0], code_bits[1], zero))


def _empty_pinned_other(shape, dtype, pool, zero):
    """First call, dtype None, or a dtype DLPack does not name (e.g. float8)."""
    torch = _torch()
    if not _dlpack_dtypes:
        _fill_dlpack_table(torch)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if dtype in _dlpack_dtypes:
        return empty_pinned(shape, dtype, pool, zero=zero)
    shape = _args.shape(shape)
    pool = pool or default_pinned_pool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * itemsize
    buf = pool.alloc(max(nbytes, 1), alignment=max(256, itemsize), zero=zero)
    raw = torch.from_dlpack(buf)  # uint8 tensor; its deleter keeps buf alive
    return raw[:nbytes].view(dtype).view(shape)
