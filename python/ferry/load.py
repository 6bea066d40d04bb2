"""Byte ranges of files to GPU memory, and the safetensors format.

``Loader`` moves (file, offset, nbytes, device address) ranges into device
memory: several reader threads read into a small ring of pinned staging slots
while the previous slots' DMAs run, so the host memory a load adds is the
staging size (``staging_bytes``, 512 MiB by default), never the file. Files
mostly absent from the page cache are read with O_DIRECT (``direct_io``:
"auto", "never", "always"). A load is
synchronous and starts after the work queued on ``stream``; an error (short
file, read error, CUDA error) fails the whole load and names the file and the
byte range. Defaults come from the FERRY_LOAD_* options (``ferry options``).

``ferry.torch.load_safetensors`` builds on it; ``read_safetensors_header``,
``parse_safetensors_header`` and ``parse_shard_index`` are ferry's strict
parsers (errors name the file and the tensor).
"""

from __future__ import annotations

import os
import threading

from . import _ferry
from .errors import InvalidArgumentError


class Loader:
    """A checkpoint loader for one GPU; its pinned slots are reused by every load.

    Loads from several threads on one Loader run one after the other."""

    def __init__(
        self,
        device: int = 0,
        *,
        staging_bytes: int | None = None,
        slot_bytes: int | None = None,
        threads: int | None = None,
        direct_io: str | None = None,
        progress: bool | None = None,
    ):
        self.last_stats: dict | None = None  # the stats of the last load call
        self._busy = threading.Lock()  # the native loader runs one load at a time
        self._native = _ferry.Loader(
            device,
            staging_bytes=staging_bytes,
            slot_bytes=slot_bytes,
            threads=threads,
            direct_io=direct_io,
            progress=progress,
        )

    def load(self, files, ranges, stream: int = 0) -> dict:
        """Load `ranges` [(file_index, offset, nbytes, device_address)] of
        `files` (paths); returns the load's stats (bytes, seconds, ...)."""
        paths = [os.fspath(f) for f in files]
        index, offsets, sizes, dsts = [], [], [], []
        for r in ranges:
            if len(r) != 4:
                raise InvalidArgumentError(f"a range is (file_index, offset, nbytes, address), got {r!r}")
            f, off, n, dst = r
            if not 0 <= f < len(paths):
                raise InvalidArgumentError(f"range {r!r} names file {f} of {len(paths)}")
            index.append(f)
            offsets.append(off)
            sizes.append(n)
            dsts.append(dst)
        return self.load_ranges(paths, index, offsets, sizes, dsts, stream)

    def load_ranges(self, files, file_index, offsets, sizes, addresses, stream: int = 0) -> dict:
        """The same as ``load``, the ranges given as four lists of ints of one
        length (range i: ``file_index[i]``, ``offsets[i]``, ``sizes[i]``,
        ``addresses[i]``): no tuple per range, for checkpoints of thousands of
        tensors. A file index out of range is an InvalidArgumentError."""
        paths = [os.fspath(f) for f in files]
        with self._busy:
            self.last_stats = self._native.load(paths, file_index, offsets, sizes, addresses, stream)
            return self.last_stats

    device = property(lambda self: self._native.device)
    staging_bytes = property(lambda self: self._native.staging_bytes)
    slot_bytes = property(lambda self: self._native.slot_bytes)
    threads = property(lambda self: self._native.threads)
    direct_io = property(lambda self: self._native.direct_io)


_default_loaders: dict[int, Loader] = {}
_default_lock = threading.Lock()


def default_loader(device: int = 0) -> Loader:
    """The process's Loader for `device` with the FERRY_LOAD_* defaults
    (created on first use; it keeps its pinned staging until
    release_default_loaders())."""
    with _default_lock:
        loader = _default_loaders.get(device)
        if loader is None:
            loader = _default_loaders[device] = Loader(device)
        return loader


def release_default_loaders() -> None:
    """Drop the default loaders: their pinned staging goes back to the OS
    (once no load is running); the next load creates a new one."""
    with _default_lock:
        _default_loaders.clear()


def read_safetensors_header(path) -> dict:
    """A safetensors file's header: {header_bytes, data_offset, file_bytes,
    tensors: [(name, dtype, shape, begin, end)] in file order (offsets relative
    to data_offset), metadata: dict or None}. Strict: InvalidArgumentError
    names the file and the tensor."""
    return _ferry.read_safetensors_header(os.fspath(path))


def parse_safetensors_header(data: bytes, name: str = "<bytes>") -> dict:
    """The same for a whole safetensors file held in memory."""
    return _ferry.parse_safetensors_header(bytes(data), name)


def parse_shard_index(text: str, name: str = "model.safetensors.index.json") -> list:
    """[(tensor, shard file)] of a shard index's weight_map, in file order."""
    return _ferry.parse_shard_index(text, name)


def read_shard_index(path) -> tuple[list, list, list]:
    """A shard index file as columns (shards, tensors, shard_of): tensors[k]
    is in shards[shard_of[k]]; shards (names as written, relative to the
    index's directory) in first-seen order."""
    path = os.fspath(path)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    return _ferry.shard_index_columns(text, os.fsdecode(path))


def read_catalog(files, index_tensors=(), index_files=()) -> dict:
    """Every tensor of safetensors `files` as columns, in file order:
    {names, file (index into files), dtype (safetensors name), shape (tuple),
    offset (of the first byte, from the file's start), nbytes}. Checked: each
    header strictly, a tensor in two files, and an index's weight_map
    (index_tensors[k] is in files[index_files[k]]); InvalidArgumentError names
    the files and the tensor."""
    return _ferry.read_catalog([os.fspath(f) for f in files], list(index_tensors), list(index_files))
