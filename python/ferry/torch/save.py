"""State dicts to safetensors files: ``save_safetensors``.

One file, or shards plus an index in the Hugging Face layout
(``model-00001-of-00003.safetensors`` ..., ``model.safetensors.index.json``),
that ``safetensors.safe_open``, ferry's loader and transformers'
``from_pretrained`` read bit-exact.

How: each file is a stream of bytes (header, then every tensor's bytes) cut
into slots of a small ring (``SLOT_BYTES`` x ``SLOTS``, from a ferry pool:
pinned where a tensor is on a GPU, pageable otherwise; reused by every save of
the process), written by the loader's twin in C++
(``_ferry.write_file_range``, src/load/write_pipeline.h). The caller's thread
fills the slots in file order (``_fill``, called by the pipeline with the GIL
held): GPU bytes by ``ferry.copy_many`` on each device's current torch stream
(so the copy waits for the work queued there before the call), CPU bytes by
memmove. Writer threads (C++, ``WRITERS`` of them, never taking the GIL)
``pwrite`` full slots while the next ones fill, into an ``AtomicFile``
(``ferry.atomic_file``: temporary name, O_DIRECT where the file system allows
it, fsync, rename, directory fsync); a direct write the file system refuses
switches the file to buffered writes (the pipeline opens the buffered
descriptor, the AtomicFile adopts it). Host memory the save adds: the ring,
whatever the state dict's size. A snapshot (``ferry.torch.snapshot``) laid out
as its file's data is written straight from its memory (``source=``): the
header by the AtomicFile, then the same pipeline with slots that are views of
the snapshot's memory (nothing copied).

On our CPU machine (2 cores, ext4), 0.8 GB of CPU bf16 tensors took 0.40 s
(2.0 GB/s, the disk's O_DIRECT rate in the same session) with Python writer
threads, ``safetensors.torch.save_file`` plus fsync 2.7 s. 1.07 GB of CPU
uint8 tensors, same session: 0.461 s with the Python writers, 0.466 s with
the C++ pipeline (the disk is the bound either way; median of 5).

What goes in the file (items, header, order, shards, ties):
``ferry.torch.file_layout``; how the files replace the earlier checkpoint
whole: ``ferry.torch.publish``.

Locking: ``_lock`` guards ``_pageable_pool`` (made once per process: a forked
child drops the parent's reference and makes its own). Each save's slots
belong to that save; their states (free, filling, in flight until written)
are the pipeline's ``SlotRing`` (core/slot_ring.h), whose locks are held for
no call of ours. No CUDA call is made under a lock.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .. import _ferry, temp_names
from ..atomic_file import DIRECT_ALIGN, AtomicFile
from ..pool import Pool
from . import publish as _publish
from ._torch import torch_module as _torch
from .file_layout import Item, Plan, prepare
from .pinned import default_pinned_pool

# The ring: 8 slots of 32 MiB. A slot is one pwrite; 4 writers keep 4 of them in
# flight (O_DIRECT needs queue depth to reach a disk's speed), while the caller's
# thread fills the next ones (a GPU slot: ~0.6 ms at 55 GB/s; the disk: ~16 ms).
SLOT_BYTES = 32 << 20
SLOTS = 8
WRITERS = 4

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


def host_pool(items: list[Item]) -> Pool:
    """The pool for host copies of these items' bytes (the ring, a snapshot):
    the process's pinned pool of the first GPU tensor's device, else
    pageable_pool()."""
    for it in items:
        if it.tensor.is_cuda:
            return default_pinned_pool(it.tensor.device.index)
    return pageable_pool()


class _Slots:
    """The ring's memory: SLOTS slots of SLOT_BYTES (fewer for a small file)
    from a ferry pool, DIRECT_ALIGN aligned, freed with release(). Their
    states are the write pipeline's (core/slot_ring.h: free, filling, in
    flight until its pwrite is done)."""

    def __init__(self, pool, nbytes: int):
        count = max(1, min(SLOTS, -(-nbytes // SLOT_BYTES)))
        self.buffers = [pool.alloc(SLOT_BYTES, alignment=DIRECT_ALIGN) for _ in range(count)]
        self.views = [memoryview(b).cast("B") for b in self.buffers]
        self.addresses = [b.ptr for b in self.buffers]

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


def _fill(torch, ring: _Slots, slot: int, pieces) -> None:
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
               source=None, like=None) -> AtomicFile:
    """One safetensors file for path (items in file order, head: their
    header()), through the write pipeline into an AtomicFile, finished
    (written, fsynced) but not yet published under path; on any error its
    temporary file is removed.

    source: None (the tensors' bytes go through the ring), or a ferry Buffer
    whose first bytes are exactly the file's data section (a snapshot laid out
    in file order, its size a multiple of DIRECT_ALIGN), written straight from
    it. like: the files whose mode and owner it takes (AtomicFile; default:
    path)."""
    torch = _torch()
    data_len = sum(it.nbytes for it in items)
    total = len(head) + data_len
    f = AtomicFile(path, durable=durable, like=like)
    ring = None
    try:
        if source is None or len(head) > SLOT_BYTES:
            stream = [(head, len(head))] + [(it.tensor, it.nbytes) for it in items if it.nbytes]
            ring = _Slots(pool or host_pool(items), total)
            pieces = _slot_pieces(stream, total)

            def fill(slot: int, offset: int, n: int) -> None:
                at, length, parts = next(pieces)
                if (at, length) != (offset, n):
                    raise RuntimeError(f"save: slot for bytes [{offset}, {offset + n}) of {path} came for "
                                       f"[{at}, {at + length}) (a ferry bug: please report it)")
                _fill(torch, ring, slot, parts)

            _write(f, 0, total, ring.addresses, fill)
        else:
            f.pwrite(head, 0)
            base = source.ptr - len(head)  # file offset -> address in source
            count = max(1, min(SLOTS, -(-data_len // SLOT_BYTES)))
            _write(f, len(head), data_len, [source.ptr] * count, lambda slot, offset, n: base + offset)
        f.finish(total)
    except BaseException:
        f.abort()
        raise
    finally:
        if ring is not None:
            ring.release()
    return f


def _write(f: AtomicFile, offset: int, nbytes: int, slots: list[int], fill) -> None:
    """Bytes [offset, offset + nbytes) of f by the write pipeline: fill(slot,
    file offset, n) fills a slot (returns None) or returns the address of the
    bytes (a view); WRITERS threads pwrite them, the last one padded to
    DIRECT_ALIGN where f is O_DIRECT (finish() cuts the file)."""
    r = _ferry.write_file_range(f.fd, f.direct, f.temp_path, f.path, offset, nbytes, slots, SLOT_BYTES, fill,
                                WRITERS)
    if r["buffered_fd"] >= 0:
        f.adopt_buffered(r["buffered_fd"])


def save_items(plan: Plan, durable: bool, pool=None, source=None, order: int | None = None) -> list[str]:
    """Writes a Plan; returns the files of the checkpoint now at plan.path.
    Every file is written and fsynced under its temporary name first, then
    published whole under the path's lock (ferry.torch.publish: a failure
    leaves the earlier checkpoint whole; saves to one path publish one after
    the other). Temporary files of dead writers in the directory are removed
    first (ferry.temp_names). source: see write_file (one file only). order:
    the save's publish.ticket(), taken when it was asked for (None: now).
    Each file takes the mode and owner of the file it replaces, else of the
    checkpoint's index or single file, else 0666 & ~umask."""
    order = _publish.ticket() if order is None else order
    temp_names.remove_stale(os.path.dirname(plan.path))
    sources = _publish.mode_sources(plan.path)
    done: list[AtomicFile] = []
    try:
        for name, items, head in plan.files:
            done.append(write_file(name, items, head, durable=durable, pool=pool,
                                   source=source if len(plan.files) == 1 else None,
                                   like=[name] + [p for p in sources if p != name]))
    except BaseException:
        for f in done:
            f.abort()
        raise
    shards = [items for _, items, _ in plan.files] if plan.index is not None else None
    return _publish.publish(plan.path, done, shards, durable=durable, order=order)


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
    Saves to one path (two processes, two threads) write at once and publish
    one after the other under the path's lock: the later replaces the
    earlier whole (``ferry.torch.publish``). Each file keeps the mode and
    owner of the file it replaces; a new checkpoint's get 0666 & ~umask.

    Conjugate and negative views (``x.conj()``, ``torch._neg_view``) are
    saved by value. A header over safetensors' 100,000,000-byte limit, a name
    or metadata that is not valid Unicode, a file name over NAME_MAX: refused
    before anything is written.
    """
    path, items, meta = prepare(obj, path, metadata, shared, "save_safetensors")
    return save_items(Plan(path, items, meta, max_shard_size, "save_safetensors"), durable)
