"""State dicts to safetensors files: ``save_safetensors``.

One file, or shards plus an index in the Hugging Face layout
(``model-00001-of-00003.safetensors`` ..., ``model.safetensors.index.json``),
that ``safetensors.safe_open``, ferry's loader and transformers'
``from_pretrained`` read bit-exact.

How: each file is a stream of bytes (header, then every tensor's bytes) cut
into slots of a small ring (``SLOT_BYTES`` x ``SLOTS``, from a ferry pool:
pinned where a tensor is on a GPU, pageable otherwise; reused by every save of
the process). One thread (the caller's) fills the slots in order: GPU bytes by
``ferry.copy_many`` on each device's current torch stream (so the copy waits
for the work queued there before the call), CPU bytes by memmove. Writer
threads ``pwrite`` full slots while the next ones fill, through an
``AtomicFile`` (``ferry.atomic_file``: temporary name, O_DIRECT where the file
system allows it, fsync, rename, directory fsync). Host memory the save adds:
the ring, whatever the state dict's size. A snapshot (``ferry.torch.snapshot``)
laid out as its file's data is written straight from its memory (``source=``),
without the ring.

Why Python threads: ``os.pwrite`` releases the GIL, and the disk, not the
CPU, is the bound. On our CPU machine (2 cores, ext4), 0.8 GB of CPU bf16
tensors took 0.40 s (2.0 GB/s, the disk's O_DIRECT rate in the same session),
``safetensors.torch.save_file`` plus fsync 2.7 s.

File layout: the JSON header is padded with spaces (which safetensors readers
accept) so the data starts on a 4 KiB boundary, and the tensors are ordered by
element size, largest first (as ``safetensors.torch.save_file`` does), so every
tensor sits aligned to its element size in the file and in a memory map. Which
files a save writes and how they replace the earlier checkpoint whole:
``ferry.torch.publish``.

Locking: ``_lock`` guards ``_pageable_pool`` (made once per process: a forked
child drops the parent's reference and makes its own). Each save's ring
belongs to that save; its free and full queues are ``queue.Queue``s. No CUDA
call is made under a lock.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import threading
import traceback

from .. import temp_names, units
from ..atomic_file import DIRECT_ALIGN, AtomicFile, check_replaceable
from ..errors import InvalidArgumentError
from ..pool import Pool
from . import publish as _publish
from ._torch import torch_module as _torch
from .pinned import default_pinned_pool
from .safetensors import SAFETENSORS_TO_TORCH

# The ring: 8 slots of 32 MiB. A slot is one pwrite; 4 writers keep 4 of them in
# flight (O_DIRECT needs queue depth to reach a disk's speed), while the caller's
# thread fills the next ones (a GPU slot: ~0.6 ms at 55 GB/s; the disk: ~16 ms).
SLOT_BYTES = 32 << 20
SLOTS = 8
WRITERS = 4
# The longest header safetensors reads (its MAX_HEADER_SIZE; ferry's loader has the
# same, kMaxHeaderBytes in src/load/safetensors.h): a longer one makes a file no one reads.
MAX_HEADER_BYTES = 100_000_000

_lock = threading.Lock()
_pageable_pool: Pool | None = None  # guarded by _lock; the ring for CPU-only saves


def _forget_pool_in_child() -> None:
    """After fork(), in the child: the parent's pool (and a lock another thread may
    have held) stay with the parent; the child makes its own on first use."""
    global _lock, _pageable_pool
    _lock = threading.Lock()
    _pageable_pool = None


os.register_at_fork(after_in_child=_forget_pool_in_child)


def pageable_pool() -> Pool:
    """The process's pageable ferry pool for CPU-only saves and snapshots (made on first use)."""
    global _pageable_pool
    with _lock:
        if _pageable_pool is None:
            _pageable_pool = Pool()
        return _pageable_pool


def _torch_to_code(torch) -> dict:
    out = {}
    for code, name in SAFETENSORS_TO_TORCH.items():
        dt = getattr(torch, name, None)
        if dt is not None:
            out[dt] = code
    return out


class Item:
    """One tensor of one file: its name, tensor, safetensors dtype, shape and bytes."""

    __slots__ = ("name", "tensor", "code", "shape", "nbytes", "itemsize")

    def __init__(self, name, tensor, code):
        self.name, self.tensor, self.code = name, tensor, code
        self.itemsize = tensor.element_size()
        self.nbytes = tensor.numel() * self.itemsize
        shape = list(tensor.shape)
        if code == "F4":  # float4_e2m1fn_x2: two values per element, safetensors counts values
            shape[-1] *= 2
        self.shape = shape


def collect(obj, what: str = "save_safetensors") -> list[Item]:
    """The state dict's tensors as Items, in order; InvalidArgumentError on
    anything safetensors cannot hold."""
    torch = _torch()
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"{what}: expected a dict of tensors (a state dict), not {type(obj).__name__}")
    codes = _torch_to_code(torch)
    items = []
    for name, t in obj.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"{what}: key {name!r} is a {type(name).__name__}, not a str")
        if name == "__metadata__":
            raise InvalidArgumentError(f"{what}: '__metadata__' is reserved in safetensors (use metadata=)")
        check_text(name, f"{what}: key")
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{what}: {name!r} is a {type(t).__name__}, not a tensor")
        if t.layout != torch.strided:
            raise InvalidArgumentError(f"{what}: {name!r} is a {t.layout} tensor; safetensors holds dense tensors")
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"{what}: {name!r} is on {t.device}; CPU and CUDA tensors are saved")
        if not t.is_contiguous():
            raise InvalidArgumentError(f"{what}: {name!r} is not contiguous (call .contiguous() first)")
        code = codes.get(t.dtype)
        if code is None:
            raise InvalidArgumentError(f"{what}: {name!r} has dtype {t.dtype}, which safetensors has no code for")
        items.append(Item(name, t, code))
    return items


def check_text(text: str, where: str) -> None:
    """InvalidArgumentError unless text encodes as UTF-8 (safetensors' JSON):
    a lone surrogate (a file name decoded with surrogateescape) does not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{where} {text!r} is not valid Unicode text (a lone surrogate "
                                   f"{text[e.start]!r} at index {e.start}); safetensors stores names and "
                                   "metadata as UTF-8: give a name that is text") from None


def storage_span(it: Item):
    """(device, first byte, end) of the memory an item's tensor occupies."""
    t = it.tensor
    start = t.untyped_storage().data_ptr() + t.storage_offset() * it.itemsize
    return (t.device, start, start + it.nbytes)


def tie_key(it: Item) -> tuple:
    """Items with equal keys are one tensor under several names (tied weights):
    the same memory, dtype and shape, and the same conjugate and negative bits
    (x.conj() shares x's memory but holds other values)."""
    t = it.tensor
    return (storage_span(it), t.dtype, tuple(t.shape), t.is_conj(), t.is_neg())


def resolve_shared(items: list[Item], shared: str, what: str = "save_safetensors") -> tuple[list[Item], dict]:
    """(items to write, metadata {dropped name: kept name}). Tensors whose
    bytes overlap are refused, unless they are the same tensor under several
    names (tied weights) and shared="keep_one": then the name that comes first
    in the state dict is kept (a transformers model's input embedding, as
    save_pretrained keeps it), the others recorded as safetensors' save_model
    does."""
    if shared not in ("error", "keep_one"):
        raise InvalidArgumentError(f"shared={shared!r}: expected 'error' or 'keep_one'")
    spans = sorted(((storage_span(it), it) for it in items if it.nbytes), key=lambda x: (str(x[0][0]), x[0][1], x[0][2]))
    groups: list[list] = []
    end = None
    for (dev, b, e), it in spans:
        if groups and end is not None and end[0] == dev and b < end[1]:
            groups[-1].append(it)
            end = (dev, max(end[1], e))
        else:
            groups.append([it])
            end = (dev, e)
    position = {it.name: i for i, it in enumerate(items)}
    dropped: dict[str, str] = {}
    for g in groups:
        if len(g) < 2:
            continue
        names = sorted((it.name for it in g), key=position.__getitem__)
        same = len({tie_key(it) for it in g}) == 1
        if shared == "error" or not same:
            why = "tied weights" if same else "overlapping views of one storage"
            if not same and len({tie_key(it)[:3] for it in g}) == 1:
                why = "one is a conjugate or negative view of the other: other values in the same memory"
            hint = " (shared='keep_one' writes one of them)" if same else ""
            raise InvalidArgumentError(f"{what}: tensors {names} share memory ({why}){hint}")
        for n in names[1:]:
            dropped[n] = names[0]
    return [it for it in items if it.name not in dropped], dropped


def check_metadata(metadata, what: str = "save_safetensors") -> dict:
    if metadata is None:
        return {"format": "pt"}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgumentError("metadata must be a dict of str to str (safetensors' __metadata__)")
    for k, v in metadata.items():
        check_text(k, f"{what}: metadata key")
        check_text(v, f"{what}: metadata[{k!r}]")
    return {"format": "pt", **metadata}


def shard_plan(items: list[Item], max_shard_size) -> list[list[Item]]:
    """Items in shards of at most max_shard_size bytes (a tensor larger than that
    alone), in order, as Hugging Face's split_torch_state_dict_into_shards does."""
    if max_shard_size is None:
        return [items]
    if isinstance(max_shard_size, str):
        limit = units.parse_size(max_shard_size)
    elif isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool) and max_shard_size > 0:
        limit = max_shard_size
    else:
        raise InvalidArgumentError(f"max_shard_size={max_shard_size!r}: expected a positive int or a size like '5G'")
    shards: list[list[Item]] = [[]]
    size = 0
    for it in items:
        if shards[-1] and size + it.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.nbytes
    return shards


def file_order(items: list[Item]) -> list[Item]:
    """Largest element size first (stable): every tensor aligned to its element size."""
    return sorted(items, key=lambda it: -it.itemsize)


def header(items: list[Item], metadata: dict, what: str = "save_safetensors") -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple
    of DIRECT_ALIGN (of 8, safetensors' own, where that would pass the limit);
    items in file order. InvalidArgumentError if it is over MAX_HEADER_BYTES."""
    h: dict = {"__metadata__": metadata} if metadata else {}
    at = 0
    for it in items:
        h[it.name] = {"dtype": it.code, "shape": it.shape, "data_offsets": [at, at + it.nbytes]}
        at += it.nbytes
    text = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    total = -(-(8 + len(text)) // DIRECT_ALIGN) * DIRECT_ALIGN
    if total - 8 > MAX_HEADER_BYTES:
        total = -(-(8 + len(text)) // 8) * 8
    if total - 8 > MAX_HEADER_BYTES:
        raise InvalidArgumentError(
            f"{what}: the safetensors header of this file would be {total - 8:,} bytes ({len(items)} tensors), "
            f"over the {MAX_HEADER_BYTES:,} bytes safetensors (and ferry's loader) read: no reader could open "
            "the file. Use shorter metadata, or max_shard_size= to spread the tensors over several files")
    text += b" " * (total - 8 - len(text))
    return (total - 8).to_bytes(8, "little") + text


def _ring_pool(items):
    for it in items:
        if it.tensor.is_cuda:
            return default_pinned_pool(it.tensor.device.index)
    return pageable_pool()


class _Ring:
    """SLOTS slots of SLOT_BYTES from a ferry pool (freed with the ring)."""

    def __init__(self, pool, nbytes: int):
        count = max(1, min(SLOTS, -(-nbytes // SLOT_BYTES)))
        self.buffers = [pool.alloc(SLOT_BYTES, alignment=DIRECT_ALIGN) for _ in range(count)]
        self.views = [memoryview(b).cast("B") for b in self.buffers]
        self.addresses = [b.ptr for b in self.buffers]
        self.free: queue.Queue = queue.Queue()  # slots not being filled or written
        for i in range(count):
            self.free.put(i)

    def release(self) -> None:
        """Back to the pool now; a slot still viewed (by an error's traceback)
        goes back when its last view does. Never raises."""
        for v in self.views:
            try:
                v.release()
            except BufferError:
                pass
        self.views.clear()
        for b in self.buffers:
            try:
                b.release()
            except BufferError:
                pass
        self.buffers.clear()


def _fill(torch, ring: _Ring, slot: int, pieces) -> None:
    """Fills a slot from pieces [(slot offset, source, source offset, n)]: bytes
    (the header) or tensors; GPU pieces in one copy_many per device."""
    from ..copy import copy_many

    base = ring.addresses[slot]
    by_device: dict = {}
    for at, src, src_at, n in pieces:
        if isinstance(src, bytes):
            ring.views[slot][at : at + n] = src[src_at : src_at + n]
        elif src.is_conj() or src.is_neg():
            _resolve_into(torch, ring.views[slot], at, src, src_at, n)
        elif src.is_cuda:
            by_device.setdefault(src.device, []).append((base + at, src.data_ptr() + src_at, n))
        else:
            ctypes.memmove(base + at, src.data_ptr() + src_at, n)
    for dev, ops in by_device.items():
        copy_many([o[0] for o in ops], [o[1] for o in ops], [o[2] for o in ops],
                  stream=torch.cuda.current_stream(dev), device=dev.index)


def _resolve_into(torch, view, at: int, src, src_at: int, n: int) -> None:
    """Bytes [src_at, src_at + n) of the VALUES of a conjugate or negative view
    (its memory holds x, it means conj(x) or -x) into view[at:], by torch's
    copy (on the current stream for a GPU tensor): the slot, not a copy of the
    whole tensor. Pieces start and end on elements (file_order aligns every
    tensor to its element size, and slots are a power of two long)."""
    k = src.element_size()
    dst = torch.frombuffer(view, dtype=torch.uint8, count=n, offset=at).view(src.dtype)
    dst.copy_(src.reshape(-1)[src_at // k : (src_at + n) // k])


def _slot_pieces(stream, total: int):
    """Yields (file offset, length, pieces) per SLOT_BYTES of a stream of
    (source, nbytes) parts."""
    parts = iter(stream)
    src, left, src_at = None, 0, 0
    for off in range(0, total, SLOT_BYTES):
        n = min(SLOT_BYTES, total - off)
        pieces, at = [], 0
        while at < n:
            if left == 0:
                src, left = next(parts)
                src_at = 0
                continue
            k = min(left, n - at)
            pieces.append((at, src, src_at, k))
            at += k
            src_at += k
            left -= k
        yield off, n, pieces


def write_file(path: str, items: list[Item], head: bytes, *, durable: bool, pool=None,
               source=None) -> AtomicFile:
    """One safetensors file for path (items in file order, head: their
    header()), through writer threads into an AtomicFile, finished (written,
    fsynced) but not yet published under path; on any error its temporary file
    is removed.

    source: None (the tensors' bytes go through the ring), or a ferry Buffer
    whose first bytes are exactly the file's data section (a snapshot laid out
    in file order), written straight from it."""
    torch = _torch()
    data_len = sum(it.nbytes for it in items)
    total = len(head) + data_len
    f = AtomicFile(path, durable=durable)
    ring = None
    try:
        if source is None or len(head) > SLOT_BYTES:
            stream = [(head, len(head))] + [(it.tensor, it.nbytes) for it in items if it.nbytes]
            ring = _Ring(pool or _ring_pool(items), total)
            _pump(f, _ring_jobs(torch, ring, stream, total), ring)
        else:
            ring = _Ring(pool or _ring_pool(items), len(head))  # one slot: the header
            ring.views[0][: len(head)] = head
            _pump(f, _direct_jobs(ring, len(head), source, data_len), ring)
        f.finish(total)
    except BaseException:
        f.abort()
        raise
    finally:
        if ring is not None:
            ring.release()
    return f


def _padded(n: int) -> int:
    return -(-n // DIRECT_ALIGN) * DIRECT_ALIGN


def _ring_jobs(torch, ring: _Ring, stream, total: int):
    """Writes as (view, file offset, slot), filling each slot on this thread.
    The last view is padded to DIRECT_ALIGN (commit() cuts the file)."""
    for off, n, pieces in _slot_pieces(stream, total):
        slot = ring.free.get()
        _fill(torch, ring, slot, pieces)
        yield ring.views[slot][: _padded(n)], off, slot


def _direct_jobs(ring: _Ring, head_len: int, source, data_len: int):
    """The header (from ring slot 0), then the data straight from `source`
    (its size is a multiple of DIRECT_ALIGN: the last view is padded)."""
    yield ring.views[0][:head_len], 0, None
    view = memoryview(source).cast("B")
    try:
        for at in range(0, data_len, SLOT_BYTES):
            n = min(SLOT_BYTES, data_len - at)
            yield view[at : at + _padded(n)], head_len + at, None
    finally:
        view.release()


def _pump(f: AtomicFile, jobs, ring: _Ring) -> None:
    """Writes (view, file offset, slot or None) jobs on WRITERS threads, a slot
    going back to ring.free once written; re-raises the first error."""
    full: queue.Queue = queue.Queue(maxsize=SLOTS)
    errors: list = []  # the writers' exceptions (list.append is atomic)

    def writer():
        while True:
            job = full.get()
            if job is None:
                return
            try:
                if not errors:
                    f.pwrite(job[0], job[1])
            except BaseException as e:  # noqa: BLE001 - re-raised by the filling thread
                errors.append(e)
            slot = job[2]
            job = None  # drops the view before its slot is reused or released
            if slot is not None:
                ring.free.put(slot)

    threads = [threading.Thread(target=writer, name=f"ferry-save-{i}", daemon=True) for i in range(WRITERS)]
    for t in threads:
        t.start()
    try:
        for job in jobs:
            if errors:
                break
            full.put(job)
        job = None
    finally:
        jobs.close()
        for _ in threads:
            full.put(None)
        for t in threads:
            t.join()
    if errors:
        traceback.clear_frames(errors[0].__traceback__)  # its frames view the slots
        raise errors[0]


class Plan:
    """What one save writes, decided and checked before any byte is: ``files``
    [(path, items in file order, header)], and the index's bytes (sharded) or
    None."""

    def __init__(self, path: str, items: list[Item], metadata: dict, max_shard_size, what: str):
        if not path.endswith(".safetensors") and max_shard_size is not None:
            raise InvalidArgumentError(
                f"{what}: {path}: a sharded save needs a path ending in .safetensors (e.g. model.safetensors)")
        shards = shard_plan(items, max_shard_size)
        names = _publish.shard_names(path, len(shards))
        self.path = path
        self.index = _publish.index_bytes(shards, names) if len(shards) > 1 else None
        if self.index is not None:
            _publish.check_files(path, names + [path + _publish.INDEX_SUFFIX], what)
        ordered = [file_order(shard) for shard in shards]
        self.files = [(name, items, header(items, metadata, what)) for name, items in zip(names, ordered)]


def save_items(plan: Plan, durable: bool, pool=None, source=None) -> list[str]:
    """Writes a Plan; returns the files written. Every file is written and
    fsynced under its temporary name first, then published whole
    (ferry.torch.publish): a failure leaves the earlier checkpoint whole.
    Temporary files of dead writers in the directory are removed first
    (ferry.temp_names). source: see write_file (one file only)."""
    temp_names.remove_stale(os.path.dirname(plan.path))
    done: list[AtomicFile] = []
    try:
        for name, items, head in plan.files:
            done.append(write_file(name, items, head, durable=durable, pool=pool,
                                   source=source if len(plan.files) == 1 else None))
        if plan.index is not None:
            done.append(_publish.write_index(plan.path, plan.index, durable=durable))
    except BaseException:
        for f in done:
            f.abort()
        raise
    return _publish.publish(plan.path, done, durable=durable)


def prepare(obj, path, metadata, shared: str, what: str):
    """(checked path, items to write, metadata with the dropped ties recorded).
    A tie that the metadata cannot record (its name is a metadata key already:
    "format", or one of metadata=) is not dropped: written as a tensor of its
    own, it loses nothing."""
    path = check_replaceable(path)
    items = collect(obj, what)
    meta = check_metadata(metadata, what)
    kept, dropped = resolve_shared(items, shared, what)
    unrecorded = {k for k in dropped if k in meta}
    if unrecorded:
        kept = [it for it in items if it.name not in dropped or it.name in unrecorded]
    meta.update({k: v for k, v in dropped.items() if k not in unrecorded})
    return path, kept, meta


def save_safetensors(obj, path, *, metadata=None, max_shard_size=None, durable: bool = True,
                     shared: str = "error") -> list[str]:
    """Writes a state dict ({name: tensor}, CPU or CUDA tensors) as safetensors;
    returns the paths written.

    path: the file (``.../model.safetensors``): nothing, or a regular file
    (through a symbolic link: the file it names; the link stays); anything else
    (a device such as /dev/null, a FIFO, a socket, a directory) is refused
    (``ferry.atomic_file.writable_destination``). max_shard_size (bytes, or a
    size like '5G' = 5 GiB): shards of at most that many bytes (a larger tensor
    alone), named ``model-00001-of-0000N.safetensors`` beside path (with a tag
    of this save, ``...-of-0000N-1f2e3d4c.safetensors``, where an earlier
    checkpoint holds those names), plus ``model.safetensors.index.json`` (the
    Hugging Face layout); one shard is written as path itself. The checkpoint
    is published whole or not at all (``ferry.torch.publish``): the index or
    the single file is the commit point, then the earlier save's files of the
    same stem that this one does not use are removed.
    metadata: {str: str}, the header's ``__metadata__``; ``{"format": "pt"}`` is
    added (transformers requires it) unless given. durable: fsync each file and
    its directory before it is renamed into place (False: atomic against a
    crash of the process, not of the machine). shared: tensors that share
    memory are refused ("error", safetensors' save_file rule); "keep_one" writes
    tied weights (the same tensor under several names) once, under the name
    that comes first in obj (for a transformers model: the input embedding,
    the one save_pretrained keeps), and records the others in the metadata as
    {dropped: kept}, as safetensors' save_model does (a name the metadata
    already holds, such as "format", is written as a tensor instead).

    GPU tensors are read on their device's current stream: work queued there
    before the call is saved; the call returns once the files are written, so
    the tensors may change afterwards. Each file is written under a temporary
    name and renamed: on any error (bad input, a full disk, EIO) nothing under
    the final names is damaged, the temporary file is removed and the error (an
    ``InvalidArgumentError``, or an ``OSLayerError`` naming the file) is raised.
    A save first removes the temporary files that killed saves left in the
    directory (only those of writers that surely died: ``ferry.temp_names``).

    Conjugate and negative views (``x.conj()``, ``torch._neg_view``) are
    saved by value. A header over safetensors' 100,000,000-byte limit, a name
    or metadata that is not valid Unicode, a file name over NAME_MAX: refused
    before anything is written.
    """
    path, items, meta = prepare(obj, path, metadata, shared, "save_safetensors")
    return save_items(Plan(path, items, meta, max_shard_size, "save_safetensors"), durable)
