"""Tests of the copy engine's facts (python/ferry/facts/copy_engine.py): the machine
profile's path and presence and the crew size, as the engine itself decides them
(ferry._ferry.profile_file_path and plan_copy_crew: src/copy/profile_file.h,
src/copy/copy_crew.h), from the real environment, a real temporary cache directory
and this machine's CPUs; then the doctor's rule `small-crew-uncalibrated` on those
facts. Nothing of the OS is faked: the environment is set with monkeypatch and files
are written under tmp_path.

The engine reads the FERRY_* variables once per process (src/core/options.h), so a
case that sets one collects its facts in a fresh Python process with that
environment (as tests/python/test_cli.py runs the command); XDG_CACHE_HOME and HOME
are read at each call, so cases that only change those run here."""

import argparse
import json
import os
import subprocess
import sys

import pytest

import ferry
from ferry import _ferry, facts, rules
from ferry.bench import copy as bench_copy
from ferry.doctor import report, text_report

# A GPU whose PCI address is not in sysfs: no NUMA node, so the default crew serves it.
ONE_GPU = {"driver_version": 13000, "runtime_version": 13000,
           "devices": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:FF:1F.7"}]}
DEFAULT_CREW = min(len(os.sched_getaffinity(0)), 16)  # one per usable CPU, at most 16 (one-node host)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No FERRY_* variable; XDG_CACHE_HOME is an empty tmp_path/cache."""
    for name in [n for n in os.environ if n.startswith("FERRY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return monkeypatch


@pytest.fixture
def here(env):
    """env, for cases run in this process: they need this process's FERRY_PROFILE
    (read once, at the first call) to have been unset."""
    if _ferry.profile_file_path()[1]:
        pytest.skip("FERRY_PROFILE was set when this process read its options")
    return env


def fresh(code: str, *args: str) -> str:
    """stdout of `code` run by a new Python process in this environment."""
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def fresh_facts(cuda_info=None) -> dict:
    """facts.collect(cuda_info, _ferry) by a new process (the FERRY_* variables as set now)."""
    return json.loads(fresh("import json, sys\nfrom ferry import facts\n"
                            "from ferry import _ferry\n"
                            "print(json.dumps(facts.collect(json.loads(sys.argv[1]), _ferry)))", json.dumps(cuda_info)))


def engine_facts(cuda_info=None) -> dict:
    return fresh_facts(cuda_info)["host"]["copy_engine"]


# ---- the profile ----------------------------------------------------------------------


def test_profile_path_follows_xdg_cache_home_then_home(here, tmp_path):
    assert _ferry.profile_file_path() == (f"{tmp_path}/cache/ferry/profile.txt", False)
    here.setenv("XDG_CACHE_HOME", "")  # empty: as unset
    here.setenv("HOME", str(tmp_path / "home"))
    assert _ferry.profile_file_path() == (f"{tmp_path}/home/.cache/ferry/profile.txt", False)
    here.delenv("XDG_CACHE_HOME")
    here.delenv("HOME")
    assert _ferry.profile_file_path() == (None, False)


def test_profile_path_named_by_ferry_profile(env, tmp_path):
    code = "import json\nfrom ferry import _ferry\nprint(json.dumps(_ferry.profile_file_path()))"
    env.setenv("FERRY_PROFILE", f"  {tmp_path}/mine.txt\n")  # the engine trims option values
    assert json.loads(fresh(code)) == [f"{tmp_path}/mine.txt", True]
    env.setenv("FERRY_PROFILE", "")  # empty: as unset
    assert json.loads(fresh(code)) == [f"{tmp_path}/cache/ferry/profile.txt", False]


def test_calibrate_without_a_place_for_the_profile_refuses_before_measuring(here, capsys):
    here.delenv("XDG_CACHE_HOME")
    here.delenv("HOME", raising=False)
    assert bench_copy.SUITE.run(argparse.Namespace(calibrate=True, iterations=1)) == 2
    assert "nowhere to write the profile" in capsys.readouterr().err


def test_profile_absent_then_present_in_a_real_cache_directory(here, tmp_path):
    path = tmp_path / "cache" / "ferry" / "profile.txt"
    engine = lambda: facts.collect(None, _ferry)["host"]["copy_engine"]  # noqa: E731
    assert engine()["profile"] == {"path": str(path), "named": False, "present": False, "problem": None}
    path.parent.mkdir(parents=True)
    path.write_text("cuda_below_bytes_h2d = 8388608\n")
    assert engine()["profile"] == {"path": str(path), "named": False, "present": True, "problem": None}
    path.unlink()
    path.mkdir()  # the engine refuses a directory: neither a profile nor "none"
    assert engine()["profile"]["present"] is None and engine()["profile"]["problem"] == "a directory, not a profile"


def test_profile_named_by_ferry_profile(env, tmp_path):
    named = tmp_path / "named.txt"
    env.setenv("FERRY_PROFILE", str(named))
    assert engine_facts()["profile"] == {"path": str(named), "named": True, "present": False, "problem": None}
    named.write_text("hybrid_pinned_share_d2h = 0.7\n")
    assert engine_facts()["profile"]["present"] is True


# ---- the crew -----------------------------------------------------------------------------


def test_crew_is_one_thread_per_usable_cpu_at_most_16(env):
    e = engine_facts()
    assert e["workers_option"] == 0
    assert e["crew_threads"] == DEFAULT_CREW
    assert e["crew_numa_node"] is None  # no GPU: the default crew
    assert engine_facts(ONE_GPU)["crew_threads"] == e["crew_threads"]


@pytest.mark.parametrize("value, threads", [("3", 3), (" 7\n", 7), ("+5", 5), ("1024", 1024), ("0", None)])
def test_crew_size_from_ferry_copy_workers(env, value, threads):
    env.setenv("FERRY_COPY_WORKERS", value)
    e = engine_facts()
    assert e["crew_threads"] == (threads or DEFAULT_CREW)
    assert e["workers_option"] == (threads or 0)


@pytest.mark.parametrize("value", ["", "two", "-1", "1025", "0x10", "4.0"])
def test_a_value_the_engine_refuses_leaves_the_crew_unknown_with_a_note(env, value):
    env.setenv("FERRY_COPY_WORKERS", value)
    f = fresh_facts(ONE_GPU)
    host = f["host"]
    assert host["copy_engine"] == {"workers_option": None, "crew_threads": None, "crew_numa_node": None,
                                   "profile": None}
    assert any(f"FERRY_COPY_WORKERS='{value}'" in note for note in host["notes"]), host["notes"]
    assert [x for x in rules.evaluate(f) if x.id == "small-crew-uncalibrated"] == []
    text = " ".join(text_report.render([report.facts_section(f)]).split())
    assert "crew size unknown; machine profile unknown" in text


def test_plan_copy_crew_is_the_engines_plan_for_each_node():
    """The binding in this process: the default crew, and each online node's crew
    (bound to its CPUs only on a host with several nodes)."""
    plan = _ferry.plan_copy_crew()
    assert set(plan) == {"threads", "numa_node", "cpus", "workers", "spin_us"}
    assert plan["numa_node"] is None and plan["cpus"] == []
    assert plan["threads"] == (plan["workers"] or DEFAULT_CREW)
    nodes = [n["id"] for n in facts.collect(None, _ferry)["host"]["numa_nodes"] or []]
    for node in nodes:
        p = _ferry.plan_copy_crew(node)
        if len(nodes) == 1:
            assert p == plan, node
        else:
            assert p["numa_node"] in (None, node) and set(p["cpus"]) <= os.sched_getaffinity(0)
    with pytest.raises(ferry.InvalidArgumentError, match="numa_node=True"):
        _ferry.plan_copy_crew(True)


# ---- facts -> report and rule ----------------------------------------------------------------


def test_small_crew_without_profile_is_found_then_silenced_by_the_profile(env, tmp_path):
    env.setenv("FERRY_COPY_WORKERS", "2")
    f = fresh_facts(ONE_GPU)
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
    assert [x for x in rules.evaluate(fresh_facts(ONE_GPU)) if x.id == "small-crew-uncalibrated"] == []
    path.unlink()  # without a GPU the rule is silent, profile or not
    assert [x for x in rules.evaluate(fresh_facts(None)) if x.id == "small-crew-uncalibrated"] == []


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


def test_without_the_native_module_the_engine_facts_are_unknown():
    """facts imports nothing of ferry: without the module passed in, nothing is guessed."""
    f = facts.collect(None)
    assert f["host"]["copy_engine"] is None
    assert [x for x in rules.evaluate(f) if x.id == "small-crew-uncalibrated"] == []
