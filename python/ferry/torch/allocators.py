"""Managed-memory allocators for PyTorch.

Three device-side allocators in libferry.so, loaded by PyTorch through
torch.cuda.memory.CUDAPluggableAllocator: "device" (cudaMalloc/cudaFree),
"managed" (cudaMallocManaged; prefetch and advice optional) and
"managed_pool" (size-class blocks carved from cudaMallocManaged chunks, reused
in stream order, prefetched to the device on allocation). PyTorch can switch
its allocator only before CUDA is first used in the process; for a region of
code, mem_pool() gives a torch.cuda.MemPool instead.
"""

from __future__ import annotations

import os as _os
import threading

from .. import _ferry
from ..errors import AllocatorTooLateError, InvalidArgumentError, NotSupportedError
from ._torch import torch_module as _torch

ALLOCATORS = ("device", "managed", "managed_pool")


_alloc_lock = threading.Lock()
_current = None  # (name, options text, CUDAPluggableAllocator) once use_allocator succeeded
_last_pool_name = None
_keepalive: list = []  # allocators behind MemPools: PyTorch frees their blocks late


def _check_name(name) -> str:
    if name not in ALLOCATORS:
        raise InvalidArgumentError(
            f"unknown allocator {name!r}: expected one of {', '.join(ALLOCATORS)}")
    return name


def _options_text(options: dict) -> str:
    """{'prefetch': True, 'advise': ['preferred_location', 'accessed_by']} ->
    'prefetch=1,advise=preferred_location+accessed_by' (checked by the library)."""
    parts = []
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, (list, tuple, set, frozenset)):
            text = "+".join(str(v) for v in value) or "none"
        else:
            text = str(value)
        if any(c in text for c in ",=") or any(c in key for c in ",= "):
            raise InvalidArgumentError(f"allocator option {key}={text!r}: ',' and '=' are not allowed")
        parts.append(f"{key}={text}")
    return ",".join(parts)


def library_path() -> str:
    """The libferry.so that holds the allocators' entry points: the one next to
    the native module ferry/_ferry*.so (else the file it was loaded from)."""
    import glob

    here = _os.path.dirname(_os.path.abspath(_ferry.__file__))
    for cand in [_os.path.join(here, "libferry.so")] + sorted(glob.glob(_os.path.join(here, "libferry.so.*"))):
        if _os.path.isfile(cand):
            return cand
    loaded = _ferry.library_path()
    if loaded and _os.path.isfile(loaded):
        return loaded
    raise NotSupportedError(f"libferry.so was not found next to {_ferry.__file__}; reinstall ferry (pip install .)")


def _pluggable(torch, name: str):
    return torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), f"ferry_torch_alloc_{name}", f"ferry_torch_free_{name}")


def _too_late(name: str, text: str) -> str:
    call = f"ferry.torch.use_allocator({name!r}{', ' if text else ''}{text.replace(',', ', ')})"
    return (
        f"{call} is too late: PyTorch's CUDA allocator is already initialized in this process "
        "(CUDA was used or a CUDA tensor was created before this call), and PyTorch can switch "
        "allocators only before that. Fix: call ferry.torch.use_allocator(...) at the start of the "
        "program, before any CUDA tensor is created; or, for a region of code, use "
        f"`with torch.cuda.use_mem_pool(ferry.torch.mem_pool({name!r})): ...`")


def use_allocator(name: str, **options):
    """Make ferry's allocator `name` PyTorch's CUDA allocator for this process.

    name: "device", "managed" or "managed_pool". options (see docs/managed-memory.md):
    prefetch (managed: bool, default False; managed_pool: True/False/"alloc"/
    "chunk", default "alloc"), advise (a list of "preferred_location",
    "accessed_by", "read_mostly"), oversubscribe (default False: never ask for
    more managed memory than the device has free), chunk_bytes and stream_wait
    (managed_pool). Must run before CUDA is used in the process, else
    AllocatorTooLateError says how to fix it. Calling it again with the same
    arguments is a no-op. Returns the torch CUDAPluggableAllocator."""
    global _current
    _check_name(name)
    text = _options_text(options)
    torch = _torch()
    with _alloc_lock:
        if _current is not None:
            if _current[0] == name and _current[1] == text:
                return _current[2]
            raise AllocatorTooLateError(
                f"this process already uses ferry's {_current[0]!r} allocator (options "
                f"{_current[1]!r}), and PyTorch switches allocators once per process: run "
                f"{name!r} in a new process, or use ferry.torch.mem_pool({name!r}) for a region of code")
        if torch.cuda.is_initialized():
            raise AllocatorTooLateError(_too_late(name, text))
        _ferry.managed_configure(name, text)  # InvalidArgumentError for a bad option
        alloc = _pluggable(torch, name)
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:  # "Can't swap an already initialized allocator"
            raise AllocatorTooLateError(f"{_too_late(name, text)} (PyTorch said: {e})") from e
        _current = (name, text, alloc)
        return alloc


def mem_pool(name: str, **options):
    """A torch.cuda.MemPool whose memory comes from ferry's allocator `name`
    (options as for use_allocator), for a region of code at any time:

        with torch.cuda.use_mem_pool(ferry.torch.mem_pool("managed_pool")):
            x = torch.empty(n, device="cuda")

    PyTorch's caching allocator then carves the pool's tensors from segments
    that ferry allocates; they go back to ferry when the pool is emptied or
    destroyed. Only allocations of the current thread are routed."""
    global _last_pool_name
    _check_name(name)
    text = _options_text(options)
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        raise NotSupportedError(f"torch.cuda.MemPool needs PyTorch >= 2.5 (this is {torch.__version__})")
    with _alloc_lock:
        if _current is not None and _current[0] == name and text != _current[1]:
            raise InvalidArgumentError(
                f"ferry's {name!r} allocator is this process's allocator with options {_current[1]!r}; "
                f"a pool of it cannot have other options ({text!r})")
        if _current is None or _current[0] != name:
            _ferry.managed_configure(name, text)
        alloc = _pluggable(torch, name)
        _keepalive.append(alloc)
        _last_pool_name = name
    return torch.cuda.MemPool(alloc.allocator())


def current_allocator():
    """The name of the ferry allocator use_allocator() installed, or None."""
    return _current[0] if _current else None


def allocator_stats(name: str | None = None, device: int = -1) -> dict:
    """Counters of ferry's allocator `name` (default: the one in use): bytes
    allocated / requested / reserved (and peaks), allocations, frees, failures
    (allocations that returned NULL to PyTorch; last_failure says why),
    prefetched bytes, chunks and pool reuse counts. device -1: all devices."""
    name = name or current_allocator() or _last_pool_name
    if name is None:
        raise InvalidArgumentError("no ferry allocator is in use: name one of " + ", ".join(ALLOCATORS))
    return _ferry.managed_stats(_check_name(name), device)


def empty_cache(name: str | None = None, device: int = -1) -> int:
    """Give memory that ferry's allocator `name` caches back to CUDA (the
    managed pool's free chunks); returns the bytes released. Synchronizes the
    device first when CUDA is initialized, so finished work does not hold
    chunks, and empties PyTorch's own cache (MemPool segments)."""
    name = _check_name(name or current_allocator() or _last_pool_name or "managed_pool")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return _ferry.managed_trim(name, device)
