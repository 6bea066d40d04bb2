"""Where ferry may write a file (``writable_destination``: the one path rule),
and a file written whole or not at all (``AtomicFile``).

``AtomicFile`` describes; C++ does the work (src/load/atomic_file.h, through
``_ferry.AtomicFile``; the system calls in src/os/file_replace.h). The bytes
go to a temporary file in the destination's directory
(``.NAME.ferry-tmp-PID-START-HOST-RANDOM``, cut to NAME_MAX: ``ferry.temp_names``,
which also removes those of writers that died); ``commit()`` fsyncs it
(``durable=True``), renames it over the final name and fsyncs the directory.
Until ``commit()`` returns, the final name holds what it held before (or
nothing); ``abort()`` removes the temporary file. Several files that must
change together (a checkpoint's shards and index) are each ``finish()``ed
(written, fsynced), then ``publish()``ed (renamed) one after the other. A crash
leaves at most a temporary file behind, never a damaged file under the final name.

O_DIRECT, in one place for every writer (C++): ``direct=True`` opens the
temporary file with O_DIRECT where the file system allows it (tmpfs refuses:
the file is then written through the page cache, and ``direct`` reads False);
a write that the file system refuses with EINVAL switches the file to
buffered writes for good (the remembered fallback). A save's whole file is
written by ``save()`` (``ferry.torch.save``: the layout handed to C++).

Mode and owner: the temporary file is created 0600 (never readable by more
users than the final file while it is written); ``finish()`` gives it, before
its fsync, the permission bits (0777) and owner of the file it replaces (the
first regular file of ``like``, default the final name itself: a 0600
checkpoint stays 0600, as ``open("wb")``, ``torch.save`` and ``save_file``
keep it), or 0666 & ~umask for a new file, as ``open()`` makes it. The owner is
kept where this process may (``fchown``: root, or a group it is in); where it
may not, the file is this process's, with the same mode.

Every OS error becomes an ``OSLayerError`` (also an ``OSError``, with its
errno) naming the final file and the call that failed.

Locking: none here. ``pwrite`` may be called from several threads at once
(each thread writes its own range); ``open``/``commit``/``abort`` from one
thread, after the writers are done.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

from . import _ferry, temp_names
from .errors import InvalidArgumentError, OSLayerError

# O_DIRECT: buffer, offset and length multiples; the loader's own (src/os/file.h:
# kDirectIoAlignment, 4 KiB, a multiple of every logical block Linux disks report).
DIRECT_ALIGN = _ferry.DIRECT_IO_ALIGNMENT


class Destination(NamedTuple):
    """Where a file is written: ``path`` (absolute) and ``kind``: "new" (nothing
    there), "file" (a regular file, replaced atomically) or "stream" (a character
    device or FIFO, written into; only with streams=True)."""

    path: str
    kind: str


def writable_destination(path, *, streams: bool = False) -> Destination:
    """THE path rule for every file ferry writes (checkpoints, snapshots, the
    doctor's page, bench JSON), checked before anything is measured or written.

    Nothing there, or a regular file: written under a temporary name beside it
    and renamed over it (``path`` is then the real path). A symbolic link is
    followed, as ``open()`` and ``torch.save`` do: the file it names is replaced,
    the link stays (a dangling link: the file it names is created). A character
    device or a FIFO: refused, or with streams=True written into, never replaced
    (``path`` as given: /dev/stdout keeps working). Refused: an empty path, a
    directory, a block device, a socket, a parent that is not a directory, a file
    name longer than the file system's NAME_MAX (InvalidArgumentError, naming
    what is there); a directory this process cannot write (OSLayerError, EACCES
    or EROFS). AtomicFile.publish checks again just before its rename."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    path = os.fspath(path)
    path = os.fsdecode(path) if isinstance(path, bytes) else path
    if not path:
        raise InvalidArgumentError("path is empty (give the file's path)")
    path = os.path.abspath(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except FileNotFoundError:
        mode = None  # nothing, or a link to nothing
    except OSError as e:  # ELOOP, ENOTDIR, EACCES on the way
        if e.errno != errno.ENAMETOOLONG:
            raise InvalidArgumentError(f"{path}: {e.strerror or e}") from None
        mode = None  # _check_directory says which name is too long
    if mode is not None and not stat.S_ISREG(mode):
        if streams and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            return Destination(path, "stream")
        where = "a regular file, a character device or a FIFO" if streams else "a regular file, replaced atomically"
        raise InvalidArgumentError(f"{path} is {describe(mode)}: ferry writes this file only to {where} "
                                   "(give another path)")
    real = os.path.realpath(path)
    _check_directory(real)
    return Destination(real, "new" if mode is None else "file")


def check_replaceable(path) -> str:
    """writable_destination(path).path for a writer of regular files only (a
    checkpoint, a bench JSON file): the real path of the file to create or
    replace, or InvalidArgumentError / OSLayerError saying why not."""
    return writable_destination(path).path


def describe(mode: int) -> str:
    """What a file of this st_mode is, for messages ("a directory", "a FIFO", ...)."""
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def _check_directory(path: str) -> None:
    """path's directory exists, takes its name (NAME_MAX) and lets this process create files."""
    parent, name = os.path.split(path)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise InvalidArgumentError(f"{path}: {parent} is not a directory")
        raise InvalidArgumentError(f"{path}: directory {parent} does not exist")
    limit = temp_names.name_max(parent)
    size = len(os.fsencode(name))
    if size > limit:
        raise InvalidArgumentError(f"{path}: the file name is {size} bytes, longer than this file system takes "
                                   f"(NAME_MAX {limit}): give a shorter name")
    if not os.access(parent, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        code = errno.EACCES
        try:
            if os.statvfs(parent).f_flag & os.ST_RDONLY:
                code = errno.EROFS
        except OSError:
            pass
        raise OSLayerError(code, f"cannot write {path}: directory {parent} is not writable ({os.strerror(code)})")


class AtomicFile:
    """A temporary file that becomes `path` on commit() (see the module's text)."""

    def __init__(self, path: str, *, direct: bool = True, durable: bool = True, like=None):
        """like: the paths whose first regular file gives this one its mode and
        owner in finish() (default: [path]); none there: 0666 & ~umask."""
        self.durable = durable
        self.like = [path] if like is None else list(like)
        self._native = _ferry.AtomicFile(path, temp_names.temp_path(path), bool(direct), bool(durable))

    @property
    def path(self) -> str:
        """The final name (a shard's is set when it is published)."""
        return self._native.path

    @path.setter
    def path(self, value: str) -> None:
        self._native.path = value

    @property
    def temp_path(self) -> str:
        return self._native.temp_path

    @property
    def direct(self) -> bool:
        """Writes go O_DIRECT (False: buffered, from the start or since a refused direct write)."""
        return self._native.direct

    @property
    def fd(self) -> int:
        """The descriptor (still this object's). Kept only for the doctor's page
        (doctor/html_report.py), whose fchmod finish() now does: remove with it."""
        return self._native.fd

    def pwrite(self, data, offset: int) -> None:
        """Write all of `data` (a bytes-like object) at `offset`."""
        self._native.write(data, offset)

    def save(self, header: bytes, parts, pool, devices, *, slot_bytes: int, slots: int, writers: int,
             reserve: bool = True) -> dict:
        """The whole file from its layout, then finish() (src/load/save_file.h;
        ferry.torch.save describes the arguments). On error the temporary file
        is removed."""
        return self._native.save(header, parts, pool._native, devices, slot_bytes, slots, writers, self.like, reserve)

    def commit(self, length: int) -> None:
        """finish(length), then publish(). On error the temporary file is removed."""
        self.finish(length)
        self.publish()

    def finish(self, length: int) -> None:
        """Cut to `length` bytes, give it the mode and owner of the file it
        replaces (see the module's text), fsync (durable) and close; the
        temporary file stays under its name until publish(). On error it is
        removed."""
        self._native.finish(length, self.like)

    def publish(self, fsync_dir: bool = True) -> None:
        """Rename over the final name, if it still holds a regular file or
        nothing (else InvalidArgumentError: what came there since the path was
        checked is never replaced); fsync the directory (durable and fsync_dir:
        several files of one directory fsync it once, after the last). On error
        the temporary file is removed."""
        self._native.publish(fsync_dir)

    def abort(self) -> None:
        """Close and remove the temporary file (never raises)."""
        self._native.abort()


def mode_of(like) -> tuple[int, int | None, int | None]:
    """(permission bits, uid, gid) of the first regular file of `like` (links
    followed), or (0666 & ~umask, None, None) where there is none: what a file
    replacing it gets."""
    return _ferry.replaced_mode([os.fspath(p) for p in like])


def fsync_directory(directory: str) -> None:
    """fsync a directory, so that the renames in it survive a crash."""
    _ferry.sync_directory(directory)
