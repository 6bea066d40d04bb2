"""A checkpoint's files and how a save makes them visible: whole, or not at all.

Layout (Hugging Face's): one file ``model.safetensors``, or shards
``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``,
whose weight_map names each tensor's shard. Readers that go through the index
(transformers' ``from_pretrained``, ferry's loader, safetensors with the index)
read the shards the index names, whatever they are called.

Publication (``publish``), after every file was written and fsynced under its
temporary name:

1. a sharded save renames its shards into place under names that no file of
   the earlier checkpoint has: Hugging Face's names when none of them exists,
   else the same names with this save's tag (``model-00001-of-00003-1f2e3d4c.
   safetensors``); the directory is fsynced;
2. the commit point: the index (sharded) or the single file is renamed over
   the earlier one, and the directory fsynced;
3. only then are the earlier checkpoint's files that the new one does not use
   removed (the files of the same stem: shards, the single file, an index),
   its shards first and its index last.

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
until step 3 removes it. One index never names the files of two saves.

``publish_hook``: tests only. None, or a function called with ("rename", final
path) before each rename and ("remove", path) before each removal of steps 1-3,
so that a test can make a real failure (or SIGKILL) happen between two of them.
"""

from __future__ import annotations

import json
import os
import re
import secrets

from ..atomic_file import AtomicFile, check_replaceable, fsync_directory
from ..errors import InvalidArgumentError

INDEX_SUFFIX = ".index.json"
publish_hook = None  # tests: see the module's text


def shard_names(path: str, count: int) -> list[str]:
    """path itself for one shard; else STEM-0000i-of-0000N.safetensors beside it,
    with this save's tag before the extension if any of those names exists."""
    if count == 1:
        return [path]
    d, name = os.path.split(path)
    stem = name[: -len(".safetensors")]
    plain = [os.path.join(d, f"{stem}-{i:05d}-of-{count:05d}.safetensors") for i in range(1, count + 1)]
    if not any(os.path.lexists(p) for p in plain):
        return plain
    tag = secrets.token_hex(4)
    return [p[: -len(".safetensors")] + f"-{tag}.safetensors" for p in plain]


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


def write_index(path: str, data: bytes, *, durable: bool) -> AtomicFile:
    """The index, written and fsynced under its temporary name (not yet published)."""
    f = AtomicFile(path + INDEX_SUFFIX, direct=False, durable=durable)
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


def publish(path: str, files: list[AtomicFile], *, durable: bool) -> list[str]:
    """Steps 1-3 of the module's text for the finished files of one save (the
    shards, then the index; or the single file); returns their paths. An error
    before the commit removes every new file (temporary or renamed) and leaves
    the earlier checkpoint as it was."""
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
                    os.unlink(p)
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
            os.unlink(p)
        except FileNotFoundError:
            pass
