"""Reading a small file ferry was pointed at, safely: the one rule for every file ferry
reads by name in Python (a shard index, the machine profile the doctor checks, an
earlier `ferry bench --json` file). C++ keeps the same rule in src/os/file.h, and does the reading.

Only a regular file is read, and at most `limit` bytes of it: a FIFO is opened with
O_NONBLOCK, so opening it never waits for a writer, and it is refused like a device,
a socket or a directory; a file over the limit (or growing past it while read) is
refused, so `/dev/zero` or a huge file cannot take the process's memory. The reading
is src/os's (``_ferry.read_regular_file``: the loader's open, fstat and pread loop).
"""

from __future__ import annotations

from . import _ferry


class Unreadable(Exception):
    """Why a file was not read: `reason` is a short phrase for the caller's message
    ("not a regular file", "cannot open it: Permission denied", ...); `missing` is
    True when nothing is there (ENOENT, ENOTDIR)."""

    def __init__(self, reason: str, missing: bool = False):
        super().__init__(reason)
        self.reason, self.missing = reason, missing


def read_regular_file(path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (str, bytes or os.PathLike), at most
    `limit` of them; Unreadable otherwise."""
    data, reason, missing = _ferry.read_regular_file(path, limit)
    if data is None:
        raise Unreadable(reason, missing)
    return data
