"""State dicts to safetensors files: ``save_safetensors``.

One file, or shards plus an index in the Hugging Face layout
(``model-00001-of-00003.safetensors`` ..., ``model.safetensors.index.json``),
that ``safetensors.safe_open``, ferry's loader and transformers'
``from_pretrained`` read bit-exact.

How: Python describes each file's layout (its header bytes, then each
tensor's address, bytes and device in file order: ``_layout``) and hands it
to C++ in one call (``AtomicFile.save``: src/load/save_file.h), which does the
rest with the GIL released and no call back into Python: a small ring of
slots (``SLOT_BYTES`` x ``SLOTS``, from a ferry pool: pinned where a tensor is
on a GPU, pageable otherwise) is filled in file order (host bytes by memcpy;
GPU bytes by the copy engine on a stream per device that first waits for the
device's current torch stream, src/cuda/load/file_writer.h) while ``WRITERS``
C++ threads write the filled slots into the temporary file (O_DIRECT where
the file system allows it, the buffered fallback in one place:
src/load/atomic_file.h); then the file is cut, given its mode and owner and
fsynced. A slot that lies inside one host tensor whose memory there is 4 KiB
aligned (a snapshot laid out as its file: ``source=``) is written straight
from that memory. Host memory the save adds: the ring, whatever the state
dict's size. A save in a daemon thread at interpreter exit is safe by
construction: C++ holds every buffer and descriptor it uses (the file, the
ring's pool, a copy of the layout) until it returns and touches no Python
object meanwhile.

On our CPU machine (2 cores, ext4), 0.8 GB of CPU bf16 tensors took 0.40 s
(2.0 GB/s, the disk's O_DIRECT rate in the same session) with Python writer
threads, ``safetensors.torch.save_file`` plus fsync 2.7 s. 1.07 GB of CPU
uint8 tensors, same session: 0.461 s with the Python writers, 0.466 s with
the C++ pipeline (the disk is the bound either way; median of 5).

What goes in the file (items, header, order, shards, ties):
``ferry.torch.file_layout``; how the files replace the earlier checkpoint
whole: ``ferry.torch.publish``.

Locking: ``_pageable_pool`` is made once per process under its own lock (a
forked child forgets the parent's and makes its own: ferry._per_device). Each save's slots
belong to that save (C++); no CUDA call is made under a lock.
"""

from __future__ import annotations

import os

from .. import _ferry, temp_names
from .._per_device import PerDevice
from ..atomic_file import AtomicFile
from ..pool import Pool
from . import publish as _publish
from .file_layout import Item, Plan, prepare
from .pinned import default_pinned_pool

# The ring: 8 slots of 32 MiB. A slot is one write; 4 writers keep 4 of them in
# flight (O_DIRECT needs queue depth to reach a disk's speed), while the C++
# filler queues the next ones (a GPU slot: ~0.6 ms at 55 GB/s; the disk: ~16 ms).
SLOT_BYTES = 32 << 20
SLOTS = 8
WRITERS = 4
RESERVE = True  # fallocate each file's blocks before writing it (src/load/atomic_file.h: AtomicFile::reserve)

# The ring for CPU-only saves: one pageable pool per process (key None), forgotten in a forked child.
_pageable_pool: PerDevice[Pool] = PerDevice(lambda _: Pool())


def pageable_pool() -> Pool:
    """The process's pageable ferry pool for CPU-only saves and snapshots (made on first use)."""
    return _pageable_pool.get(None)


def host_pool(items: list[Item]) -> Pool:
    """The pool for host copies of these items' bytes (the ring, a snapshot):
    the process's pinned pool of the first GPU tensor's device, else
    pageable_pool()."""
    for it in items:
        if it.tensor.is_cuda:
            return default_pinned_pool(it.tensor.device.index)
    return pageable_pool()


def _layout(items: list[Item], keep: list) -> tuple[list, list]:
    """The file's parts [(address, nbytes, device or -1)] in file order, and
    the devices to read from [(device, engine, None: the device's current
    torch stream, taken in C++ as copy_many takes it)].
    Conjugate and negative views (their memory holds x, they mean conj(x) or
    -x) are resolved into a copy of that tensor alone (on its device's
    current stream), kept alive in `keep` for the save."""
    parts, devices = [], {}
    for it in items:
        if not it.nbytes:
            continue
        t = it.tensor
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
            keep.append(t)
        device = t.device.index if t.is_cuda else -1
        if device >= 0 and device not in devices:
            devices[device] = (device, _ferry.engine(device), None)
        parts.append((t.data_ptr(), it.nbytes, device))
    return parts, list(devices.values())


def write_file(path: str, items: list[Item], head: bytes, *, durable: bool, pool=None,
               source=None, like=None) -> AtomicFile:
    """One safetensors file for path (items in file order, head: their
    header()), written whole by C++ (``AtomicFile.save``: see the module's
    text), finished (written, fsynced) but not yet published under path; on
    any error its temporary file is removed.

    source: None (the tensors' bytes), or a ferry Buffer whose first bytes
    are exactly the file's data section (a snapshot laid out in file order,
    its size a multiple of 4 KiB), written straight from it. like: the files
    whose mode and owner it takes (AtomicFile; default: path)."""
    f = AtomicFile(path, durable=durable, like=like)
    keep: list = []  # resolved views: alive until the save returns
    try:
        if source is not None:
            parts, devices = [(source.ptr, sum(it.nbytes for it in items), -1)], []
        else:
            parts, devices = _layout(items, keep)
        f.save(head, parts, pool or host_pool(items), devices, slot_bytes=SLOT_BYTES, slots=SLOTS, writers=WRITERS,
               reserve=RESERVE)
    except BaseException:
        f.abort()
        raise
    return f


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
