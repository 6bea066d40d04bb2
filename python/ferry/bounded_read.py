"""Reading a small file ferry was pointed at, safely: the one rule for every file ferry
reads by name in Python (a shard index, the machine profile the doctor checks, an
earlier `ferry bench --json` file). C++ keeps the same rule in src/os/file.h.

Only a regular file is read, and at most `limit` bytes of it: a FIFO is opened with
O_NONBLOCK, so opening it never waits for a writer, and it is refused like a device,
a socket or a directory; a file over the limit (or growing past it while read) is
refused, so `/dev/zero` or a huge file cannot take the process's memory.
"""

from __future__ import annotations

import errno
import os
import stat


class Unreadable(Exception):
    """Why a file was not read: `reason` is a short phrase for the caller's message
    ("not a regular file", "cannot open it: Permission denied", ...); `missing` is
    True when nothing is there (ENOENT, ENOTDIR)."""

    def __init__(self, reason: str, missing: bool = False):
        super().__init__(reason)
        self.reason, self.missing = reason, missing


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def read_regular_file(path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (str, bytes or os.PathLike), at most
    `limit` of them; Unreadable otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        missing = e.errno in (errno.ENOENT, errno.ENOTDIR)
        raise Unreadable(f"cannot open it: {e.strerror or e}", missing) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _kind(st.st_mode)
            raise Unreadable(kind if kind == "not a regular file" else f"{kind}, not a regular file")
        if st.st_size > limit:
            raise Unreadable(f"{st.st_size} bytes, more than {limit}")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:  # the file may grow after fstat
            chunk = os.read(fd, min(limit + 1 - total, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise Unreadable(f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise Unreadable(f"more than {limit} bytes")
    return b"".join(chunks)
