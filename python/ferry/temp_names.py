"""Names of the temporary files ferry writes, and the removal of those whose writer died.

A file written whole or not at all (``ferry.atomic_file.AtomicFile``) lives under a
temporary name in its final directory until it is renamed into place:

    .NAME.ferry-tmp-PID-START-HOST-RANDOM

- PID: the writer's process id; START: its start time (clock ticks after boot,
  field 22 of /proc/PID/stat, in hex), so that a pid the kernel has since given
  to another process is told apart from the writer;
- HOST: 8 hex digits of a hash of the boot id and the writer's PID namespace: a
  pid means something only on the same machine, in the same boot and namespace
  (checkpoint directories are often shared by containers or over NFS);
- RANDOM: 8 hex digits (one writer writes several files at once).

NAME is cut (whole bytes, from its end) so that the name fits the file system's
NAME_MAX: a 250-byte file name the OS accepts gets a temporary name too. The
fields after NAME make the name unique, so the cut loses nothing.

A save killed with SIGKILL (or a machine that lost power) leaves its temporary
file behind. ``remove_stale(directory)`` (run by each save before it writes)
removes such a file only when every one of these holds, and never otherwise:
its name parses; its HOST is this process's (else ferry cannot tell whether the
writer lives); it is a regular file; and /proc/PID/stat is gone or shows
another start time (the writer has exited: its pid is free or was reused). A
live writer's file (a zombie's too) is never touched. Files of other machines,
boots or containers, and those of ferry versions before this naming
(``.NAME.ferry-tmp-PID-RANDOM``), are left alone: remove them by hand.

Where /proc cannot tell this process's pid and start time (no /proc, or a /proc
of another PID namespace), the name carries zeros and nothing is removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat

from . import _ferry

_MARK = ".ferry-tmp-"
_TEMP = re.compile(r"\.ferry-tmp-(?P<pid>\d+)-(?P<start>[0-9a-f]+)-(?P<host>[0-9a-f]{8})-[0-9a-f]{8}\Z")
_UNKNOWN_HOST = "00000000"
_identity: tuple[int, str, str] | None = None  # (pid, START, HOST) of this process, made by writer_id()


def _start_ticks(pid) -> int | None:
    """The start time of process `pid` ("self" or a pid: field 22 of /proc/PID/stat,
    read by src/os), None if there is no such process. Other errors (EACCES, a /proc
    of another shape) raise OSError."""
    return _ferry.process_start_ticks(0 if pid == "self" else int(pid))


def _host_tag() -> str:
    """8 hex digits naming this boot and PID namespace, or zeros if unknown."""
    try:
        boot = _ferry.boot_id()
        namespace = _ferry.pid_namespace()  # EXDEV: /proc of another PID namespace, its pids are not ours
    except OSError:
        return _UNKNOWN_HOST
    return hashlib.sha256(boot + b"\0" + namespace).hexdigest()[:8]


def writer_id() -> str:
    """PID-START-HOST of this process (recomputed in a forked child)."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        host = _host_tag()
        try:
            start = _start_ticks("self") if host != _UNKNOWN_HOST else None
        except (OSError, ValueError, IndexError):
            start = None
        if start is None:
            host, start = _UNKNOWN_HOST, 0
        _identity = (pid, format(start, "x"), host)
    return f"{pid}-{_identity[1]}-{_identity[2]}"


def name_max(directory: str) -> int:
    """The longest file name (bytes) the file system of `directory` takes (NAME_MAX)."""
    try:
        return os.pathconf(directory or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def temp_path(path: str) -> str:
    """A new temporary name for `path` (absolute), in its directory, that fits NAME_MAX."""
    directory, name = os.path.split(path)
    tail = f"{_MARK}{writer_id()}-{secrets.token_hex(4)}"
    head = os.fsencode("." + name)[: max(1, name_max(directory) - len(tail))]
    return os.path.join(directory, os.fsdecode(head) + tail)


def _writer_gone(pid: int, start: int) -> bool:
    """True only when process `pid` with start time `start` surely no longer runs."""
    try:
        now = _start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return False  # cannot tell: keep the file
    return now is None or now != start


def stale_temporaries(directory: str) -> list[str]:
    """The names in `directory` that remove_stale would remove now (see the module's text)."""
    host = writer_id().rsplit("-", 1)[1]
    if host == _UNKNOWN_HOST:
        return []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if _MARK not in name or not name.startswith("."):
            continue
        m = _TEMP.search(name)
        if m is None or m["host"] != host:
            continue
        if not _writer_gone(int(m["pid"]), int(m["start"], 16)):
            continue
        try:
            if stat.S_ISREG(os.lstat(os.path.join(directory, name)).st_mode):
                found.append(name)
        except OSError:
            continue
    return found


def remove_stale(directory: str) -> list[str]:
    """Removes the temporary files of dead writers in `directory` (see the module's
    text); returns the names removed. Never raises: a file that cannot be removed
    stays."""
    removed = []
    for name in stale_temporaries(directory):
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    return removed
