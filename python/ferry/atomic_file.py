"""A file written whole or not at all: ``AtomicFile``.

The bytes go to a temporary file in the destination's directory
(``.NAME.ferry-tmp-PID-RANDOM``), written with ``os.pwrite`` (which releases
the GIL, so several Python threads write at once); ``commit()`` fsyncs it
(``durable=True``), renames it over the final name and fsyncs the directory.
Until ``commit()`` returns, the final name holds what it held before (or
nothing); ``abort()`` removes the temporary file. Several files that must
change together (a checkpoint's shards and index) are each ``finish()``ed
(written, fsynced), then ``publish()``ed (renamed) one after the other. A crash leaves at most a
temporary file behind, never a damaged file under the final name.

O_DIRECT: ``direct=True`` opens the temporary file with O_DIRECT where the file
system allows it (tmpfs refuses: the file is then written through the page
cache, and ``direct`` reads False). Direct writes need a buffer address, a
length and an offset that are multiples of ``DIRECT_ALIGN``; a write that the
file system refuses with EINVAL switches this file to buffered writes for good
(the remembered fallback). A file whose length is not a multiple of the
alignment is written padded and cut to its length in ``commit()``.

Every OS error becomes an ``OSLayerError`` (also an ``OSError``, with its
errno) naming the final file and the call that failed.

Locking: none. ``pwrite`` may be called from several threads at once (the OS
orders the writes; each thread writes its own range); ``open``/``commit``/
``abort`` from one thread, after the writers are done.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

from .errors import InvalidArgumentError, OSLayerError

DIRECT_ALIGN = 4096  # O_DIRECT: buffer, offset and length multiples (the logical block of any disk we met)


def check_destination(path) -> str:
    """The absolute path of a file to be written, or InvalidArgumentError: empty,
    an existing directory, or a directory that does not exist."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise InvalidArgumentError("path is empty")
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{path} is a directory (give the file's path)")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise InvalidArgumentError(f"{path}: directory {parent} does not exist")
    return path


def check_replaceable(path) -> str:
    """check_destination(path) for a file replaced whole by a rename (AtomicFile): the
    real path (a symbolic link is followed: the file it names is replaced, the link
    stays) where a regular file or nothing is, in a directory this process may write.
    Anything else there (a FIFO, a device, a socket, a directory) is refused with an
    InvalidArgumentError naming it, never opened or replaced."""
    path = os.path.realpath(check_destination(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise InvalidArgumentError(f"{path}: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise InvalidArgumentError(f"{path} is {_kind(mode)}, not a regular file (ferry writes a file whole "
                                   "and renames it into place: give a regular file's path)")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):  # a symbolic link into a directory that does not exist
        raise InvalidArgumentError(f"{path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"{path}: directory {directory} is not writable (a file in it is replaced "
                                   "by renaming a new one over it)")
    return path


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _os_error(e: OSError, path: str, call: str) -> OSLayerError:
    return OSLayerError(e.errno, f"{call} failed writing {path}: {e.strerror or e}")


class AtomicFile:
    """A temporary file that becomes `path` on commit() (see the module's text)."""

    def __init__(self, path: str, *, direct: bool = True, durable: bool = True):
        self.path = path
        self.durable = durable
        d, name = os.path.split(path)
        self.temp_path = os.path.join(d, f".{name}.ferry-tmp-{os.getpid()}-{secrets.token_hex(4)}")
        self.direct = False
        self.fd = -1
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            if direct and hasattr(os, "O_DIRECT"):
                try:
                    self.fd = os.open(self.temp_path, flags | os.O_DIRECT, 0o644)
                    self.direct = True
                except OSError as e:
                    if e.errno != errno.EINVAL:  # tmpfs: EINVAL; anything else is real
                        raise
            if self.fd < 0:
                self.fd = os.open(self.temp_path, flags, 0o644)
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
        old, self.fd, self.direct = self.fd, fd, False
        os.close(old)

    def commit(self, length: int) -> None:
        """finish(length), then publish(). On error the temporary file is removed."""
        self.finish(length)
        self.publish()

    def finish(self, length: int) -> None:
        """Cut to `length` bytes, fsync (durable) and close; the temporary file
        stays under its name until publish(). On error it is removed."""
        try:
            try:
                os.ftruncate(self.fd, length)
                if self.durable:
                    os.fsync(self.fd)
            except OSError as e:
                raise _os_error(e, self.path, "ftruncate/fsync") from e
            self._close()
        except BaseException:
            self.abort()
            raise

    def publish(self, fsync_dir: bool = True) -> None:
        """Rename over the final name; fsync the directory (durable and
        fsync_dir: several files of one directory fsync it once, after the
        last). On error the temporary file is removed."""
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
