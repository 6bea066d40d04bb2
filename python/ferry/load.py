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

from . import _args, _device, _ferry
from ._per_device import PerDevice
from .bounded_read import Unreadable, read_regular_file
from .errors import InvalidArgumentError


class Loader:
    """A checkpoint loader for one GPU; its pinned slots are reused by every load.

    Loads from several threads on one Loader run one after the other."""

    def __init__(
        self,
        device: int | None = None,
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
            _device.index(device),
            staging_bytes=staging_bytes,
            slot_bytes=slot_bytes,
            threads=threads,
            direct_io=direct_io,
            progress=progress,
        )

    def load(self, files, ranges, stream: int = 0) -> dict:
        """Load `ranges` [(file_index, offset, nbytes, device_address)] of
        `files` (paths); returns the load's stats (bytes, seconds, ...)."""
        paths = _args.items(files, "files", "a list of paths")  # each checked by the native loader
        index, offsets, sizes, dsts = [], [], [], []
        for i, r in enumerate(_args.items(ranges, "ranges", "a list of (file_index, offset, nbytes, address)")):
            if not isinstance(r, (tuple, list)) or len(r) != 4:
                raise InvalidArgumentError(f"ranges[{i}]={_args.quote(r)}: expected (file_index, offset, nbytes, address)")
            f, off, n, dst = r
            f = _args.integer(f, f"ranges[{i}] file_index", 0, len(paths) - 1)
            index.append(f)
            offsets.append(_args.size(off, f"ranges[{i}] offset"))
            sizes.append(_args.size(n, f"ranges[{i}] nbytes"))
            dsts.append(_args.size(dst, f"ranges[{i}] address"))
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


_default_loaders: PerDevice[Loader] = PerDevice(Loader)  # forgotten in a forked child (_per_device.py)


def default_loader(device: int | None = None) -> Loader:
    """The process's Loader for `device` with the FERRY_LOAD_* defaults
    (created on first use; it keeps its pinned staging until
    release_default_loaders()). None: the current CUDA device (docs/api.md)."""
    return _default_loaders.get(_device.index(device))


def release_default_loaders() -> None:
    """Drop the default loaders: their pinned staging goes back to the OS
    (once no load is running); the next load creates a new one."""
    _default_loaders.clear()


def read_safetensors_header(path) -> dict:
    """A safetensors file's header: {header_bytes, data_offset, file_bytes,
    tensors: [(name, dtype, shape, begin, end)] in file order (offsets relative
    to data_offset), metadata: dict or None}. Strict: InvalidArgumentError
    names the file and the tensor."""
    return _ferry.read_safetensors_header(path)  # str, bytes or os.PathLike; any name the OS takes


def parse_safetensors_header(data: bytes, name: str = "<bytes>") -> dict:
    """The same for a whole safetensors file held in memory."""
    return _ferry.parse_safetensors_header(data, name)


def parse_shard_index(text: str | bytes, name: str = "model.safetensors.index.json") -> list:
    """[(tensor, shard file)] of a shard index's weight_map, in file order. `text` is
    a str (read with errors="surrogateescape" for names that are not UTF-8) or bytes;
    file names come back as os.fsdecode() makes them."""
    return _ferry.parse_shard_index(text, name)


# A shard index lists tensor names and file names: a few MB for the largest
# models. More is not an index (FERRY_* paths to /dev/zero read without end).
MAX_INDEX_BYTES = 64 << 20


def _read_index_text(path) -> tuple[str, str]:
    """(text, name) of a shard index file: a regular file of at most MAX_INDEX_BYTES
    (bounded_read: a FIFO, a device or a directory is refused at once)."""
    name = _checked_path(path)
    try:
        data = read_regular_file(path, MAX_INDEX_BYTES)
    except Unreadable as e:
        if "regular file" in e.reason:
            raise InvalidArgumentError(f"{name}: {e.reason} (a shard index is a JSON file)") from None
        if "more than" in e.reason:
            raise InvalidArgumentError(f"{name}: more than a shard index ({MAX_INDEX_BYTES} bytes at most)") from None
        raise InvalidArgumentError(f"{name}: the shard index: {e.reason}") from None
    return data.decode("utf-8", errors="surrogateescape"), name


def read_shard_index(path) -> tuple[list, list, list]:
    """A shard index file as columns (shards, tensors, shard_of): tensors[k]
    is in shards[shard_of[k]]; shards (names as written, relative to the
    index's directory) in first-seen order. Regular files of at most
    MAX_INDEX_BYTES only (see _read_index_text)."""
    text, name = _read_index_text(path)
    return _ferry.shard_index_columns(text, name)


def read_catalog(files, index_tensors=(), index_files=()) -> dict:
    """Every tensor of safetensors `files` (a path, or a list of paths: str, bytes or
    os.PathLike) as columns, in file order: {names, file (index into files), dtype
    (safetensors name), shape (tuple), offset (of the first byte, from the file's
    start), nbytes}. Checked: each header strictly, a tensor in two files, and an
    index's weight_map (index_tensors[k] is in files[index_files[k]]);
    InvalidArgumentError names the files and the tensor, or the argument that is
    not a path."""
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]  # one file, not its name's characters
    paths = [_checked_path(f, f"files[{i}]") for i, f in
             enumerate(_args.items(files, "files", "a path or a list of paths"))]
    return _ferry.read_catalog(paths, _args.items(index_tensors, "index_tensors", "a list of tensor names"),
                               _args.items(index_files, "index_files", "a list of indexes into files"))


def _checked_path(path, name: str = "path") -> str:
    """path (str, bytes or os.PathLike) as a str (os.fsdecode), or InvalidArgumentError."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise InvalidArgumentError(f"{name}={_args.quote(path)}: expected a path (str, bytes or os.PathLike)") from None
