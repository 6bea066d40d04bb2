"""`ferry bench --json FILE` where FILE is not a place for records (issue 30, item 8):
a FIFO, a directory, /dev/full, a missing directory, a file that is not ferry's, a file
too big to be one, and a file system that fills up. Each ends within seconds with a
clear error (exit status 2), before the suite measures, and leaves what was there as
it was; a full disk leaves the earlier records whole (the file is replaced atomically).

The suite is `blocks` with a small batch: waived at once without a GPU, a second's
work with one."""

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

import pytest

from ferry.bench.records import Records
from ferry.bench.report import MAX_RECORDS_FILE_BYTES, write_json
from ferry.errors import InvalidArgumentError, OSLayerError

SUITE = ["blocks", "--blocks", "8x4K", "--repeats", "1"]
SECONDS = 30  # each case ends in about a second; this bounds a hang


def bench(json_path, *, before_suite=True, limit_memory=False):
    """`ferry bench --json FILE blocks ...` (or the suite's own --json); (returncode, stdout, stderr, seconds)."""
    argv = ["--json", str(json_path), *SUITE] if before_suite else [*SUITE, "--json", str(json_path)]
    # Reading /dev/full without a bound took 24 GB: cap the address space so the old
    # code fails here instead of taking the machine.
    cap = (lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))) if limit_memory else None
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", *argv], capture_output=True, text=True,
                       timeout=SECONDS, preexec_fn=cap)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - start


def refused(json_path, why, **kw):
    """Both spellings end at once with exit status 2 and `why`, before the suite ran."""
    for before in (True, False):
        rc, out, err, took = bench(json_path, before_suite=before, **kw)
        assert rc == 2, (rc, out, err)
        assert why in err and str(json_path) in err, err
        assert "Traceback" not in err, err
        assert "waived" not in out and "GB/s" not in out, out  # nothing was measured
        assert took < SECONDS


def some_records(suite="copy"):
    rng = random.Random()
    out = Records(suite)
    for _ in range(rng.randint(2, 9)):
        out.add(f"case {rng.getrandbits(40):x}", "bandwidth", rng.uniform(0.1, 60), "GB/s", nbytes=rng.randint(1, 1 << 40))
    return out.items


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "records.json"
    os.mkfifo(fifo)
    refused(fifo, "is a FIFO")
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


def test_a_directory_and_a_missing_directory_are_refused_before_measuring(tmp_path):
    refused(tmp_path, "is a directory")
    refused(tmp_path / "not-here" / "records.json", "does not exist")
    assert not (tmp_path / "not-here").exists()


def test_dev_full_is_refused_without_reading_it():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    refused("/dev/full", "is a character device", limit_memory=True)


@pytest.mark.parametrize("content", ["garbage", "not-an-object", "no-header", "proc"])
def test_a_file_that_is_not_ferrys_is_left_as_it_is(tmp_path, content):
    rng = random.Random()
    if content == "proc":
        path = "/proc/version"  # a regular file, its size 0, its text not JSON
        if not os.path.exists(path):
            pytest.skip("no /proc/version")
        before = open(path, "rb").read()
    else:
        path = tmp_path / "results.json"
        before = {"garbage": bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 5000))) + b"{",
                  "not-an-object": json.dumps([rng.random() for _ in range(rng.randint(1, 50))]).encode(),
                  "no-header": json.dumps({"records": [], "suites": {}, "x": rng.random()}).encode()}[content]
        path.write_bytes(before)
    refused(path, "not a ferry bench records file")
    assert open(path, "rb").read() == before


def test_a_file_over_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_RECORDS_FILE_BYTES + random.randint(1, 1 << 20))  # sparse: costs no disk
    size = path.stat().st_size
    refused(path, f"{MAX_RECORDS_FILE_BYTES >> 20} MiB")
    assert path.stat().st_size == size


def test_an_empty_file_takes_the_records(tmp_path):
    """mktemp's empty file is filled, not refused."""
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    rc, out, err, _ = bench(empty)
    assert rc == 0, err
    assert set(json.loads(empty.read_text())["suites"]) == {"blocks"}


def test_through_a_symbolic_link_the_file_it_names_takes_the_records(tmp_path):
    """The rule for every file ferry writes (atomic_file.check_replaceable): a link is
    followed, as open() does; the file it names is replaced, the link stays."""
    target = tmp_path / "real.json"
    first = some_records("pool")
    write_json(str(target), "pool", first)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    rc, out, err, _ = bench(link)
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    data = json.loads(target.read_text())
    assert set(data["suites"]) == {"pool", "blocks"} and data["records"][:len(first)] == first


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs (needs root and mount permission; skipped otherwise)."""
    where = tmp_path / "small"
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def fill(directory):
    """Fills the file system of `directory` with random bytes, up to its last block."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        while os.write(fd, os.urandom(4096)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    st = os.statvfs(directory)
    assert st.f_bavail == 0


def test_a_full_file_system_keeps_the_earlier_records_whole(small_tmpfs):
    path = small_tmpfs / "bench.json"
    earlier = some_records("copy")
    write_json(str(path), "copy", earlier)
    before = path.read_bytes()
    fill(small_tmpfs)
    # In process: the write fails with the errno and the file's name; nothing left behind.
    with pytest.raises(OSLayerError, match="No space left on device") as e:
        write_json(str(path), "pool", some_records("pool"))
    assert str(path) in str(e.value)
    assert path.read_bytes() == before
    assert sorted(os.listdir(small_tmpfs)) == ["bench.json", "filler"]
    # The command: a clear error, exit status 2, the other suites' records intact.
    rc, out, err, took = bench(path)
    assert rc == 2 and "No space left on device" in err and "Traceback" not in err, (rc, err)
    assert path.read_bytes() == before and took < SECONDS
    assert json.loads(before)["records"] == earlier
    assert sorted(os.listdir(small_tmpfs)) == ["bench.json", "filler"]


def test_check_json_path_quotes_the_value():
    from ferry.bench.report import check_json_path

    with pytest.raises(InvalidArgumentError, match="--json '': path is empty"):
        check_json_path("")
