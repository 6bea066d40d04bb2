"""Copies between host memory (pageable or pinned) and GPU memory.

``ferry.copy(dst, src)``, ``ferry.copy_async(dst, src, stream=...)`` and
``ferry.copy_many(dsts, srcs)`` accept torch tensors, objects with
``__cuda_array_interface__`` (CuPy, Numba), anything with the buffer protocol
(bytes, bytearray, numpy arrays, ``ferry.Buffer``) and ints (addresses, with
``nbytes`` / ``sizes``); ``copy_many`` also takes lists or int64 arrays of
addresses. The engine picks a path per item (``Copy.strategy``): pinned host
memory goes straight to the DMA engine; pageable memory is staged through
pinned memory, the CPU copy of one chunk overlapping the DMA of the previous.

Streams: ``stream`` is an int handle, a ``torch.cuda.Stream`` or None. None
means torch's current stream of the tensor's device when a torch CUDA tensor
is involved (like ``Tensor.copy_``), else the legacy default stream (like
``cudaMemcpy``); ``copy_many`` and ``copy_blocks`` then run on a stream of
ferry's per direction that first waits for the work queued on the legacy
stream (so opposite directions overlap), and later work waits on the call's
return or its ``Copy``. The device is the CUDA tensor's, or the one the driver reports
for a device pointer, or ``device=``.

Async contract: an async host->device copy of pageable memory below 64 MiB has
read its source when ``copy_async`` returns (it may be reused at once); other
pageable copies are read (or written) by ferry's threads after the call
returns, so do not touch them until ``Copy.wait()`` returned or ``Copy.done``
is True. ``Copy`` keeps the Python objects alive until then. Work queued on
the stream after the call runs after the copy.
"""

from __future__ import annotations

from . import _args, _ferry
from ._resolve import resolve


def engine(device: int = 0):
    """The process's copy engine for `device` (made on first use, shared by
    every call; its threads are shared by every device's engine)."""
    return _ferry.engine(device)


class Copy:
    """An asynchronous copy: wait(), done, strategy, event (a cudaEvent_t handle)."""

    __slots__ = ("_native", "_keepalive")

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


def copy(dst, src, nbytes: int | None = None, *, stream=None, strategy: str | None = None,
         device: int | None = None) -> None:
    """Copy src to dst (one of them GPU memory); returns when the bytes are in place."""
    _ferry.copy(dst, src, nbytes, stream, strategy, device)


def copy_async(dst, src, nbytes: int | None = None, *, stream=None, strategy: str | None = None,
               device: int | None = None) -> Copy:
    """Enqueue a copy on `stream` and return its Copy."""
    return Copy(_ferry.copy_async(dst, src, nbytes, stream, strategy, device), (dst, src))


def copy_many(dsts, srcs, sizes=None, *, stream=None, strategy: str | None = None,
              device: int | None = None) -> None:
    """Many copies in one call, e.g. a state_dict's tensors or a set of KV blocks.

    Any mix of pageable, registered and pinned host buffers with GPU buffers of
    one device, both directions. Pinned items go to the DMA engines as one
    batch; pageable items move through one pipelined staged run (item i+1 is
    staged while item i is on the link; small items share staging chunks).
    `sizes` is needed for addresses given as ints (lists or int64 arrays; one
    int for blocks of one size), and copies prefixes otherwise. Items whose
    both sides continue the previous item's are merged into one copy. Every
    item is checked before any work starts; an error names the item's index.
    With no stream (and no torch tensor), the copy runs on ferry's own stream
    for its direction, after the work queued on the legacy default stream
    before the call; two threads copying opposite ways overlap. Returns when
    every item is in place."""
    _ferry.copy_many(dsts, srcs, sizes, stream, strategy, device, True)


def copy_blocks(dst_base: int, src_base: int, dst_ids, src_ids, block_bytes: int, *, layers: int = 1,
                dst_block_stride: int | None = None, src_block_stride: int | None = None,
                dst_layer_stride: int | None = None, src_layer_stride: int | None = None, stream=None,
                strategy: str | None = None, device: int | None = None) -> None:
    """Copy blocks of a paged layout (a KV cache) given by their ids, without
    building an address per block: for each layer l and pair i,
    ``block_bytes`` from ``src_base + l * src_layer_stride + src_ids[i] * src_block_stride``
    to the same place on the dst side. Ids are lists or 1-d int32/int64
    arrays (numpy, torch CPU tensors); block strides default to block_bytes.
    The blocks then move as ``copy_many``'s items do (adjacent ones merged, small
    ones by the SM kernel, the rest as one DMA batch). Returns when every block
    is in place."""
    _ferry.copy_blocks(dst_base, src_base, dst_ids, src_ids, block_bytes, layers, dst_block_stride,
                       src_block_stride, dst_layer_stride, src_layer_stride, stream, strategy, device, True)


def copy_blocks_async(dst_base: int, src_base: int, dst_ids, src_ids, block_bytes: int, *, layers: int = 1,
                      dst_block_stride: int | None = None, src_block_stride: int | None = None,
                      dst_layer_stride: int | None = None, src_layer_stride: int | None = None, stream=None,
                      strategy: str | None = None, device: int | None = None) -> Copy:
    """copy_blocks, returning a Copy (the ids are read before it returns)."""
    native = _ferry.copy_blocks(dst_base, src_base, dst_ids, src_ids, block_bytes, layers, dst_block_stride,
                                src_block_stride, dst_layer_stride, src_layer_stride, stream, strategy, device,
                                False)
    return Copy(native, None)


class BlockPlan:
    """A fixed set of block copies between pinned host memory and GPU memory,
    checked once and launched many times by ferry's SM copy kernel: the form a
    CUDA graph can capture (``launch`` is one kernel launch, nothing else).

        plan = ferry.BlockPlan(dsts, srcs, block_bytes)   # int64 address arrays
        with torch.cuda.graph(g):
            plan.launch(torch.cuda.current_stream())

    The blocks must stay allocated and pinned at the same addresses while the
    plan (or a graph that captured it) may run; their contents may change
    between launches. Adjacent blocks are merged as in ``copy_many``. max_sms:
    SMs the kernel may use (default: the machine profile's batch_sm_max_sms)."""

    __slots__ = ("_native",)

    def __init__(self, dsts, srcs, sizes, *, device: int | None = None, max_sms: int | None = None):
        self._native = _ferry.BlockPlan(dsts, srcs, sizes, device, max_sms)

    def launch(self, stream=None) -> None:
        """Enqueue the copies on `stream` (int handle or torch.cuda.Stream; None:
        the legacy default stream, which a graph capture cannot record)."""
        self._native.launch(stream)

    @property
    def items(self) -> int:
        return self._native.items

    @property
    def nbytes(self) -> int:
        return self._native.nbytes


def _items(value, name: str):
    """A list, tuple or array as it is; any other iterable (a generator) as a list,
    which the async Copy keeps alive with its items."""
    if isinstance(value, (list, tuple)) or hasattr(value, "__dlpack__") or hasattr(value, "__array_interface__"):
        return value
    return _args.items(value, name, "a sequence of tensors, buffers or addresses")


def copy_many_async(dsts, srcs, sizes=None, *, stream=None, strategy: str | None = None,
                    device: int | None = None) -> Copy:
    """copy_many, returning a Copy. Host->device items have been read when the
    call returns; device->host items are in place once the Copy is done."""
    dsts, srcs = _items(dsts, "dsts"), _items(srcs, "srcs")
    native = _ferry.copy_many(dsts, srcs, sizes, stream, strategy, device, False)
    return Copy(native, (dsts, srcs))


class Registration:
    """A host buffer pinned until unregister() (or the end of a with block)."""

    def __init__(self, obj, nbytes: int | None = None, device: int = 0):
        addr, n, _ = resolve(obj, writable=False)
        if nbytes is not None:
            n = _args.size(nbytes)
        if n is None:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError("an address given as an int needs nbytes")
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
