"""A checkpoint's files and how a save makes them visible: whole, or not at all.

Layout (Hugging Face's): one file ``model.safetensors``, or shards
``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``,
whose weight_map names each tensor's shard. Readers that go through the index
(transformers' ``from_pretrained``, ferry's loader, safetensors with the index)
read the shards the index names, whatever they are called.

Every file is written and fsynced under its own temporary name first (several
saves to one path write at once, each its own files). Publication
(``publish``) then runs under the path's lock (``PathLock``: an exclusive
``flock`` on ``.NAME.ferry-lock`` beside the checkpoint, removed by its holder
when done), so that saves to one path publish one after the other, each whole:

1. a sharded save chooses its shards' names now, under the lock: Hugging
   Face's names when none of them exists, else the same names with this
   save's tag (``model-00001-of-00003-1f2e3d4c.safetensors``), so no file of
   the earlier checkpoint (nor of another save, which renames under the same
   lock) is replaced; it writes the index naming them (fsynced), renames the
   shards into place and fsyncs the directory;
2. the commit point: the index (sharded) or the single file is renamed over
   the earlier one, and the directory fsynced;
3. only then are the earlier checkpoint's files that the new one does not use
   removed (the files of the same stem: shards, the single file, an index),
   its shards first and its index last; the lock is released.

Two saves to one path (two ranks, a retry racing a slow save, two snapshots
saving at once): the one that takes the lock second replaces the first one's
checkpoint whole, as a save after it would; each returns the paths it
published (the first one's are gone by then). Within one
process, a save that started before another one that has already published is
not published over that newer checkpoint: it removes its files and returns the
paths of the newer one (as if it had been replaced at once). A save that waits
for the lock longer than ``LOCK_TIMEOUT`` (another save stopped while
publishing, e.g. by SIGSTOP) fails with an ``OSLayerError`` (ETIMEDOUT) naming
the lock and its holder, its files removed. A holder killed by SIGKILL leaves
its lock file, but no lock: the next save takes it. Where the file system has
no locks (ENOLCK, EOPNOTSUPP), saves are not serialized.

Where no index exists yet (the first sharded save, or one replacing a single
file), the new index is renamed first and the shards after it, the last shard
being the commit: a reader that globs ``*.safetensors`` when there is no index
(ferry's loader given the directory) would otherwise take a killed save's
first shards for a whole checkpoint, or mix them with the single file.

What a reader sees, wherever a save stops (an error, SIGKILL, a power loss):
before the commit, the earlier checkpoint, whole (new shards are files no
index names; an error removes every new file, a crash leaves them to the next
save's step 3), or an index that names a missing shard (refused by every
reader; only where there was no index before); after it, the new checkpoint
through the index or the single file. A single file replacing shards:
transformers prefers ``model.safetensors`` (the new one) to the index; ferry's
loader reads the index (the old checkpoint, whole) until step 3 takes the old
shards away, then refuses the index (a shard is missing) until it is removed
last. A sharded save replacing a single file: transformers reads the old file
until step 3 removes it. One index never names the files of two saves. A
reader that read the earlier index before the commit finds its shards removed
by step 3 (an error, not a mixture), unless two more saves came in between and
the second reused a name.

Locking: ``PathLock`` (a file lock, between processes and threads) is held
for steps 1-3 only; ``_published_lock`` guards ``_published`` (this process's
last publication per path), held for no call of ours and remade in a forked
child.

``publish_hook``: tests only. None, or a function called with ("rename", final
path) before each rename and ("remove", path) before each removal of steps 1-3,
so that a test can make a real failure (or SIGKILL) happen between two of them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import threading

from .. import _ferry, temp_names
from ..atomic_file import AtomicFile, check_replaceable, fsync_directory
from ..errors import InvalidArgumentError

INDEX_SUFFIX = ".index.json"
LOCK_SUFFIX = ".ferry-lock"
LOCK_TIMEOUT = 120.0  # seconds a save waits for another one's publication (a few renames and unlinks)
publish_hook = None  # tests: see the module's text

_tickets = itertools.count(1)  # each save's place in this process's order (next() is atomic)
_published_lock = threading.Lock()
_published: dict[str, tuple[int, list[str]]] = {}  # guarded by _published_lock: path -> (ticket, files)


def _forget_in_child() -> None:
    """After fork(), in the child: a lock another thread held stays with the parent."""
    global _published_lock
    _published_lock = threading.Lock()


# Not a ferry._per_device cache: the child keeps _published (the parent's publications stay true), only the lock is new.
os.register_at_fork(after_in_child=_forget_in_child)


def ticket() -> int:
    """This save's place in the process's order: taken when the save is asked
    for (in the caller's thread, also for a Snapshot.save), compared at its
    publication."""
    return next(_tickets)


def lock_path(path: str) -> str:
    """.NAME.ferry-lock beside path, NAME cut to fit NAME_MAX."""
    directory, name = os.path.split(path)
    head = os.fsencode("." + name)[: max(1, temp_names.name_max(directory) - len(LOCK_SUFFIX))]
    return os.path.join(directory, os.fsdecode(head) + LOCK_SUFFIX)


class PathLock:
    """The exclusive lock of a checkpoint path, held while a save publishes
    (see the module's text): flock on a lock file that its holder removes when
    done (a waiter that then holds the lock of a removed file opens the new one
    again); the calls and the bounded wait are C++'s (src/load/path_lock.h).
    ``with PathLock(path, timeout):``; OSLayerError ETIMEDOUT after
    `timeout` seconds, naming the holder."""

    def __init__(self, path: str, timeout: float | None = None):
        self.path = path
        self.lock = lock_path(path)
        self.timeout = LOCK_TIMEOUT if timeout is None else timeout
        self._native = None

    def __enter__(self) -> "PathLock":
        native = _ferry.PathLock(self.path, self.lock, f"process {os.getpid()} ({temp_names.writer_id()})")
        native.acquire(self.timeout)
        self._native = native
        return self

    def __exit__(self, *exc) -> None:
        native, self._native = self._native, None
        if native is not None:
            native.release()


def shard_names(path: str, count: int) -> list[str]:
    """path itself for one shard; else STEM-0000i-of-0000N.safetensors beside it,
    with this save's tag before the extension if any of those names exists."""
    if count == 1:
        return [path]
    d, name = os.path.split(path)
    stem = name[: -len(".safetensors")]
    plain = [os.path.join(d, f"{stem}-{i:05d}-of-{count:05d}.safetensors") for i in range(1, count + 1)]
    names = plain
    while any(os.path.lexists(p) for p in names):
        tag = secrets.token_hex(4)
        names = [p[: -len(".safetensors")] + f"-{tag}.safetensors" for p in plain]
    return names


def check_files(path: str, names: list[str], what: str) -> None:
    """Every file a save writes besides path (shards, the index) passes the
    path rule and sits in path's directory (a link to elsewhere is refused:
    an index names its shards relative to itself)."""
    d = os.path.dirname(path)
    for name in names:
        real = check_replaceable(name)
        if os.path.dirname(real) != d:
            raise InvalidArgumentError(f"{what}: {name} is a link to {real}, outside {d}: a checkpoint's files "
                                       "sit in one directory (remove the link)")


def index_bytes(shards: list[list], names: list[str]) -> bytes:
    """The index JSON of shards (lists of items with .name and .nbytes) in files `names`."""
    weight_map = {it.name: os.path.basename(f) for shard, f in zip(shards, names) for it in shard}
    total = sum(it.nbytes for shard in shards for it in shard)
    text = json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                      indent=2) + "\n"
    return text.encode("utf-8")


def mode_sources(path: str) -> list[str]:
    """The files whose mode and owner a new file of path's checkpoint takes
    (the first that exists; ferry.atomic_file.mode_of): its index, its single
    file."""
    return [path + INDEX_SUFFIX, path]


def write_index(path: str, data: bytes, *, durable: bool) -> AtomicFile:
    """The index, written and fsynced under its temporary name (not yet published)."""
    f = AtomicFile(path + INDEX_SUFFIX, direct=False, durable=durable, like=mode_sources(path))
    try:
        f.pwrite(data, 0)
    except BaseException:
        f.abort()
        raise
    f.finish(len(data))
    return f


def _step(action: str, path: str) -> None:
    if publish_hook is not None:
        publish_hook(action, path)


def publish(path: str, files: list[AtomicFile], shards: list[list] | None = None, *, durable: bool,
            order: int | None = None) -> list[str]:
    """Steps 1-3 of the module's text, under path's lock, for the finished
    files of one save: the single file, or the shards (their items in
    `shards`: the index is written here, naming them); returns the paths of
    the checkpoint now at path. order: the save's ticket() (None: now). An
    error before the commit removes every new file (temporary or renamed) and
    leaves the earlier checkpoint as it was."""
    order = ticket() if order is None else order
    try:
        with PathLock(path):
            with _published_lock:
                newer = _published.get(path)
            if newer is not None and newer[0] > order:  # a save asked for after this one is out already
                for f in files:
                    f.abort()
                return list(newer[1])
            if shards is not None:
                names = shard_names(path, len(shards))  # under the lock: no file has them
                check_files(path, names + [path + INDEX_SUFFIX], "save")
                for f, name in zip(files, names):
                    f.path = name
                files = files + [write_index(path, index_bytes(shards, names), durable=durable)]
            written = _publish(path, files, durable=durable)
            with _published_lock:
                if _published.get(path, (0,))[0] < order:
                    _published[path] = (order, written)
            return written
    except BaseException:
        for f in files:
            f.abort()  # the temporary files not renamed (a renamed one's name is gone: nothing removed)
        raise


def _publish(path: str, files: list[AtomicFile], *, durable: bool) -> list[str]:
    """Steps 1-3 (the lock held; the index, if any, last in files)."""
    order = list(files)
    if len(files) > 1 and not os.path.lexists(files[-1].path):
        order = files[-1:] + files[:-1]  # no index yet: the index first, the last shard commits
    *before, commit = order
    directory = os.path.dirname(commit.path)
    commit_inode = None  # to tell, after an error, whether the commit's rename took place
    renamed: list[str] = []
    try:
        commit_inode = os.lstat(commit.temp_path).st_ino
        for f in before:
            _step("rename", f.path)
            f.publish(fsync_dir=False)
            renamed.append(f.path)
        if durable and renamed:
            fsync_directory(directory)  # the other files are on disk before the commit
        _step("rename", commit.path)
        commit.publish(fsync_dir=False)
    except BaseException:
        for f in files:
            f.abort()  # the temporary files not renamed
        if not _is_inode(commit.path, commit_inode):  # (a Ctrl-C just after the commit's rename keeps it)
            for p in renamed:  # new names: nothing of the earlier checkpoint
                try:
                    _ferry.remove_file(p)
                except OSError:
                    pass
        raise
    if durable:
        fsync_directory(directory)
    written = [f.path for f in files]
    if path.endswith(".safetensors"):
        remove_earlier(path, written)
    return written


def _is_inode(path: str, inode: int | None) -> bool:
    try:
        return inode is not None and os.lstat(path).st_ino == inode
    except OSError:
        return False


def remove_earlier(path: str, written: list[str]) -> None:
    """Removes the regular files of path's stem that this save did not write
    (old shards, the old single file, the old index last), so that no reader
    picks them up. A link or anything else of that name is left alone."""
    d, name = os.path.split(path)
    stem = re.escape(name[: -len(".safetensors")])
    pattern = re.compile(rf"{stem}(-\d{{5}}-of-\d{{5}}(-[0-9a-f]{{8}})?)?\.safetensors({re.escape(INDEX_SUFFIX)})?")
    keep = {os.path.basename(p) for p in written}
    old = [n for n in os.listdir(d) if n not in keep and pattern.fullmatch(n)]
    for n in sorted(old, key=lambda n: n.endswith(INDEX_SUFFIX)):  # the index last
        p = os.path.join(d, n)
        try:
            if not os.path.isfile(p) or os.path.islink(p):
                continue
            _step("remove", p)
            _ferry.remove_file(p)  # False where another save removed it first
        except FileNotFoundError:
            pass
