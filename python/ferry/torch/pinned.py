"""Pinned CPU tensors whose storage is ferry pinned-pool memory.

``empty_pinned(shape, dtype)`` returns a tensor that ``is_pinned()``, so
``t.to("cuda", non_blocking=True)`` is a real asynchronous DMA, and whose memory
returns to the pool (recycled, not unpinned) when the tensor is freed. Unlike
PyTorch's pinned allocator, the size is exact: a 2.1 GiB tensor pins 2.1 GiB,
not 4 GiB.
"""

from __future__ import annotations

import threading

from .. import _args
from ..pool import PinnedPool
from ._torch import torch_module as _torch

_lock = threading.Lock()
_default_pools: dict[int, PinnedPool] = {}


def default_pinned_pool(device: int = 0) -> PinnedPool:
    """The process-wide pinned pool for `device`, created on first use."""
    with _lock:
        pool = _default_pools.get(device)
        if pool is None:
            pool = _default_pools[device] = PinnedPool(device=device)
        return pool


def empty_pinned(shape, dtype=None, pool: PinnedPool | None = None):
    """An uninitialized pinned CPU tensor of `shape` and `dtype` from `pool`
    (default: the process's pinned pool for device 0)."""
    shape = _args.shape(shape)
    torch = _torch()
    dtype = dtype or torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * itemsize
    pool = pool or default_pinned_pool()
    buf = pool.alloc(max(nbytes, 1), alignment=max(256, itemsize))
    raw = torch.from_dlpack(buf)  # uint8 tensor; its deleter keeps buf alive
    return raw[:nbytes].view(dtype).view(shape)
