"""Copies between host memory (pageable or pinned) and GPU memory.

``ferry.copy(dst, src)`` and ``ferry.copy_async(dst, src, stream=...)`` accept
ints (addresses, with ``nbytes``), anything with the buffer protocol (bytes,
bytearray, numpy arrays, ``ferry.Buffer``), objects with
``__cuda_array_interface__`` (CuPy, Numba) and torch tensors. The engine picks a
strategy per call (``Copy.strategy``): pinned host memory goes straight to the
DMA engine; pageable memory is staged through pinned slots or pinned in place.

Async contract: the host side of a pageable copy is read (or written) by
ferry's threads after ``copy_async`` returns; do not touch it until
``Copy.wait()`` returned or ``Copy.done`` is True. ``Copy`` keeps the Python
objects alive until then. Work queued on ``stream`` after the call runs after
the copy.
"""

from __future__ import annotations

import threading

from . import _args, _ferry
from .errors import InvalidArgumentError

_engines: dict[int, object] = {}
_lock = threading.Lock()


def engine(device: int = 0):
    """The process's copy engine for `device` (created on first use)."""
    with _lock:
        e = _engines.get(device)
        if e is None:
            e = _engines[device] = _ferry.Engine(device)
        return e


def _is_torch_tensor(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def resolve(obj, nbytes: int | None, writable: bool) -> tuple[int, int, int | None]:
    """(address, nbytes, cuda device or None) of a copy argument."""
    nbytes = _args.optional_size(nbytes)
    if isinstance(obj, int):
        if nbytes is None:
            raise InvalidArgumentError("an address given as an int needs nbytes")
        return _args.integer(obj, "address", 0, _args.MAX_U64), nbytes, None
    if _is_torch_tensor(obj):
        if not obj.is_contiguous():
            raise InvalidArgumentError("ferry copies need contiguous tensors (call .contiguous())")
        n = obj.numel() * obj.element_size()
        return obj.data_ptr(), n, (obj.device.index or 0) if obj.is_cuda else None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None:
            raise InvalidArgumentError("ferry copies need C-contiguous arrays")
        n = 1
        for s in cai["shape"]:
            n *= s
        import numpy as np

        return cai["data"][0], n * np.dtype(cai["typestr"]).itemsize, None
    try:
        addr, n, _ = _ferry.buffer_address(obj, writable)
    except BufferError as e:
        raise InvalidArgumentError(
            f"{type(obj).__name__} is not a writable contiguous buffer" if writable else str(e)
        ) from e
    except TypeError:
        raise InvalidArgumentError(
            f"cannot copy {type(obj).__name__}: expected an int address, a buffer, "
            "a __cuda_array_interface__ object or a torch tensor"
        ) from None
    return addr, n, None


def _stream_handle(stream) -> int:
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        raise InvalidArgumentError(f"stream must be an int handle or a torch.cuda.Stream, not {type(stream).__name__}")
    return handle


def _prepare(dst, src, nbytes):
    if nbytes is None and isinstance(dst, int) and not isinstance(src, int):
        nbytes = resolve(src, None, writable=False)[1]
    if nbytes is None and isinstance(src, int) and not isinstance(dst, int):
        nbytes = resolve(dst, None, writable=True)[1]
    d, dn, ddev = resolve(dst, nbytes, writable=True)
    s, sn, sdev = resolve(src, nbytes, writable=False)
    n = nbytes if nbytes is not None else min(dn, sn)
    if nbytes is None and dn != sn:
        raise InvalidArgumentError(f"dst has {dn} bytes and src {sn}: pass nbytes to copy a prefix")
    if n > dn or n > sn:
        raise InvalidArgumentError(f"nbytes={n} is larger than dst ({dn} bytes) or src ({sn} bytes)")
    device = ddev if ddev is not None else (sdev if sdev is not None else 0)
    return d, s, n, device


class Copy:
    """An asynchronous copy: wait(), done, strategy, event (a cudaEvent_t handle)."""

    def __init__(self, native, keepalive):
        self._native = native
        self._keepalive = keepalive

    def wait(self) -> None:
        self._native.wait()
        self._keepalive = None

    @property
    def done(self) -> bool:
        if self._native.query():
            self._keepalive = None
            return True
        return False

    @property
    def strategy(self) -> str:
        return self._native.strategy

    @property
    def event(self) -> int:
        return self._native.event

    @property
    def nbytes(self) -> int:
        return self._native.nbytes

    @property
    def seconds(self) -> float:
        return self._native.seconds


def copy(dst, src, nbytes: int | None = None, *, strategy: str | None = None) -> None:
    """Copy src to dst (one of them GPU memory) and wait for it."""
    d, s, n, device = _prepare(dst, src, nbytes)
    engine(device).copy(d, s, n, strategy)


def copy_async(dst, src, nbytes: int | None = None, *, stream=None, strategy: str | None = None) -> Copy:
    """Enqueue a copy on `stream` (int handle, torch.cuda.Stream or None) and return its Copy."""
    d, s, n, device = _prepare(dst, src, nbytes)
    native = engine(device).copy_async(d, s, n, _stream_handle(stream), strategy)
    return Copy(native, (dst, src))


def copy_batch_async(dsts, srcs, sizes, *, stream=None, device: int = 0) -> Copy:
    """Many copies (addresses or objects) in one call, e.g. KV-cache blocks."""
    sizes = _args.sizes(sizes)
    ds = [resolve(x, n, True)[0] for x, n in zip(dsts, sizes)]
    ss = [resolve(x, n, False)[0] for x, n in zip(srcs, sizes)]
    native = engine(device).copy_batch_async(ds, ss, list(sizes), _stream_handle(stream), None)
    return Copy(native, (list(dsts), list(srcs)))


class Registration:
    """A host buffer pinned until unregister() (or the end of a with block)."""

    def __init__(self, obj, nbytes: int | None = None, device: int = 0):
        addr, n, _ = resolve(obj, nbytes, writable=False)
        self._native = _ferry.Registration(addr, n, device)
        self._obj = obj

    def unregister(self) -> None:
        self._native = None
        self._obj = None

    @property
    def registered_bytes(self) -> int:
        return self._native.registered_bytes if self._native else 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unregister()


def register(obj, nbytes: int | None = None, device: int = 0) -> Registration:
    """Pin a buffer that will be copied many times; copies then run at pinned speed."""
    return Registration(obj, nbytes, device)
