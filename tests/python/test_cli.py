"""The ferry command: --version, options, bench's suite list, doctor (text and JSON), bad options."""

import json
import os
import subprocess
import sys

import pytest

import ferry


def ferry_cmd(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ferry", *args], capture_output=True, text=True, env=e, timeout=300
    )


def test_version_names_all_four_versions():
    r = ferry_cmd("--version")
    assert r.returncode == 0, r.stderr
    assert "ferry " + ferry.__version__ in r.stdout
    for word in ("C API", "CUDA runtime", "CUDA driver"):
        assert word in r.stdout


def test_options_lists_every_option():
    r = ferry_cmd("options")
    assert r.returncode == 0
    for name, _, _ in ferry.option_table():
        assert name in r.stdout


def test_bench_help_and_bench_alone_list_every_suite_with_its_description():
    from ferry.bench import SUITE_MODULES, suites

    found = suites()
    assert len(found) == len(SUITE_MODULES)
    for args in (("bench", "--help"), ("bench",)):
        r = ferry_cmd(*args)
        assert r.returncode == 0, r.stderr
        for key, suite in found.items():
            assert suite.description and "\n" not in suite.description
            line = next(line for line in r.stdout.splitlines() if line.split()[:1] == [key])
            assert " ".join(suite.description.split()[:3]) in " ".join(line.split()), line


def test_bench_suite_help_shows_its_options_and_unknown_suites_fail():
    r = ferry_cmd("bench", "thp", "--help")
    assert r.returncode == 0, r.stderr
    assert "--set-shmem-advise" in r.stdout and "--json" in r.stdout
    r = ferry_cmd("bench", "warp-drive")
    assert r.returncode == 2
    assert "unknown bench suite 'warp-drive'" in r.stderr and "copy" in r.stderr


def test_unknown_option_fails_quoting_the_value():
    r = ferry_cmd("options", env={"FERRY_CHUNK_SIZ": "64M"})
    assert r.returncode == 2
    assert "FERRY_CHUNK_SIZ='64M'" in r.stderr


def test_bad_option_value_fails_quoting_the_value():
    r = ferry_cmd("doctor", "--json", env={"FERRY_CHUNK_SIZE": "huge"})
    assert r.returncode == 2
    assert "'huge'" in r.stderr


def test_doctor_json_has_the_required_keys():
    r = ferry_cmd("doctor", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    host = d["host"]
    for key in ("kernel", "virtualization", "hugetlb", "memlock_bytes"):
        assert key in host
    for key in ("enabled", "defrag", "shmem_enabled"):
        assert key in host["thp"]
    assert isinstance(host["hugetlb"], list)
    for pool in host["hugetlb"]:
        assert set(("page_size_bytes", "total", "free")) <= set(pool)
    assert "cuda" in d and isinstance(d["gpus"], list)
    if d["cuda"] is None:
        assert d["gpus"] == []
        assert any("GPU" in s["what"] for s in d["skipped"])
    for g in d["gpus"]:
        for key in ("link_gbps", "bar1_bytes", "numa_node"):
            assert key in g
        for key in ("gen", "width", "max_gen", "max_width"):
            assert key in g["pcie"]
    m = d["measurements"]
    assert m["first_touch_4k_gbps"] > 0 and m["first_touch_thp_gbps"] > 0
    assert d["pool"]["chunk_reservations"] >= 1
    ids = [f["id"] for f in d["findings"]]
    assert len(ids) == len(set(ids))


def test_doctor_text_report_without_gpu_says_so():
    r = ferry_cmd("doctor")
    assert r.returncode == 0, r.stderr
    assert "THP" in r.stdout or "transparent" in r.stdout.lower()
    if ferry.cuda_info() is None:
        assert "no CUDA driver" in r.stdout


def test_options_guide_lists_every_option_with_its_default():
    import pathlib
    import re

    guide = pathlib.Path(__file__).resolve().parents[2] / "docs" / "options.md"
    rows = dict(re.findall(r"^\| `(FERRY_[A-Z_]+)` \| `([^`]*)` \|", guide.read_text(), re.M))
    table = {name: (default or "(empty)") for name, default, _ in ferry.option_table()}
    assert rows == table, "docs/options.md's table is out of date: run `ferry options --markdown`"


# ---- issue 21, item 9 -------------------------------------------------------------


def test_doctor_json_into_a_closed_pipe_ends_quietly():
    # `ferry doctor --json | head -c 1`: the reader leaves after one byte.
    p = subprocess.Popen([sys.executable, "-m", "ferry", "doctor", "--quick", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert first == b"{"
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert p.returncode in (0, 141), err.decode()


@pytest.mark.parametrize("argv, flag", [
    (["copy", "--sizes", "garbage"], "--sizes"),
    (["copy", "--sizes", ""], "--sizes"),
    (["copy", "--iterations", "0"], "--iterations"),
    (["copy", "--directions", "up"], "--directions"),
    (["copy", "--sweep-sizes", "1Q"], "--sweep-sizes"),
    (["load", "--layers", "-1"], "--layers"),
    (["load", "--shards", "0"], "--shards"),
    (["load", "--staging", "lots"], "--staging"),
])
def test_bench_checks_its_flags_before_the_waiver(argv, flag):
    # A typo is caught on any machine, not hidden behind "waived: needs a CUDA device".
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert flag in r.stderr and "waived" not in r.stdout
