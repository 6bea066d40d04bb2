"""Copies of CPU tensors (pageable or pinned) to and from the GPU by ferry's engine."""

from __future__ import annotations

import threading

from ._torch import torch_module as _torch

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
    from ..copy import copy_async

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
    from ..copy import copy_async

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
