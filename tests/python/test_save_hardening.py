"""save_safetensors, Snapshot.save and the path rule against what a newcomer tried
(issue 30, items 3-7 and the save parts of 9; issue 29's forked child): lazy
views saved by value, checkpoints published whole at every kill point, nothing
but regular files replaced, headers no reader could open refused, temporary
files of dead writers removed (never a live one's), clear errors for odd names.

Real files, real syscalls, real SIGKILLs; random data of odd sizes."""

import errno
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import ferry.torch as ft  # noqa: E402
from ferry import temp_names  # noqa: E402
from ferry.errors import InvalidArgumentError, OSLayerError  # noqa: E402
from checkpoint_readers import ferry_reader, index_reader, raw  # noqa: E402
from ferry.torch import publish as publish_mod  # noqa: E402
from ferry.torch import save as save_mod  # noqa: E402


def temps(d):
    return sorted(n for n in os.listdir(d) if ".ferry-tmp-" in n)


def rand_sd(g, n=6, lo=900, hi=1400):
    return {f"layers.{i}.w": torch.randn(int(torch.randint(lo, hi, (1,), generator=g)), generator=g)
            for i in range(n)}


def shard_sd(g, extra=0):
    """6 tensors of 4000-4024 bytes: three shards of two at max_shard_size=8100."""
    return {f"layers.{i}.w": torch.randn(1000 + i + extra, generator=g) for i in range(6)}


# ---- item 3: conjugate and negative views are saved by value -------------------------


@pytest.mark.parametrize("slot_bytes", [1 << 12, 32 << 20])
def test_conjugate_and_negative_views_are_saved_by_value(tmp_path, monkeypatch, slot_bytes):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", slot_bytes)  # 4 KiB: views cut across many slots
    g = torch.Generator().manual_seed(3)
    c = torch.randn(2 * 3001, generator=g).view(torch.complex64)  # odd sizes
    f = torch.randn(4097, generator=g)
    d = torch.randn(333, generator=g, dtype=torch.float64)
    c2 = torch.randn(2 * 999, generator=g).view(torch.complex64)
    sd = {"conj": c.conj(), "neg": torch._neg_view(f), "neg64": torch._neg_view(d),
          "conj_of_neg": torch._neg_view(c2).conj(), "plain": torch.randn(77, generator=g)}
    assert sd["conj"].is_conj() and sd["neg"].is_neg()
    want = {k: v.resolve_conj().resolve_neg() for k, v in sd.items()}
    p = tmp_path / "v.safetensors"
    ft.save_safetensors(sd, p)
    back = load_file(str(p))
    for k, v in want.items():
        assert raw(back[k]) == raw(v), k
    assert back["neg"][0].item() == -f[0].item() != 0
    ft.save_safetensors(sd, tmp_path / "s.safetensors", max_shard_size=20_000)  # sharded too
    index = json.loads((tmp_path / "s.safetensors.index.json").read_text())["weight_map"]
    for k, v in want.items():
        assert raw(load_file(str(tmp_path / index[k]))[k]) == raw(v), k
    # The same bytes as a snapshot's save (which copies values).
    ft.snapshot(sd).save(tmp_path / "snap.safetensors").wait()
    assert (tmp_path / "snap.safetensors").read_bytes() == p.read_bytes()


@pytest.mark.gpu
def test_gpu_conjugate_and_negative_views_are_saved_by_value(tmp_path, gpu, monkeypatch):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 12)
    g = torch.Generator().manual_seed(5)
    c = torch.randn(2 * 5003, generator=g).view(torch.complex64).cuda()
    f = torch.randn(3001, generator=g).cuda()
    sd = {"conj": c.conj(), "neg": torch._neg_view(f), "plain": torch.randn(99, generator=g).cuda()}
    ft.save_safetensors(sd, tmp_path / "g.safetensors")
    back = load_file(str(tmp_path / "g.safetensors"))
    for k, v in sd.items():
        assert raw(back[k]) == raw(v.resolve_conj().resolve_neg()), k
    ft.snapshot(sd).save(tmp_path / "s.safetensors").wait()
    assert (tmp_path / "s.safetensors").read_bytes() == (tmp_path / "g.safetensors").read_bytes()


def test_a_view_and_its_conjugate_are_not_tied(tmp_path):
    x = torch.randn(2 * 513).view(torch.complex64)
    sd = {"x": x, "x_conj": x.conj()}  # one memory, other values: not a tied weight
    with pytest.raises(InvalidArgumentError, match="conjugate or negative view"):
        ft.save_safetensors(sd, tmp_path / "t.safetensors", shared="keep_one")
    s = ft.snapshot(sd)  # copied twice, each by value
    s.save(tmp_path / "s.safetensors").wait()
    back = load_file(str(tmp_path / "s.safetensors"))
    assert raw(back["x"]) == raw(x) and raw(back["x_conj"]) == raw(x.conj().resolve_conj())


# ---- item 4: a checkpoint is published whole, at every point a save can stop ---------


def _transformers_reader(d):
    """from_pretrained's order: model.safetensors first, then the index."""
    single = d / "model.safetensors"
    if single.exists():
        return {k: raw(v) for k, v in load_file(str(single)).items()}
    return index_reader(d, missing_ok=True)


def _seen(reader, d, old, new):
    try:
        got = reader(d)
    except Exception as e:  # noqa: BLE001 - a refusal is not a mixture
        return f"error: {type(e).__name__}"
    if not got:
        return "nothing"
    if got == old:
        return "old"
    if got == new:
        return "new"
    return "MIXTURE"


SCENARIOS = {  # name: (old save's max_shard_size: None for one file, "none" for nothing; new one's)
    "sharded->sharded, same names": (8100, 8100),
    "sharded->sharded, other count": (4100, 8100),
    "single->sharded": (None, 8100),
    "sharded->single": (8100, None),
    "nothing->sharded": ("none", 8100),
}


def _wait(pid, seconds=60):
    """The status of child `pid`; a child that hangs is killed and the test fails."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child {pid} did not end within {seconds} s")


def _fork_save_killed_at(step, sd, path, shard):
    """In a forked child: save, with SIGKILL just before publication step `step`; the child's status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        try:
            calls = [0]

            def hook(action, p):
                if calls[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1

            publish_mod.publish_hook = hook
            ft.save_safetensors(sd, path, max_shard_size=shard)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(3)
    return _wait(pid)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_kill_point_leaves_one_whole_checkpoint(tmp_path, scenario):
    old_shard, new_shard = SCENARIOS[scenario]
    g = torch.Generator().manual_seed(len(scenario))
    old_sd, new_sd = shard_sd(g), shard_sd(g, extra=1)  # same names, other values
    old = None if old_shard == "none" else {k: raw(v) for k, v in old_sd.items()}
    new = {k: raw(v) for k, v in new_sd.items()}
    steps = []
    publish_mod.publish_hook = lambda action, p: steps.append(action)
    try:
        d0 = tmp_path / "count"
        d0.mkdir()
        if old is not None:
            ft.save_safetensors(old_sd, d0 / "model.safetensors", max_shard_size=old_shard)
        steps.clear()
        ft.save_safetensors(new_sd, d0 / "model.safetensors", max_shard_size=new_shard)
    finally:
        publish_mod.publish_hook = None
    assert steps.count("rename") == (4 if new_shard else 1)
    seen = set()
    for k in range(len(steps) + 1):
        d = tmp_path / f"kill{k}"
        d.mkdir()
        if old is not None:
            ft.save_safetensors(old_sd, d / "model.safetensors", max_shard_size=old_shard)
        status = _fork_save_killed_at(k, new_sd, str(d / "model.safetensors"), new_shard)
        if k < len(steps):
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, status)
        else:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        hf = _seen(_transformers_reader, d, old, new)
        via_index = _seen(lambda d: index_reader(d, missing_ok=True), d, old, new)
        mine = _seen(ferry_reader, d, old, new)
        if old is not None:  # an earlier checkpoint stays readable, whole, until the new one is
            assert hf in ("old", "new"), (k, hf)
        else:  # a first save: nothing, a refusal (an index naming a missing shard), or the new one
            assert hf in ("nothing", "new") or hf.startswith("error"), (k, hf)
        assert "MIXTURE" not in (via_index, mine), (k, via_index, mine)
        seen.add(hf)
        if k == len(steps):
            assert (hf, via_index, mine) == ("new", "new" if new_shard else "nothing", "new")
            assert temps(d) == []
            # The next save cleans what the killed ones left: only the new checkpoint's files.
        if k < len(steps):
            ft.save_safetensors(new_sd, d / "model.safetensors", max_shard_size=new_shard)
            assert _seen(ferry_reader, d, old, new) == "new" and temps(d) == []
            names = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values() \
                if new_shard else ["model.safetensors"]
            assert sorted(os.listdir(d)) == sorted(set(names) | ({"model.safetensors.index.json"} if new_shard
                                                                  else set()))
    assert {"old", "new"} <= seen if old is not None else "new" in seen


def _state(d):
    return {n: (d / n).read_bytes() if (d / n).is_file() else "dir" for n in os.listdir(d)}


@pytest.mark.parametrize("how, at", [("directory in the way", 0), ("directory in the way", 2),
                                     ("temporary file gone", 0), ("temporary file gone", 3)])  # 3: the index
def test_a_failed_rename_restores_the_earlier_checkpoint(tmp_path, how, at):
    g = torch.Generator().manual_seed(at)
    old_sd, new_sd = shard_sd(g), shard_sd(g, extra=2)
    path = tmp_path / "model.safetensors"
    ft.save_safetensors(old_sd, path, max_shard_size=8100)
    before = _state(tmp_path)
    calls = []

    def hook(action, p):
        if action == "rename" and len(calls) == at:
            if how == "directory in the way":
                os.mkdir(p)
                before[os.path.basename(p)] = "dir"
            else:  # the rename's source vanishes: rename(2) itself fails
                # (a shard's temporary file has the name planned before it was written; its final name, with
                # or without a tag, is chosen when it is published: match on STEM-0000i-of-0000N)
                m = re.fullmatch(r"(.*-\d{5}-of-\d{5})(-[0-9a-f]{8})?\.safetensors", os.path.basename(p))
                name = "." + (m[1] if m else os.path.basename(p) + ".ferry-tmp-")
                for n in os.listdir(tmp_path):
                    if n.startswith(name) and ".ferry-tmp-" in n:
                        os.unlink(tmp_path / n)
        calls.append(p)

    publish_mod.publish_hook = hook
    try:
        with pytest.raises((InvalidArgumentError, OSLayerError)) as e:
            ft.save_safetensors(new_sd, path, max_shard_size=8100)
    finally:
        publish_mod.publish_hook = None
    if how == "directory in the way":
        assert "became a directory" in str(e.value)
    else:
        assert e.value.errno == errno.ENOENT and "rename" in str(e.value)
    assert _state(tmp_path) == before and temps(tmp_path) == []
    assert _seen(ferry_reader, tmp_path, {k: raw(v) for k, v in old_sd.items()}, None) == "old"


# ---- item 5: one path rule; nothing but a regular file is ever replaced ---------------


def _specials(tmp_path):
    """{kind: path} of things that are not regular files, made privately in tmp_path."""
    out = {}
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # never a path under /dev
        out["a character device"] = node
    except PermissionError:
        pass
    os.mkfifo(tmp_path / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    out["a socket"] = tmp_path / "sock"
    (tmp_path / "dir.safetensors").mkdir()
    out["a directory"] = tmp_path / "dir.safetensors"
    link = tmp_path / "link-to-fifo"
    link.symlink_to(tmp_path / "fifo")
    out["a FIFO"] = [tmp_path / "fifo", link]  # a link to a FIFO: followed, and refused
    return out, s


def test_nothing_but_a_regular_file_is_replaced(tmp_path):
    sd = {"a": torch.randn(1001)}
    specials, sock = _specials(tmp_path)
    try:
        for kind, paths in specials.items():
            for p in paths if isinstance(paths, list) else [paths]:
                before = os.lstat(p)
                for save in (lambda: ft.save_safetensors(sd, p),
                             lambda: ft.snapshot(sd).save(p).wait(),
                             lambda: ft.save_safetensors(sd, str(p), max_shard_size=100)):
                    with pytest.raises(InvalidArgumentError, match=f"is {kind}"):
                        save()
                    after = os.lstat(p)
                    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino,
                                                                            before.st_rdev), p
        assert temps(tmp_path) == []
    finally:
        sock.close()
    # The files of a sharded save pass the rule too: a FIFO at the index's name.
    os.mkfifo(tmp_path / "m.safetensors.index.json")
    with pytest.raises(InvalidArgumentError, match="index.json is a FIFO"):
        ft.save_safetensors({"a": torch.randn(100), "b": torch.randn(100)}, tmp_path / "m.safetensors",
                            max_shard_size=400)
    assert not list(tmp_path.glob("m-*"))


def test_a_symbolic_link_is_followed_and_kept(tmp_path):
    sd = {"a": torch.randn(513)}
    target = tmp_path / "real.safetensors"
    target.write_bytes(b"old")
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    assert ft.save_safetensors(sd, link) == [str(target)]
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert raw(load_file(str(target))["a"]) == raw(sd["a"])
    dangling = tmp_path / "dangling.safetensors"
    dangling.symlink_to(tmp_path / "made.safetensors")
    ft.snapshot(sd).save(dangling).wait()
    assert dangling.is_symlink() and raw(load_file(str(tmp_path / "made.safetensors"))["a"]) == raw(sd["a"])


def test_what_appears_while_a_file_is_written_is_not_replaced(tmp_path):
    path = tmp_path / "m.safetensors"
    publish_mod.publish_hook = lambda action, p: os.mkfifo(p)
    try:
        with pytest.raises(InvalidArgumentError, match="became a FIFO"):
            ft.save_safetensors({"a": torch.randn(10)}, path)
    finally:
        publish_mod.publish_hook = None
    assert stat.S_ISFIFO(os.lstat(path).st_mode) and temps(tmp_path) == []


def test_the_rule_is_shared(tmp_path):
    from ferry.atomic_file import check_replaceable, writable_destination
    from ferry.doctor import html_report

    os.mkfifo(tmp_path / "f")
    assert writable_destination(tmp_path / "f", streams=True).kind == "stream"
    assert html_report.unwritable(tmp_path / "f") is None  # the doctor writes into a FIFO
    with pytest.raises(InvalidArgumentError, match="is a FIFO"):
        check_replaceable(tmp_path / "f")
    long = tmp_path / ("x" * 256)
    assert "NAME_MAX" in html_report.unwritable(long)
    with pytest.raises(InvalidArgumentError, match="NAME_MAX 255"):
        check_replaceable(long)
    assert writable_destination(tmp_path / "new").kind == "new"


# ---- item 6: a header no reader could open is refused ----------------------------------


def test_a_header_over_safetensors_limit_is_refused(tmp_path):
    sd = {"a": torch.randn(10)}
    p = tmp_path / "h.safetensors"
    with pytest.raises(InvalidArgumentError, match=r"100,00\d,\d{3} bytes .*over the 100,000,000 bytes"):
        ft.save_safetensors(sd, p, metadata={"big": "x" * 100_000_000})
    assert os.listdir(tmp_path) == []
    # Just under the limit, where 4 KiB padding would pass it: 8-byte padding, readable.
    fixed = len(json.dumps({"__metadata__": {"format": "pt", "big": ""},
                            "a": {"dtype": "F32", "shape": [10], "data_offsets": [0, 40]}}, separators=(",", ":")))
    ft.save_safetensors(sd, p, metadata={"big": "y" * (99_999_990 - fixed)})
    n = int.from_bytes(p.read_bytes()[:8], "little")
    assert 99_999_736 < n <= 100_000_000 and n % 8 == 0
    with safe_open(str(p), "pt") as f:
        assert raw(f.get_tensor("a")) == raw(sd["a"]) and len(f.metadata()["big"]) == 99_999_990 - fixed


# ---- item 7: temporary files of dead writers are removed, never a live one's --------


_KILLED_WRITER = textwrap.dedent("""
    import sys, torch, ferry.torch as ft
    sd = {f"t{i}": torch.randint(0, 255, (24 << 20,), dtype=torch.uint8) for i in range(2)}
    print("GO", flush=True)
    while True:
        ft.save_safetensors(sd, sys.argv[1])
""")


def test_a_killed_save_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    path = tmp_path / "model.safetensors"
    for _ in range(20):  # until a kill lands while a temporary file exists
        child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert child.stdout.readline() == b"GO\n"
        deadline = time.monotonic() + 60
        while not temps(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.0005)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if temps(tmp_path):
            break
    left = temps(tmp_path)
    assert left and all(f".ferry-tmp-{child.pid}-" in n for n in left)
    g = torch.Generator().manual_seed(7)
    sd = rand_sd(g)
    ft.save_safetensors(sd, tmp_path / "other.safetensors")  # any save into the directory
    assert temps(tmp_path) == []
    assert raw(load_file(str(tmp_path / "other.safetensors"))["layers.0.w"]) == raw(sd["layers.0.w"])


_LIVE_WRITER = textwrap.dedent("""
    import sys
    from ferry.atomic_file import AtomicFile
    f = AtomicFile(sys.argv[1], direct=False)
    f.pwrite(b"live", 0)
    print(f.temp_path, flush=True)
    sys.stdin.readline()
    f.commit(4)
    print("DONE", flush=True)
""")


def _start_ticks(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def test_a_live_writers_file_is_never_removed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", _LIVE_WRITER, str(tmp_path / "live.bin")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        temp = child.stdout.readline().decode().strip()
        assert os.path.exists(temp)
        sleeper = subprocess.Popen(["sleep", "60"])  # alive, but not the writer of the files below
        dead = subprocess.Popen(["true"])
        dead.wait()
        host = temp_names.writer_id().rsplit("-", 1)[1]
        mine = f"{os.getpid()}-{_start_ticks(os.getpid()):x}"
        names = {
            f".a.ferry-tmp-{mine}-{host}-0000000a": "kept",  # this process: alive
            f".b.ferry-tmp-{sleeper.pid}-{_start_ticks(sleeper.pid):x}-{host}-0000000b": "kept",
            f".c.ferry-tmp-{sleeper.pid}-{_start_ticks(sleeper.pid) - 1:x}-{host}-0000000c": "removed",  # pid reused
            f".d.ferry-tmp-{dead.pid}-1234-{host}-0000000d": "removed",  # exited
            f".e.ferry-tmp-{dead.pid}-1234-{int(host, 16) ^ 1:08x}-0000000e": "kept",  # another machine or namespace
            f".f.ferry-tmp-{dead.pid}-0000000f": "kept",  # an earlier ferry's name: cannot tell
        }
        for n in names:
            (tmp_path / n).write_bytes(b"x")
        (tmp_path / f".g.ferry-tmp-{dead.pid}-1234-{host}-0000000a").mkdir()  # not a regular file
        ft.save_safetensors({"a": torch.randn(5)}, tmp_path / "m.safetensors")
        assert os.path.exists(temp)  # the live writer's
        for n, fate in names.items():
            assert os.path.exists(tmp_path / n) == (fate == "kept"), n
        assert (tmp_path / f".g.ferry-tmp-{dead.pid}-1234-{host}-0000000a").is_dir()
        sleeper.kill()
        sleeper.wait()
        child.stdin.write(b"\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"DONE\n"
        assert (tmp_path / "live.bin").read_bytes() == b"live"
    finally:
        child.kill()
        child.wait()


# ---- item 9: clear errors for odd names; no tie dropped unrecorded -----------------


def test_a_lone_surrogate_is_a_clear_error(tmp_path):
    bad = "w\udc80eight"
    with pytest.raises(InvalidArgumentError, match=r"key 'w\\udc80eight' is not valid Unicode"):
        ft.save_safetensors({bad: torch.zeros(2)}, tmp_path / "s.safetensors")
    with pytest.raises(InvalidArgumentError, match="metadata key"):
        ft.save_safetensors({"a": torch.zeros(2)}, tmp_path / "s.safetensors", metadata={bad: "1"})
    with pytest.raises(InvalidArgumentError, match="snapshot: key"):
        ft.snapshot({bad: torch.zeros(2)})
    assert os.listdir(tmp_path) == []


def test_a_tie_that_metadata_cannot_record_is_written(tmp_path):
    w = torch.randn(33, 7)
    for name, metadata in (("format", None), ("step", {"step": "100"})):
        sd = {"embed": w, name: w, "other": torch.randn(3)}
        p = tmp_path / f"{name}.safetensors"
        ft.save_safetensors(sd, p, shared="keep_one", metadata=metadata)
        back = load_file(str(p))
        assert set(back) == {"embed", name, "other"} and raw(back[name]) == raw(w) == raw(back["embed"])
        with safe_open(str(p), "pt") as f:
            assert f.metadata() == {"format": "pt", **(metadata or {})}
        ft.snapshot(sd).save(p, shared="keep_one", metadata=metadata).wait()
        assert set(load_file(str(p))) == {"embed", name, "other"}
    # A tie that can be recorded still is (safetensors' save_model convention).
    ft.save_safetensors({"embed": w, "head": w}, tmp_path / "t.safetensors", shared="keep_one")
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "head": "embed"} and list(f.keys()) == ["embed"]


def test_a_long_file_name_the_os_takes(tmp_path):
    sd = {"a": torch.randn(100)}
    name = "n" * (250 - len(".safetensors")) + ".safetensors"
    assert len(name) == 250
    ft.save_safetensors(sd, tmp_path / name)
    ft.snapshot(sd).save(tmp_path / name).wait()
    assert raw(load_file(str(tmp_path / name))["a"]) == raw(sd["a"])
    assert temp_names.temp_path(str(tmp_path / name)).startswith(str(tmp_path / ".nnn"))
    assert len(os.path.basename(temp_names.temp_path(str(tmp_path / name)))) == 255
    with pytest.raises(InvalidArgumentError, match="NAME_MAX"):  # its shards' names would be too long
        ft.save_safetensors({"a": torch.randn(100), "b": torch.randn(100)}, tmp_path / name, max_shard_size=400)
    assert sorted(os.listdir(tmp_path)) == [name]


def test_snapshot_save_errors_name_snapshot_save(tmp_path):
    w = torch.randn(4)
    s = ft.snapshot({"a": w, "b": w})
    with pytest.raises(InvalidArgumentError, match=r"^Snapshot.save: tensors \['a', 'b'\] share memory") as e:
        s.save(tmp_path / "t.safetensors")
    assert "save_safetensors" not in str(e.value)


# ---- issue 29: a forked child saves --------------------------------------------------


def test_a_forked_child_saves(tmp_path):
    g = torch.Generator().manual_seed(29)
    ft.save_safetensors(rand_sd(g), tmp_path / "parent.safetensors")  # the parent's pool exists
    sd = rand_sd(g, n=5, lo=30_000, hi=90_000)
    pid = os.fork()
    if pid == 0:
        try:
            # torch's own CPU copies (the snapshot's) hang in a forked child once the
            # parent used OpenMP: one thread, as torch's DataLoader workers do.
            torch.set_num_threads(1)
            ft.save_safetensors(sd, str(tmp_path / "child.safetensors"))
            ft.snapshot(sd).save(str(tmp_path / "child-snap.safetensors")).wait()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"child: {type(e).__name__}: {e}\n".encode())
            os._exit(3)
    status = _wait(pid)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    for f in ("child.safetensors", "child-snap.safetensors"):
        back = load_file(str(tmp_path / f))
        assert set(back) == set(sd) and all(raw(back[k]) == raw(v) for k, v in sd.items())
    ft.save_safetensors(sd, tmp_path / "again.safetensors")  # the parent's pool still works
