"""Saves that race for one checkpoint path (issue 38, item 4): two processes that
save at once (two ranks; a retry racing a slow save), two threads, two snapshots
of one process. One save wins whole, or the other fails with a ferry error that
says why: never a checkpoint mixed of two saves, never an index naming shards
another save removed, and the earlier checkpoint is removed only once a whole
new one replaced it (also when a save is killed with SIGKILL mid-write, or
while it holds the path's lock).

Real processes, real files, real flock, real SIGKILLs; random data per save."""

import errno
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

import ferry.torch as ft  # noqa: E402
from ferry.errors import FerryError  # noqa: E402
from checkpoint_readers import ferry_reader, index_reader, raw  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def race_sd(round_, who, count=32, elems=1 << 17):
    """32 float32 tensors of 512 KiB, random per (round, saver): at 1 MiB a shard, 16 shards."""
    g = torch.Generator().manual_seed(1000 * round_ + who)
    return {f"layers.{i}.w": torch.randn(elems, generator=g) for i in range(count)}


def which(reader, d, candidates):
    """The name of the candidate (name -> {tensor: bytes}) that reader finds in d whole, or what else it found."""
    try:
        got = reader(d)
    except Exception as e:  # noqa: BLE001 - what it was is the answer
        return f"error: {type(e).__name__}: {e}"
    for name, want in candidates.items():
        if got == want:
            return name
    mixed = {name: sum(got.get(k) == v for k, v in want.items()) for name, want in candidates.items()}
    return f"MIXTURE {mixed}"


def leftovers(d, stem="model"):
    """Files in d other than the checkpoint the index names (orphan shards, temporaries, a lock)."""
    index = d / f"{stem}.safetensors.index.json"
    named = set(json.loads(index.read_text())["weight_map"].values()) | {index.name} if index.exists() else set()
    return sorted(set(os.listdir(d)) - named)


_RACER = textwrap.dedent("""
    import json, sys
    import torch
    import ferry.torch as ft
    from ferry.errors import FerryError
    who, path, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    def race_sd(round_, who, count=32, elems=1 << 17):
        g = torch.Generator().manual_seed(1000 * round_ + who)
        return {f"layers.{i}.w": torch.randn(elems, generator=g) for i in range(count)}
    print(json.dumps({"ready": who}), flush=True)
    for r in range(rounds):
        sd = race_sd(r, who)
        if sys.stdin.readline().strip() != f"go {r}":
            sys.exit(5)
        try:
            ft.save_safetensors(sd, path, max_shard_size=1 << 20)
            out = {"round": r, "ok": True}
        except FerryError as e:
            out = {"round": r, "ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
""")


def _read_line(child, seconds=300):
    """The child's next stdout line (json), or the test fails naming its stderr. (It writes one line per
    line of its stdin, so nothing is left in the pipe's buffer for select to miss.)"""
    if not select.select([child.stdout], [], [], seconds)[0]:
        child.kill()
        pytest.fail(f"a racer wrote nothing for {seconds} s")
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=60)
        pytest.fail(f"racer exited {child.returncode}: {child.stderr.read()[-3000:]}")
    return json.loads(line)


def test_two_processes_saving_to_one_sharded_path(tmp_path):
    rounds = 30
    path = tmp_path / "model.safetensors"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(who), str(path), str(rounds)], env=ENV,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for who in (0, 1)]
    bad = []
    try:
        for c in racers:
            assert "ready" in _read_line(c)
        for r in range(rounds):
            for c in racers:  # both at once: each is waiting on its stdin
                c.stdin.write(f"go {r}\n")
            for c in racers:
                c.stdin.flush()
            results = [_read_line(c) for c in racers]
            candidates = {f"save {who}": {k: raw(v) for k, v in race_sd(r, who).items()} for who in (0, 1)}
            seen = (which(index_reader, tmp_path, candidates), which(ferry_reader, tmp_path, candidates))
            winners = {f"save {who}" for who, res in enumerate(results) if res["ok"]}
            failed = [res["error"] for res in results if not res["ok"]]
            ok = (seen[0] == seen[1] and seen[0] in winners and all("another save" in e for e in failed)
                  and leftovers(tmp_path) == [])
            if not ok:
                bad.append((r, seen, results, leftovers(tmp_path)[:6]))
    finally:
        for c in racers:
            c.stdin.close()
            try:
                c.wait(timeout=60)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
            c.stdout.close()
            c.stderr.close()
    assert not bad, f"{len(bad)} of {rounds} rounds did not end with one save's checkpoint, whole: {bad[:3]}"


def test_two_threads_saving_to_one_sharded_path(tmp_path):
    path = tmp_path / "model.safetensors"
    for r in range(10):
        sds = [race_sd(r, who, count=16) for who in (0, 1)]
        errors = []

        def run(sd):
            try:
                ft.save_safetensors(sd, path, max_shard_size=1 << 20)
            except FerryError as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(sd,)) for sd in sds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        candidates = {f"save {who}": {k: raw(v) for k, v in sd.items()} for who, sd in enumerate(sds)}
        assert not errors
        assert which(index_reader, tmp_path, candidates) in candidates, r
        assert leftovers(tmp_path) == [], r


@pytest.mark.parametrize("shard", [None, 1 << 20])
def test_a_later_save_of_this_process_is_never_replaced_by_an_earlier_one(tmp_path, shard):
    """Two snapshots saved to one path: the second save()'s checkpoint stays, whichever finished first."""
    path = tmp_path / "model.safetensors"
    for r in range(4):
        g = torch.Generator().manual_seed(r)
        big = {f"layers.{i}.w": torch.randn(6 << 20, generator=g) for i in range(4)}  # 96 MiB: the slower save
        small = race_sd(r, 7, count=8)
        first = ft.snapshot(big).save(path, max_shard_size=shard)
        second = ft.snapshot(small).save(path, max_shard_size=shard)
        first.wait()
        assert all(os.path.exists(p) for p in second.wait())
        want = {k: raw(v) for k, v in small.items()}
        got = index_reader(tmp_path) if shard else {k: raw(v) for k, v in load_file(str(path)).items()}
        assert got == want, f"round {r}: the earlier save's checkpoint replaced the later one's"
        assert leftovers(tmp_path) == ([] if shard else ["model.safetensors"])


# ---- a save killed mid-write, a save that cannot get the lock, a killed lock holder ----------

_SLOW_SAVER = textwrap.dedent("""
    import sys
    import torch
    import ferry.torch as ft
    g = torch.Generator().manual_seed(int(sys.argv[2]))
    sd = {f"layers.{i}.w": torch.randint(0, 255, (24 << 20,), dtype=torch.uint8, generator=g) for i in range(8)}
    print("GO", flush=True)
    ft.save_safetensors(sd, sys.argv[1], max_shard_size=24 << 20)
    print("DONE", flush=True)
""")


def _temporaries(d):
    return sorted(n for n in os.listdir(d) if ".ferry-tmp-" in n)


@pytest.mark.parametrize("kill_after", [1, 5])
def test_a_save_killed_mid_write_leaves_the_earlier_checkpoint_whole(tmp_path, kill_after):
    path = tmp_path / "model.safetensors"
    old_sd = race_sd(kill_after, 3, count=12)
    ft.save_safetensors(old_sd, path, max_shard_size=1 << 20)
    old = {k: raw(v) for k, v in old_sd.items()}
    old_files = sorted(os.listdir(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVER, str(path), str(kill_after)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"GO\n", child.stderr.read()[-2000:]
        deadline = time.monotonic() + 60
        while len(_temporaries(tmp_path)) < kill_after and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.0002)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    assert _temporaries(tmp_path), "the kill came after the save (no temporary file left)"
    # Mid-write: the earlier checkpoint, whole, under its own names, for every reader.
    assert which(index_reader, tmp_path, {"old": old}) == "old"
    assert which(ferry_reader, tmp_path, {"old": old}) == "old"
    assert sorted(n for n in os.listdir(tmp_path) if ".ferry-tmp-" not in n) == old_files
    # The next save replaces it and removes what the killed one left.
    new_sd = race_sd(kill_after, 4, count=12)
    ft.save_safetensors(new_sd, path, max_shard_size=1 << 20)
    assert which(index_reader, tmp_path, {"new": {k: raw(v) for k, v in new_sd.items()}}) == "new"
    assert leftovers(tmp_path) == []


_LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    from ferry.torch.publish import PathLock
    with PathLock(sys.argv[1]):
        print("HELD", flush=True)
        time.sleep(float(sys.argv[2]))
""")

_IMPATIENT_SAVER = textwrap.dedent("""
    import json, sys, time
    import torch
    import ferry.torch as ft
    from ferry.torch import publish
    publish.LOCK_TIMEOUT = 1.5
    g = torch.Generator().manual_seed(11)
    sd = {f"layers.{i}.w": torch.randn(1 << 17, generator=g) for i in range(8)}
    t = time.monotonic()
    try:
        ft.save_safetensors(sd, sys.argv[1], max_shard_size=1 << 20)
        print(json.dumps({"ok": True}))
    except OSError as e:
        print(json.dumps({"ok": False, "type": type(e).__name__, "errno": e.errno, "message": str(e),
                          "seconds": time.monotonic() - t}))
""")


def _holder(path, seconds):
    h = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(path), str(seconds)], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = h.stdout.readline()
    if line != "HELD\n":
        h.wait(timeout=60)
        pytest.fail(f"the lock holder did not start: {h.stderr.read()[-2000:]}")
    return h


def test_a_save_that_cannot_get_the_lock_fails_clearly_and_changes_nothing(tmp_path):
    path = tmp_path / "model.safetensors"
    old_sd = race_sd(0, 5, count=8)
    ft.save_safetensors(old_sd, path, max_shard_size=1 << 20)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    holder = _holder(path, 60)
    try:
        r = subprocess.run([sys.executable, "-c", _IMPATIENT_SAVER, str(path)], env=ENV, capture_output=True,
                           text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        holder.stderr.close()
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["ok"], "the save published while another one held the path's lock"
    assert out["type"] == "OSLayerError" and out["errno"] == errno.ETIMEDOUT, out
    assert "another save" in out["message"] and str(path) in out["message"] and "process" in out["message"], out
    assert 1.4 < out["seconds"] < 30, out
    # Nothing of the failed save is left; the earlier checkpoint is as it was (the killed holder's lock file stays).
    now = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if not n.endswith(".ferry-lock")}
    assert now == before
    assert which(index_reader, tmp_path, {"old": {k: raw(v) for k, v in old_sd.items()}}) == "old"


def test_a_killed_lock_holder_blocks_no_save(tmp_path):
    path = tmp_path / "model.safetensors"
    holder = _holder(path, 60)
    holder.send_signal(signal.SIGKILL)  # killed while it holds the lock: its lock file stays, its lock goes
    holder.wait()
    holder.stdout.close()
    holder.stderr.close()
    assert [n for n in os.listdir(tmp_path) if n.endswith(".ferry-lock")]
    sd = race_sd(1, 6, count=8)
    t = time.monotonic()
    ft.save_safetensors(sd, path, max_shard_size=1 << 20)
    assert time.monotonic() - t < 20
    assert which(index_reader, tmp_path, {"new": {k: raw(v) for k, v in sd.items()}}) == "new"
    assert leftovers(tmp_path) == []  # the lock file went with the save that took it


def test_a_save_waits_for_a_short_holder_and_then_publishes(tmp_path):
    path = tmp_path / "model.safetensors"
    holder = _holder(path, 1.0)
    try:
        sd = race_sd(2, 6, count=8)
        t = time.monotonic()
        ft.save_safetensors(sd, path, max_shard_size=1 << 20)
        waited = time.monotonic() - t
    finally:
        holder.wait(timeout=60)
        holder.stdout.close()
        holder.stderr.close()
    assert waited > 0.3, waited  # it waited for the holder (started holding before the save began)
    assert which(index_reader, tmp_path, {"new": {k: raw(v) for k, v in sd.items()}}) == "new"
    assert leftovers(tmp_path) == []

