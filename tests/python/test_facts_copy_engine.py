"""Tests of the copy engine's facts (python/ferry/facts/copy_engine.py): the machine
profile's path and presence, read from the real environment and a real temporary
cache directory, and the crew size as src/copy/copy_crew.cpp sizes it, from this
machine's CPUs; then the doctor's rule `small-crew-uncalibrated` on those facts.
Nothing of the OS is faked: the environment is set with monkeypatch and files are
written under tmp_path."""

import argparse
import os

import pytest

import ferry
from ferry import facts, rules
from ferry.bench import copy as bench_copy
from ferry.doctor import report, text_report
from ferry.facts import copy_engine

# A GPU whose PCI address is not in sysfs: no NUMA node, so the default crew serves it.
ONE_GPU = {"driver_version": 13000, "runtime_version": 13000,
           "devices": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:FF:1F.7"}]}


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No FERRY_PROFILE or FERRY_COPY_WORKERS; XDG_CACHE_HOME is an empty tmp_path/cache."""
    for name in ("FERRY_PROFILE", "FERRY_COPY_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return monkeypatch


def engine_facts(cuda_info=None) -> dict:
    return facts.collect(cuda_info)["host"]["copy_engine"]


# ---- the profile ----------------------------------------------------------------------


def test_profile_path_follows_the_engines_rule(env, tmp_path):
    assert copy_engine.profile_path() == (f"{tmp_path}/cache/ferry/profile.txt", False)
    env.setenv("FERRY_PROFILE", f"  {tmp_path}/mine.txt\n")  # the engine trims option values
    assert copy_engine.profile_path() == (f"{tmp_path}/mine.txt", True)
    env.setenv("FERRY_PROFILE", "")
    env.setenv("XDG_CACHE_HOME", "")  # empty: as unset
    env.setenv("HOME", str(tmp_path / "home"))
    assert copy_engine.profile_path() == (f"{tmp_path}/home/.cache/ferry/profile.txt", False)
    env.delenv("XDG_CACHE_HOME")
    env.delenv("HOME")
    assert copy_engine.profile_path() == (None, False)


def test_bench_calibrate_writes_where_the_engine_reads():
    assert bench_copy.profile_path is copy_engine.profile_path  # one rule, no copy


def test_calibrate_without_a_place_for_the_profile_refuses_before_measuring(env, capsys):
    env.delenv("XDG_CACHE_HOME")
    env.delenv("HOME", raising=False)
    assert bench_copy.SUITE.run(argparse.Namespace(calibrate=True, iterations=1)) == 2
    assert "nowhere to write the profile" in capsys.readouterr().err


def test_profile_absent_then_present_in_a_real_cache_directory(env, tmp_path):
    path = tmp_path / "cache" / "ferry" / "profile.txt"
    assert engine_facts()["profile"] == {"path": str(path), "named": False, "present": False}
    path.parent.mkdir(parents=True)
    path.write_text("cuda_below_bytes_h2d = 8388608\n")
    assert engine_facts()["profile"] == {"path": str(path), "named": False, "present": True}
    path.unlink()
    path.mkdir()  # the engine refuses a directory: neither a profile nor "none"
    assert engine_facts()["profile"]["present"] is None


def test_profile_named_by_ferry_profile(env, tmp_path):
    named = tmp_path / "named.txt"
    env.setenv("FERRY_PROFILE", str(named))
    assert engine_facts()["profile"] == {"path": str(named), "named": True, "present": False}
    named.write_text("hybrid_pinned_share_d2h = 0.7\n")
    assert engine_facts()["profile"]["present"] is True


# ---- the crew -----------------------------------------------------------------------------


def test_crew_is_one_thread_per_usable_cpu_at_most_16(env):
    e = engine_facts()
    assert e["workers_option"] == 0
    assert e["crew_threads"] == min(len(os.sched_getaffinity(0)), 16)
    assert e["crew_numa_node"] is None  # no GPU: the default crew
    assert engine_facts(ONE_GPU)["crew_threads"] == e["crew_threads"]


@pytest.mark.parametrize("value, threads", [("3", 3), (" 7\n", 7), ("+5", 5), ("1024", 1024), ("0", None)])
def test_crew_size_from_ferry_copy_workers(env, value, threads):
    env.setenv("FERRY_COPY_WORKERS", value)
    e = engine_facts()
    assert e["crew_threads"] == (threads or min(len(os.sched_getaffinity(0)), 16))
    assert e["workers_option"] == (threads or 0)


@pytest.mark.parametrize("value", ["", "two", "-1", "1025", "0x10", "4.0"])
def test_a_value_the_engine_refuses_leaves_the_crew_unknown_with_a_note(env, value):
    env.setenv("FERRY_COPY_WORKERS", value)
    host = facts.collect(None)["host"]
    assert host["copy_engine"]["crew_threads"] is None and host["copy_engine"]["workers_option"] is None
    assert any("FERRY_COPY_WORKERS" in note for note in host["notes"])


@pytest.mark.parametrize("workers, node, online, node_cpus, usable, expected", [
    (0, None, [0], [], range(8), (8, None)),  # one node: every usable CPU
    (0, 1, [0, 1], range(4, 8), range(8), (4, 1)),  # the GPU's node: its usable CPUs, bound
    (0, 1, [0, 1], range(4, 8), range(4), (4, None)),  # none of the node's CPUs usable: the default crew
    (0, 1, [0], range(4, 8), range(8), (8, None)),  # one online node: nothing is bound
    (0, 2, [0, 1], [], range(8), (8, None)),  # a node that is not online
    (2, 1, [0, 1], range(4, 8), range(8), (2, 1)),  # FERRY_COPY_WORKERS wins, still bound
    (0, None, [0], [], range(64), (16, None)),  # at most 16
    (0, None, [0], [], [], (1, None)),
])
def test_crew_size_as_copy_crew_cpp(workers, node, online, node_cpus, usable, expected):
    assert copy_engine.crew_size(workers, node, online, node_cpus, usable) == expected


# ---- facts -> report and rule ----------------------------------------------------------------


def test_small_crew_without_profile_is_found_then_silenced_by_the_profile(env, tmp_path):
    env.setenv("FERRY_COPY_WORKERS", "2")
    f = facts.collect(ONE_GPU)
    hits = [x for x in rules.evaluate(f) if x.id == "small-crew-uncalibrated"]
    assert [x.severity for x in hits] == ["warning"]
    assert "crew has 2 threads (FERRY_COPY_WORKERS=2)" in hits[0].evidence[0]
    assert f"({tmp_path}/cache/ferry/profile.txt)" in hits[0].fix
    text = " ".join(text_report.render([report.facts_section(f)]).split())  # unwrapped
    assert "crew of 2 threads (FERRY_COPY_WORKERS=2)" in text
    assert "absent: built-in defaults" in text
    path = tmp_path / "cache" / "ferry" / "profile.txt"
    path.parent.mkdir(parents=True)
    path.write_text("cuda_below_bytes_d2h = 8388608\n")
    assert [x for x in rules.evaluate(facts.collect(ONE_GPU)) if x.id == "small-crew-uncalibrated"] == []
    assert [x for x in rules.evaluate(facts.collect(None)) if x.id == "small-crew-uncalibrated"] == []


def test_report_of_engine_facts_from_an_older_report():
    text = " ".join(text_report.render([report.facts_section({"host": {}})]).split())
    assert "crew size unknown; machine profile unknown" in text


def _devices() -> list[int]:
    info = ferry.cuda_info()
    return [int(d.get("index", i)) for i, d in enumerate((info or {}).get("devices") or [])]


@pytest.mark.skipif(not _devices(), reason="needs a CUDA device")
def test_crew_size_matches_the_engines():
    """The facts' crew is the smallest the engines of this host's GPUs really have."""
    engines = [ferry.engine(d).stats()["crew_threads"] for d in _devices()]
    assert engine_facts(ferry.cuda_info())["crew_threads"] == min(engines)
