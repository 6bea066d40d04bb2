"""`ferry bench load --first-loads N` and `--ranks N` without a GPU: their
options and the errors for bad ones, the waivers, and the child-process
protocol with real child processes (load_child.py's "safetensors CPU" method,
a real load to the CPU, no CUDA): ready, the barrier, results, bit-exactness,
timeouts and failures reported, never waited for without end; then the
figures, the tables and the records built from the answers."""

from __future__ import annotations

import argparse
import json
import random
import time

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

import ferry  # noqa: E402
from ferry.measure import gpu_absent_reason  # noqa: E402
from ferry.bench import load as bl  # noqa: E402
from ferry.bench import load_child, load_modes, load_procs  # noqa: E402
from ferry.bench.records import Records  # noqa: E402

from random_tensors import rand  # noqa: E402

CPU = "safetensors CPU"


@pytest.fixture
def checkpoint(tmp_path):
    """Two shards of random tensors of odd sizes and mixed dtypes; (paths, tensors)."""
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    dtypes = [torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.float16, torch.uint8]
    tensors = {f"t{k}": rand((random.randint(0, 37), random.randint(1, 129)), dtypes[k % len(dtypes)], g)
               for k in range(9)}
    paths = []
    for s in range(2):
        p = str(tmp_path / f"model-{s}.safetensors")
        st_torch.save_file({k: v for i, (k, v) in enumerate(tensors.items()) if i % 2 == s}, p)
        paths.append(p)
    return paths, tensors


def parse(*argv: str) -> argparse.Namespace:
    return bl.SUITE.parser().parse_args(list(argv))


# ---- options --------------------------------------------------------------------------

def test_the_modes_default_to_off_and_parse_their_counts():
    a = parse()
    assert a.first_loads == 0 and a.ranks == 1 and a.child_timeout == int(load_procs.CHILD_TIMEOUT_S)
    a = parse("--first-loads", "5", "--ranks", "2", "--child-timeout", "40")
    assert (a.first_loads, a.ranks, a.child_timeout) == (5, 2, 40)


@pytest.mark.parametrize("argv, quoted", [(["--first-loads", "-1"], "--first-loads: '-1'"),
                                          (["--ranks", "0"], "--ranks: '0'"),
                                          (["--ranks", "two"], "'two'"),
                                          (["--child-timeout", "0"], "--child-timeout: '0'")])
def test_bad_counts_are_refused_quoting_the_value(capsys, argv, quoted):
    with pytest.raises(SystemExit) as e:
        bl.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {argv[0]}" in err and quoted in err


def test_only_that_leaves_out_every_path_of_a_mode_is_refused_before_the_waiver(capsys):
    assert bl.main(["--ranks", "2", "--only", "InstantTensor"]) == 2
    assert "--ranks loads with ferry; --only InstantTensor leaves it out" in capsys.readouterr().err
    assert bl.main(["--first-loads", "3", "--only", "tensorizer"]) == 2
    assert "leaves out both" in capsys.readouterr().err
    load_modes.check(parse("--first-loads", "3", "--only", "MMAP"))  # one of the two: fine
    assert load_modes.first_load_paths(["mmap"]) == ["InstantTensor MMAP"]
    assert load_modes.first_load_paths(None) == ["ferry", "InstantTensor MMAP"]


# ---- waivers ------------------------------------------------------------------------

def test_without_a_gpu_the_suite_and_its_modes_are_waived(tmp_path, capsys):
    if gpu_absent_reason(ferry.cuda_info()) is None:
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "load.json"
    assert bl.main(["--first-loads", "2", "--ranks", "2", "--json", str(out)]) == 0
    assert "ferry bench load: waived: needs a CUDA device" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert "needs a CUDA device" in json.dumps(doc) and not [r for r in doc["records"] if r["suite"] == "load"]


def test_fewer_gpus_than_ranks_waive_the_mode_and_pass(capsys):
    assert load_modes.ranks_waiver(2, 2) is None and load_modes.ranks_waiver(1, 0) is None
    why = load_modes.ranks_waiver(4, 1)
    assert "--ranks 4 needs 4 GPUs" in why and "this machine has 1" in why
    results = {"waived": {}, "warm": {}}
    gpus = load_modes.gpu_count()  # this machine's own count (0 without a driver)
    assert gpus == (0 if gpu_absent_reason(ferry.cuda_info()) else gpus)
    ranks = max(2, gpus + 1)
    load_modes.run_ranks(parse("--ranks", str(ranks)), ["/nonexistent"], 1, results, gpus)
    assert results["ranks"]["waived"] == load_modes.ranks_waiver(ranks, gpus)
    load_modes.print_ranks(results)
    assert f"this machine has {gpus}: the mode is waived" in capsys.readouterr().out
    assert load_modes.passed(results)
    out = Records("load")
    load_modes.records(out, results, {})
    assert out.items == []


# ---- the child processes ------------------------------------------------------------------

def test_ranks_meet_at_the_barrier_every_round_and_load_bit_for_bit(checkpoint):
    paths, tensors = checkpoint
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    jobs = [{"mode": "rank", "method": CPU, "paths": paths, "device": i, "rounds": 3} for i in range(3)]
    got = load_procs.run_together(jobs, rounds=3, timeout=120)
    assert [r["error"] for r in got] == [None] * 3 and [r["exit_status"] for r in got] == [0] * 3
    assert len({r["ready"]["pid"] for r in got}) == 3  # three processes
    assert all(r["ready"]["warm_up_verified"] for r in got)
    last_ready = max(r["ready"]["ready_at"] for r in got)
    for k in range(3):
        row = [r["results"][k] for r in got]
        assert [m["round"] for m in row] == [k] * 3 and all(m["load_verified"] for m in row)
        # released only once every child was ready, and each round only after the last one's results
        assert min(m["load_start"] for m in row) >= last_ready
        if k:
            assert min(m["load_start"] for m in row) >= max(m["load_end"] for m in (r["results"][k - 1] for r in got))
    s = load_modes.summarize_ranks(got[:1], got, nbytes)
    assert s["ranks"] == 3 and s["rounds"] == 3 and s["verified"] and s["errors"] == []
    assert s["in_all_gbps"] == pytest.approx(load_modes.median(
        [3 * nbytes / max(r["results"][k]["load_s"] for r in got) / 1e9 for k in range(3)]))
    assert s["sum_gbps"] >= s["in_all_gbps"] * (1 - 1e-9)


def test_a_fresh_process_times_its_first_and_second_load(checkpoint):
    paths, tensors = checkpoint
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    runs = []
    for _ in range(2):
        runs += load_procs.run_together([{"mode": "first", "method": CPU, "paths": paths}], timeout=120)
    assert [r["error"] for r in runs] == [None, None] and runs[0]["ready"]["pid"] != runs[1]["ready"]["pid"]
    res = runs[0]["results"][0]
    assert res["first_s"] > 0 and res["second_s"] > 0 and res["first_verified"] and res["second_verified"]
    assert res["first_end"] <= res["second_start"]
    assert "after_empty_cache_s" not in res and "loader_s" not in res  # no CUDA, no ferry loader here
    s = load_modes.summarize_first(runs, nbytes)
    assert s["processes"] == s["completed"] == 2 and s["verified"] and s["mismatch"] is None
    assert s["first_call_gbps"] == pytest.approx(load_modes.median([nbytes / r["results"][0]["first_s"] / 1e9
                                                                    for r in runs]))
    assert s["first_over_second"] == pytest.approx(load_modes.median(
        [r["results"][0]["second_s"] / r["results"][0]["first_s"] for r in runs]))


def test_a_child_that_fails_before_ready_stops_the_others_with_its_reason(checkpoint, tmp_path):
    paths, _ = checkpoint
    missing = str(tmp_path / "gone.safetensors")
    jobs = [{"mode": "rank", "method": CPU, "paths": paths, "rounds": 2},
            {"mode": "rank", "method": CPU, "paths": [missing], "rounds": 2}]
    t0 = time.monotonic()
    got = load_procs.run_together(jobs, rounds=2, timeout=120)
    assert time.monotonic() - t0 < 100
    assert "FileNotFoundError" in got[1]["error"] or "No such file" in got[1]["error"]
    assert got[0]["error"] == "stopped: child 1 failed" and got[0]["results"] == []
    assert all(r["exit_status"] != 0 for r in got)  # the one released from its wait ends with an error too
    s = load_modes.summarize_ranks([], got, 1)
    assert not s["verified"] and len(s["errors"]) == 2
    assert not load_modes.passed({"ranks": s})


def test_a_bad_job_is_an_error_message_not_a_hang(checkpoint):
    paths, _ = checkpoint
    got = load_procs.run_together([{"mode": "first", "method": "no such loader", "paths": paths}], timeout=120)
    assert "method 'no such loader': expected one of ferry" in got[0]["error"]
    assert got[0]["exit_status"] == 1
    got = load_procs.run_together([{"mode": "sideways", "method": CPU, "paths": paths}], timeout=120)
    assert "mode 'sideways'" in got[0]["error"]


def test_a_child_that_does_not_answer_in_time_is_reported_and_ended(checkpoint):
    paths, _ = checkpoint
    t0 = time.monotonic()
    got = load_procs.run_together([{"mode": "first", "method": CPU, "paths": paths}], timeout=0.05)
    assert got[0]["error"] == "no 'ready' within 0.05 s"
    assert got[0]["exit_status"] is not None and got[0]["exit_status"] != 0
    assert time.monotonic() - t0 < 2 * load_procs.FINISH_S + 5


def test_a_child_never_released_ends_itself_after_its_timeout(checkpoint):
    paths, _ = checkpoint
    c = load_procs.Child({"mode": "first", "method": CPU, "paths": paths, "timeout": 1.0})
    try:
        c.expect("ready", time.monotonic() + 120)
        t0 = time.monotonic()
        with pytest.raises(load_procs.ChildFailed, match="no 'go' from the parent within 1 s"):
            c.expect("result", time.monotonic() + 60)  # no "go" sent
        assert time.monotonic() - t0 < 30
    finally:
        assert c.finish() == 1


def test_the_bit_check_sees_a_changed_byte_a_missing_and_an_extra_tensor(checkpoint):
    paths, tensors = checkpoint
    got = {k: v.clone() for k, v in tensors.items()}
    assert load_child.differs(torch, got, paths) is None
    name = max(tensors, key=lambda k: tensors[k].numel() * tensors[k].element_size())
    flat = got[name].reshape(-1).view(torch.uint8)
    flat[random.randrange(flat.numel())] ^= 0x10
    assert load_child.differs(torch, got, paths) == f"{name}: bytes differ"
    got[name] = tensors[name].clone()
    got["extra"] = torch.zeros(3)
    assert load_child.differs(torch, got, paths) == "extra tensors ['extra']"
    del got["extra"], got[name]
    assert load_child.differs(torch, got, paths) == f"{name}: missing"


# ---- figures, tables, records ------------------------------------------------------

def _rank_answer(device: int, seconds: list[float], start: float) -> dict:
    return {"job": {"device": device}, "error": None, "ready": {"warm_up_verified": True},
            "results": [{"round": k, "load_s": s, "load_start": start + 10 * k + 0.001 * device,
                         "load_end": start + 10 * k + s, "load_verified": True} for k, s in enumerate(seconds)]}


def test_two_ranks_give_per_rank_sum_in_all_targets_and_records(capsys):
    from test_bench_records import check_records, find

    nbytes = random.randint(4, 6) * 10**9
    secs = [[random.uniform(0.08, 0.12) for _ in range(3)] for _ in range(2)]
    together = [_rank_answer(d, secs[d], 100.0) for d in range(2)]
    s = load_modes.summarize_ranks([_rank_answer(0, [0.1] * 3, 50.0)], together, nbytes)
    per = [load_modes.median([nbytes / x / 1e9 for x in secs[d]]) for d in range(2)]
    assert s["per_rank_gbps"] == pytest.approx(per) and s["alone_gbps"] == pytest.approx(nbytes / 0.1 / 1e9)
    assert s["in_all_gbps"] == pytest.approx(load_modes.median([2 * nbytes / max(a, b) / 1e9
                                                                for a, b in zip(*secs)]))
    assert s["start_spread_ms"] == pytest.approx(1.0)
    states = {t: st for t, _, st in load_modes.rank_targets(s)}
    assert len(states) == 2
    want_all = "met" if s["in_all_gbps"] >= 90 else "missed"
    assert [st for t, st in states.items() if "in all" in t] == [want_all]
    results = {"ranks": s, "warm": {}}
    load_modes.print_ranks(results)
    text = capsys.readouterr().out
    assert "2 ranks at once" in text and "in all (2 x the checkpoint / slowest rank)" in text and "target:" in text
    out = Records("load")
    load_modes.records(out, results, {"preset": "dense"})
    check_records(out.items, "load")
    assert find(out.items, "ferry", rank="all", ranks=2)["value"] == pytest.approx(s["in_all_gbps"])
    assert find(out.items, "ferry", "sum_of_ranks_bandwidth")["value"] == pytest.approx(s["sum_gbps"])
    assert find(out.items, "ferry", rank=1, ranks=2)["value"] == pytest.approx(per[1])
    assert find(out.items, "ferry", ranks=1)["value"] == pytest.approx(s["alone_gbps"])
    assert load_modes.rank_targets({**s, "ranks": 3}) == []  # the targets are for two ranks


def test_first_loads_table_and_records_beside_the_warm_median(capsys):
    from test_bench_records import check_records, find

    def answer(loader_s, first_s, second_s):
        return {"error": None, "ready": {"pid": 1}, "results": [
            {"loader_s": loader_s, "first_s": first_s, "second_s": second_s, "after_empty_cache_s": second_s * 1.5,
             "first_verified": True, "second_verified": True, "after_empty_cache_verified": True}]}

    nbytes = 4_860_000_000
    ferry = load_modes.summarize_first([answer(0.02, 0.13, 0.1), answer(0.03, 0.15, 0.1),
                                        {"error": "no 'ready' within 300 s", "ready": None, "results": []}], nbytes)
    assert ferry["processes"] == 3 and ferry["completed"] == 2 and not ferry["verified"]
    assert ferry["first_call_gbps"] == pytest.approx(load_modes.median([nbytes / 0.15 / 1e9, nbytes / 0.18 / 1e9]))
    assert ferry["loader_ms"] == pytest.approx(25.0)
    it = load_modes.summarize_first([answer(0.0, 0.2, 0.12)], nbytes)
    del it["loader_ms"]
    results = {"first_loads": {"ferry": ferry, "InstantTensor MMAP": it},
               "warm": {"ferry": {"gb_per_s": 45.0}, "InstantTensor MMAP": {"gb_per_s": 40.0}}}
    load_modes.print_first_loads(results)
    text = capsys.readouterr().out
    assert "First load in a fresh process" in text and "a process failed: no 'ready' within 300 s" in text
    assert not load_modes.passed(results)  # one of ferry's processes failed
    out = Records("load")
    load_modes.records(out, results, {"preset": "dense"})
    check_records(out.items, "load")
    r = find(out.items, "ferry", "first_call_bandwidth")
    assert r["baseline"] == pytest.approx(it["first_call_gbps"]) and r["params"]["process"] == "fresh"
    assert find(out.items, "ferry", "second_load_bandwidth")["value"] == pytest.approx(48.6)
    assert find(out.items, "ferry", "loader_creation_time")["value"] == pytest.approx(25.0)
    assert find(out.items, "InstantTensor MMAP", "first_call_bandwidth")["baseline"] is None
    # the suite's records carry them beside the in-process ones
    cp = {"preset": "dense", "files": 1, "bytes": nbytes, "tensors": 108, "dtypes": ["bf16"]}
    recs = bl.records({**results, "checkpoint": cp, "cold": {},
                       "warm": {"ferry": {"gb_per_s": 45.0, "host_added_bytes": 0, "verified": True}}})
    check_records(recs, "load")
    assert find(recs, "ferry", "first_call_bandwidth")["params"]["preset"] == "dense"


def test_without_cuda_ferrys_fresh_process_fails_with_why_and_the_run_fails(checkpoint, capsys):
    """--first-loads' own path to the children (run_first_loads) on this machine:
    ferry's child cannot make a CUDA context, says why, and the suite would fail."""
    if gpu_absent_reason(ferry.cuda_info()) is None:
        pytest.skip("this machine has a CUDA device")
    paths, tensors = checkpoint
    results = {"waived": {}, "warm": {}}
    a = parse("--first-loads", "2", "--only", "ferry", "--child-timeout", "120")
    load_modes.run_first_loads(a, paths, 1, results, lambda label: None)
    s = results["first_loads"]["ferry"]
    assert s["processes"] == 2 and s["completed"] == 0 and len(s["errors"]) == 2 and not s["verified"]
    assert all(e.startswith(("RuntimeError", "AssertionError", "NoDeviceError")) for e in s["errors"]), s["errors"]
    assert not load_modes.passed(results)
    cp = {"preset": "dense", "files": 2, "bytes": 1, "tensors": len(tensors), "layers": 1, "experts": 0,
          "dtypes": ["bf16"]}
    bl.print_report({**results, "checkpoint": cp, "cold": {}}, 1)
    text = capsys.readouterr().out
    assert "First load in a fresh process" in text and "ferry: a process failed: " in text
    assert "0/2" in text
