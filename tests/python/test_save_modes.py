"""A checkpoint's permissions survive a save (issue 38, item 3): save_safetensors
and Snapshot.save keep the mode (and owner, where the process may) of the files
they replace, as ``open("wb")``, ``torch.save`` and ``save_file`` do; a new file
gets 0666 & ~umask, as ``open()`` makes it; a temporary file is never readable
by more users than the final one while it is written.

Real files, real umasks (set in child processes), random data."""

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

import ferry.torch as ft  # noqa: E402

ROOT = os.geteuid() == 0
OWNER = (4321, 8765)  # another user and group: only root can give a file to them


def raw(t):
    return bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def rand_sd(seed, n=6, size=1000):
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.w": torch.randn(size + i, generator=g) for i in range(n)}


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def checkpoint_files(path):
    """The files of the checkpoint at path: the single file, or the index and the shards it names."""
    index = f"{path}.index.json"
    if os.path.exists(index):
        names = set(json.loads(open(index).read())["weight_map"].values())
        return [index] + [os.path.join(os.path.dirname(path), n) for n in sorted(names)]
    return [path]


def read_back(path):
    out = {}
    for f in checkpoint_files(path):
        if f.endswith(".safetensors"):
            out.update({k: raw(v) for k, v in load_file(f).items()})
    return out


def save(how, sd, path):
    shard = 8100 if "sharded" in how else None  # 4000-byte tensors: three shards of two
    if how.startswith("snapshot"):
        return ft.snapshot(sd).save(path, max_shard_size=shard).wait()
    return ft.save_safetensors(sd, path, max_shard_size=shard)


HOWS = ["single", "sharded", "snapshot single", "snapshot sharded"]


@pytest.mark.parametrize("kept", [0o600, 0o640], ids=oct)
@pytest.mark.parametrize("how", HOWS + ["single->sharded", "sharded->single"])
def test_an_existing_checkpoint_keeps_its_mode_and_owner(tmp_path, kept, how):
    before, after = how.split("->") if "->" in how else (how, how)
    path = str(tmp_path / "model.safetensors")
    save(before, rand_sd(kept), path)
    for f in checkpoint_files(path):
        os.chmod(f, kept)
        if ROOT:
            os.chown(f, *OWNER)
    new = rand_sd(kept + 1)
    save(after, new, path)
    files = checkpoint_files(path)
    assert len(files) == (4 if "sharded" in after else 1)
    for f in files:
        assert mode(f) == kept, (os.path.basename(f), oct(mode(f)))
        if ROOT:
            assert (os.stat(f).st_uid, os.stat(f).st_gid) == OWNER, os.path.basename(f)
    assert read_back(path) == {k: raw(v) for k, v in new.items()}
    if len(files) == 1:  # replaced through a symbolic link: the file's mode, the link stays
        link = tmp_path / "link.safetensors"
        os.symlink(path, link)
        ft.save_safetensors(rand_sd(3), link)
        assert os.path.islink(link) and mode(path) == kept


_UMASK_CHILD = textwrap.dedent("""
    import json, os, stat, sys
    import torch
    import ferry.torch as ft
    os.umask(int(sys.argv[1], 8))
    d = sys.argv[2]
    g = torch.Generator().manual_seed(int(sys.argv[1], 8))
    sd = {f"w{i}": torch.randn(1000 + i, generator=g) for i in range(6)}
    ft.save_safetensors(sd, d + "/one.safetensors")
    ft.save_safetensors(sd, d + "/sharded.safetensors", max_shard_size=8100)
    ft.snapshot(sd).save(d + "/snap.safetensors").wait()
    ft.snapshot(sd).save(d + "/snapsharded.safetensors", max_shard_size=8100).wait()
    print(json.dumps({n: stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode) for n in os.listdir(d)}))
""")


@pytest.mark.parametrize("umask", [0o002, 0o077], ids=oct)
def test_a_new_checkpoint_follows_the_umask(tmp_path, umask):
    r = subprocess.run([sys.executable, "-c", _UMASK_CHILD, oct(umask)[2:], str(tmp_path)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr[-3000:]
    modes = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(modes) == 1 + 4 + 1 + 4, modes  # one file, index + 3 shards, twice; no lock, no temporary
    assert {n: oct(m) for n, m in modes.items()} == {n: oct(0o666 & ~umask) for n in modes}


def _watch_temporaries(d, seen, stop):
    """Records the mode of every temporary file seen in d until stop is set."""
    while not stop.is_set():
        for n in os.listdir(d):
            if ".ferry-tmp-" in n:
                try:
                    seen.append((n, stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode)))
                except FileNotFoundError:
                    pass


@pytest.mark.parametrize("final", [0o600, 0o640], ids=oct)
@pytest.mark.parametrize("how", ["single", "sharded"])
def test_a_temporary_file_is_never_more_readable_than_the_final_one(tmp_path, final, how):
    path = str(tmp_path / "big.safetensors")
    shard = 40 << 20 if how == "sharded" else None
    g = torch.Generator().manual_seed(final)
    sd = {f"t{i}": torch.randint(0, 255, (24 << 20,), dtype=torch.uint8, generator=g) for i in range(4)}
    ft.save_safetensors({"x": torch.zeros(3)}, path, max_shard_size=shard)
    for f in checkpoint_files(path):
        os.chmod(f, final)
    seen, stop = [], threading.Event()
    watcher = threading.Thread(target=_watch_temporaries, args=(str(tmp_path), seen, stop))
    watcher.start()
    try:
        for _ in range(3):
            save(how, sd, path)
    finally:
        stop.set()
        watcher.join()
    assert seen, "no temporary file seen while the save wrote it"
    wider = {(n, oct(m)) for n, m in seen if m & ~final}
    assert not wider, f"temporary files more open than the final {oct(final)}: {sorted(wider)[:4]}"
    assert {mode(f) for f in checkpoint_files(path)} == {final}
