"""Where ferry may write a file (``writable_destination``: the one path rule),
and a file written whole or not at all (``AtomicFile``).

The bytes go to a temporary file in the destination's directory
(``.NAME.ferry-tmp-PID-START-HOST-RANDOM``, cut to NAME_MAX: ``ferry.temp_names``,
which also removes those of writers that died), written with ``os.pwrite`` (which releases
the GIL, so several Python threads write at once); ``commit()`` fsyncs it
(``durable=True``), renames it over the final name and fsyncs the directory.
Until ``commit()`` returns, the final name holds what it held before (or
nothing); ``abort()`` removes the temporary file. Several files that must
change together (a checkpoint's shards and index) are each ``finish()``ed
(written, fsynced), then ``publish()``ed (renamed) one after the other. A crash
leaves at most a temporary file behind, never a damaged file under the final name.

O_DIRECT: ``direct=True`` opens the temporary file with O_DIRECT where the file
system allows it (tmpfs refuses: the file is then written through the page
cache, and ``direct`` reads False). Direct writes need a buffer address, a
length and an offset that are multiples of ``DIRECT_ALIGN``; a write that the
file system refuses with EINVAL switches this file to buffered writes for good
(the remembered fallback). A file whose length is not a multiple of the
alignment is written padded and cut to its length in ``commit()``.

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

Locking: none. ``pwrite`` may be called from several threads at once (the OS
orders the writes; each thread writes its own range); ``open``/``commit``/
``abort`` from one thread, after the writers are done.
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


def _os_error(e: OSError, path: str, call: str) -> OSLayerError:
    return OSLayerError(e.errno, f"{call} failed writing {path}: {e.strerror or e}")


class AtomicFile:
    """A temporary file that becomes `path` on commit() (see the module's text)."""

    def __init__(self, path: str, *, direct: bool = True, durable: bool = True, like=None):
        """like: the paths whose first regular file gives this one its mode and
        owner in finish() (default: [path]); none there: 0666 & ~umask."""
        self.path = path
        self.durable = durable
        self.like = [path] if like is None else list(like)
        self.temp_path = temp_names.temp_path(path)
        self.direct = False
        self.fd = -1
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            if direct and hasattr(os, "O_DIRECT"):
                try:
                    self.fd = os.open(self.temp_path, flags | os.O_DIRECT, 0o600)
                    self.direct = True
                except OSError as e:
                    if e.errno != errno.EINVAL:  # tmpfs: EINVAL; anything else is real
                        raise
            if self.fd < 0:
                self.fd = os.open(self.temp_path, flags, 0o600)
        except OSError as e:
            raise _os_error(e, path, "open (temporary file)") from e

    def pwrite(self, data, offset: int) -> None:
        """Write all of `data` (a bytes-like object) at `offset`. With O_DIRECT,
        data's address, length and offset must be multiples of DIRECT_ALIGN."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            try:
                n = os.pwrite(self.fd, view, offset)
            except OSError as e:
                if e.errno == errno.EINVAL and self.direct:
                    self._go_buffered()
                    continue
                raise _os_error(e, self.path, "pwrite") from e
            if n == 0:  # no progress and no errno: treat as a full disk
                raise OSLayerError(errno.ENOSPC, f"pwrite wrote 0 bytes to {self.path}")
            view = view[n:]
            offset += n

    def _go_buffered(self) -> None:
        """The file system refused a direct write: the same file, through the page cache."""
        try:
            fd = os.open(self.temp_path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error(e, self.path, "open (buffered fallback)") from e
        self.adopt_buffered(fd)

    def adopt_buffered(self, fd: int) -> None:
        """fd (this temporary file opened without O_DIRECT, now this object's)
        replaces the O_DIRECT descriptor: the fallback taken by someone else,
        e.g. save's C++ write pipeline (src/load/write_pipeline.h)."""
        old, self.fd, self.direct = self.fd, fd, False
        os.close(old)

    def commit(self, length: int) -> None:
        """finish(length), then publish(). On error the temporary file is removed."""
        self.finish(length)
        self.publish()

    def finish(self, length: int) -> None:
        """Cut to `length` bytes, give it the mode and owner of the file it
        replaces (see the module's text), fsync (durable) and close; the
        temporary file stays under its name until publish(). On error it is
        removed."""
        try:
            try:
                os.ftruncate(self.fd, length)
                give_mode(self.fd, self.like)
                if self.durable:
                    os.fsync(self.fd)
            except OSError as e:
                raise _os_error(e, self.path, "ftruncate/fchmod/fsync") from e
            self._close()
        except BaseException:
            self.abort()
            raise

    def publish(self, fsync_dir: bool = True) -> None:
        """Rename over the final name, if it still holds a regular file or
        nothing (else InvalidArgumentError: what came there since the path was
        checked is never replaced); fsync the directory (durable and fsync_dir:
        several files of one directory fsync it once, after the last). On error
        the temporary file is removed."""
        try:
            mode = os.lstat(self.path).st_mode
        except OSError:
            mode = None  # nothing there (or rename will say what is wrong)
        if mode is not None and not stat.S_ISREG(mode):
            self.abort()
            raise InvalidArgumentError(f"{self.path} became {describe(mode)} while it was written: "
                                       "not replaced (nothing was written there)")
        try:
            os.rename(self.temp_path, self.path)
        except OSError as e:
            self.abort()
            raise _os_error(e, self.path, "rename") from e
        if self.durable and fsync_dir:
            fsync_directory(os.path.dirname(self.path))

    def abort(self) -> None:
        """Close and remove the temporary file (never raises)."""
        self._close()
        try:
            os.unlink(self.temp_path)
        except OSError:
            pass

    def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError:
                pass


def umask() -> int:
    """This process's umask, read from /proc (setting it to read it would race
    with other threads creating files); os.umask where /proc does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def mode_of(like) -> tuple[int, int | None, int | None]:
    """(permission bits, uid, gid) of the first regular file of `like` (links
    followed), or (0666 & ~umask, None, None) where there is none: what a file
    replacing it gets."""
    for p in like:
        try:
            st = os.stat(p)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode):
            return st.st_mode & 0o777, st.st_uid, st.st_gid
    return 0o666 & ~umask(), None, None


def give_mode(fd: int, like) -> None:
    """fd gets mode_of(like): the owner first where permitted (fchown; EPERM,
    or EINVAL for an id this namespace cannot map: left as it is), then the
    mode (a file system without modes, EPERM/EOPNOTSUPP: left as it is)."""
    mode, uid, gid = mode_of(like)
    if uid is not None:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            for u, g in ((uid, gid), (-1, gid)):
                try:
                    os.fchown(fd, u, g)
                    break
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.EINVAL):
                        raise
    try:
        os.fchmod(fd, mode)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP):
            raise


def fsync_directory(directory: str) -> None:
    """fsync a directory, so that the renames in it survive a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(e, directory, "open (directory)") from e
    try:
        os.fsync(fd)
    except OSError as e:
        raise _os_error(e, directory, "fsync (directory)") from e
    finally:
        os.close(fd)
