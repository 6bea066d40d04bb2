"""`ferry bench fork` without a GPU: its CPU part (the pageable and ferry Pool
holders, the DataLoader's first batch) run for real with small sizes, its JSON
records' shape and figures, what it reads of smaps for real mappings, its
argument checks and its waiver."""

import json
import mmap
import os

import pytest

import ferry
from ferry.bench import fork
from ferry.bench.records import is_record

MiB = 1 << 20
HELD = 16 * MiB + 12 * 4096  # an odd size


def _records(path):
    with open(path) as f:
        doc = json.load(f)
    assert doc["suites"]["fork"]["waived"] is None
    return doc["records"]


def _one(records, case, metric, **params):
    hits = [r for r in records if r["case"] == case and r["metric"] == metric
            and all(r["params"].get(k) == v for k, v in params.items())]
    assert len(hits) == 1, (case, metric, params, hits)
    return hits[0]


def test_cpu_part_runs_and_writes_one_record_per_figure(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "fork.json"
    assert fork.main(["--device", "cpu", "--sizes", str(HELD), "--repeats", "3", "--workers", "2", "--loader-held", "16M",
                      "--loader-repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fork ms" in printed and "child MiB" in printed and "first batch ms" in printed
    records = _records(out)
    assert records and all(is_record(r) and r["suite"] == "fork" for r in records)
    for holder in fork.CPU_HOLDERS:
        base = _one(records, "nothing held", "fork_time", holder=holder, held_bytes=0)
        held = _one(records, holder, "fork_time", holder=holder, held_bytes=HELD)
        for r in (base, held):
            assert r["unit"] == "ms" and 0 < r["value"] < 10_000
        assert held["baseline"] == base["value"] and held["params"]["baseline_case"] == "nothing held"
        assert held["ratio"] == pytest.approx(held["value"] / base["value"])
        child = _one(records, holder, "child_private_dirty", holder=holder, held_bytes=HELD)
        child0 = _one(records, "nothing held", "child_private_dirty", holder=holder, held_bytes=0)
        assert child["unit"] == "MiB" and 0 < child["value"] < HELD / MiB / 2
        assert child["baseline"] == child0["value"]
        growth = _one(records, holder, "child_private_growth", holder=holder, held_bytes=HELD)
        assert growth["value"] == pytest.approx(child["value"] - child0["value"])
        assert abs(growth["value"]) < HELD / MiB / 2  # pageable memory is shared copy-on-write
        mapping = _one(records, holder, "mapping", holder=holder, held_bytes=HELD)
        assert isinstance(mapping["value"], str) and mapping["value"] not in ("", "-") and mapping["unit"] is None
    pool_growth = _one(records, "ferry Pool", "child_private_growth", held_bytes=HELD)
    assert pool_growth["params"]["baseline_case"] == "pageable"
    assert _one(records, "ferry Pool", "mapping", held_bytes=HELD)["value"].startswith("anon")
    for loader in fork.LOADERS:
        base = _one(records, "nothing held", "first_batch_time", loader=loader, held_bytes=0)
        held = _one(records, loader, "first_batch_time", loader=loader, held_bytes=16 * MiB)
        assert held["params"] == {"loader": loader, "holder": "ferry Pool", "held_bytes": 16 * MiB, "workers": 2,
                                  "baseline_case": "nothing held"}
        assert 0 < base["value"] < 60_000 and 0 < held["value"] < 60_000 and held["baseline"] == base["value"]
    assert not [r for r in records if r["metric"] in ("error", "state")]


_PINNED_CHILD = """
import ctypes, json, mmap, sys
from ferry.bench import fork

n = int(sys.argv[1])
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.write(bytes(range(256)) * (n // 256))
before = fork.fork_figures(2)
hidden_map = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
hidden_map.madvise(mmap.MADV_DONTFORK)  # private to this process: not in the child at all
hidden_map.write(bytes(range(256)) * (n // 256))
hidden = fork.fork_figures(2)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ring = libc.syscall(425, 4, (ctypes.c_char * 120)())  # io_uring_setup
if ring < 0:
    print(json.dumps({"skip": f"io_uring_setup: errno {ctypes.get_errno()}"}))
    sys.exit(0)

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

iov = IoVec(ctypes.addressof(ctypes.c_char.from_buffer(m)), n)
if libc.syscall(427, ring, 0, ctypes.byref(iov), 1) != 0:  # IORING_REGISTER_BUFFERS: FOLL_PIN
    print(json.dumps({"skip": f"IORING_REGISTER_BUFFERS: errno {ctypes.get_errno()}"}))
    sys.exit(0)
print(json.dumps({"before": before, "hidden": hidden, "pinned": fork.fork_figures(2)}))
"""


def test_the_child_figure_shows_pinned_pages_copied_at_fork():
    """What the suite measures on the GPU, with the kernel's own pin on CPU: pages
    pinned by io_uring's registered buffers (FOLL_PIN, as cudaHostRegister pins
    them) are copied into the child at fork(), and the child's figure shows it; pages
    the child does not get (MADV_DONTFORK) are not in it."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _PINNED_CHILD, str(HELD)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(f"this kernel does not pin io_uring buffers here ({got['skip']})")
    before, hidden, pinned = (min(got[k]["child_private_dirty_bytes"]) for k in ("before", "hidden", "pinned"))
    assert before < HELD / 2  # shared copy-on-write
    assert hidden - before < HELD / 2  # the child's figure: the parent holds the hidden bytes privately
    assert 0.95 * HELD <= pinned - before < 2 * HELD  # a copy of every pinned byte (give or take the
    # few pages the two children dirty differently)
    assert all(0 < t < 10 for k in ("before", "hidden", "pinned") for t in got[k]["fork_s"])


def test_mapping_summary_reads_smaps_for_real_mappings():
    private = mmap.mmap(-1, 4 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    hidden = mmap.mmap(-1, 4 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    hidden.madvise(mmap.MADV_DONTFORK)
    fd = os.memfd_create("fork-test")
    try:
        os.ftruncate(fd, 4 * MiB)
        shared = mmap.mmap(fd, 4 * MiB)
    finally:
        os.close(fd)
    try:
        with open("/proc/self/smaps") as f:
            smaps = f.read()
        for m, expected in ((private, "anon"), (hidden, "anon dc"), (shared, "memfd sh")):
            m[0] = 1
            addr = int(_address(m))
            assert fork.mapping_summary(smaps, addr, addr + 4 * MiB) == expected
            assert fork.mapping_summary(smaps, addr + 4 * MiB, addr + 4 * MiB) == "-"  # empty, even where
            # the kernel merged the mapping with a neighbour (failed so on the 2x H200 machine)
    finally:
        for m in (private, hidden, shared):
            m.close()


def _address(m):
    import ctypes

    view = ctypes.c_char.from_buffer(m)
    try:
        return ctypes.addressof(view)
    finally:
        del view


@pytest.mark.parametrize("argv", [["--sizes", "1X"], ["--repeats", "0"], ["--holders", "pinned"], ["--workers", "0"]])
def test_bad_arguments_are_refused_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as e:
        fork.main(argv)
    assert e.value.code == 2
    assert "ferry bench fork" in capsys.readouterr().err


def test_cpu_refuses_gpu_holders():
    with pytest.raises(ferry.InvalidArgumentError, match="--device cpu runs only the holders pageable, ferry Pool"):
        fork.main(["--device", "cpu", "--holders", "pageable,ferry PinnedPool"])


def test_without_a_device_the_suite_is_waived_and_says_how_to_run_its_cpu_part(tmp_path, capsys):
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    out = tmp_path / "fork.json"
    assert fork.main(["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ferry bench fork: waived: needs a CUDA device")
    assert "--device cpu measures the pageable and ferry Pool holders" in printed
    doc = json.loads(out.read_text())
    assert doc["suites"]["fork"]["waived"].startswith("needs a CUDA device") and doc["records"] == []
