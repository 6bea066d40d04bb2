"""PyTorch integration: CPU tensors whose storage is ferry pinned-pool memory.

``empty_pinned(shape, dtype)`` returns a tensor that ``is_pinned()``, so
``t.to("cuda", non_blocking=True)`` is a real asynchronous DMA, and whose memory
returns to the pool (recycled, not unpinned) when the tensor is freed. Unlike
PyTorch's pinned allocator, the size is exact: a 2.1 GiB tensor pins 2.1 GiB,
not 4 GiB.
"""

from __future__ import annotations

import threading

from .pool import PinnedPool

_lock = threading.Lock()
_default_pools: dict[int, PinnedPool] = {}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferry.torch needs PyTorch (pip install torch)") from e
    return torch


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
    torch = _torch()
    dtype = dtype or torch.float32
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * itemsize
    pool = pool or default_pinned_pool()
    buf = pool.alloc(max(nbytes, 1), alignment=max(256, itemsize))
    raw = torch.from_dlpack(buf)  # uint8 tensor; its deleter keeps buf alive
    return raw[:nbytes].view(dtype).view(shape)


# ---- copies of pageable tensors ----------------------------------------------------

_pending_lock = threading.Lock()
_pending: list = []  # async copies whose tensors must stay alive until done


def _keep_until_done(c) -> None:
    with _pending_lock:
        _pending[:] = [p for p in _pending if not p.done]
        _pending.append(c)


def to_device(t, device=None, non_blocking: bool = False):
    """t (a CPU tensor, pageable or pinned) on the GPU, moved by ferry's engine.

    non_blocking=True returns at once; the copy is ordered on the device's
    current stream and the source must not be modified until it is done
    (ferry keeps it alive)."""
    torch = _torch()
    from .copy import copy_async

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if t.is_cuda:
        return t.to(device, non_blocking=non_blocking)
    src = t.contiguous()
    out = torch.empty(src.shape, dtype=src.dtype, device=device)
    if src.numel() == 0:
        return out
    c = copy_async(out, src, stream=torch.cuda.current_stream(device))
    if non_blocking:
        _keep_until_done(c)
    else:
        c.wait()
    return out


def to_host(t, out=None):
    """A CPU copy of the CUDA tensor t (into `out` if given), moved by ferry's engine."""
    torch = _torch()
    from .copy import copy_async

    if not t.is_cuda:
        raise ValueError("to_host expects a CUDA tensor")
    src = t.contiguous()
    if out is None:
        out = torch.empty(src.shape, dtype=src.dtype)
    elif out.shape != src.shape or out.dtype != src.dtype or out.is_cuda:
        raise ValueError("out must be a CPU tensor of the same shape and dtype")
    if src.numel():
        copy_async(out, src, stream=torch.cuda.current_stream(src.device)).wait()
    return out
