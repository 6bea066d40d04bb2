"""Bench results in one shape (bench/records.py): records and their ratios, each
suite's records built from rows of the shape it measures (random figures), the
file write_json writes and merges, and `ferry bench --json FILE a,b` on this
machine (suites waived without a GPU say why in the file)."""

import json
import math
import os
import random
import subprocess
import sys

import pytest

import ferry
from ferry.bench import SUITE_MODULES, apiperf, blocks, copy, latency, pool, sanity, tensors, thp, uvm
from ferry.bench.records import KEYS, Records, is_record, record
from ferry.bench.report import write_json

MiB = 1 << 20


def check_records(items, suite):
    """Every item is a record of `suite`; ratios are value / baseline; no figure twice."""
    assert items, "no records"
    seen = set()
    for r in items:
        assert is_record(r), r
        assert tuple(r) == KEYS
        assert r["suite"] == suite
        key = (r["case"], json.dumps(r["params"], sort_keys=True), r["metric"])
        assert key not in seen, f"figure recorded twice: {key}"
        seen.add(key)
        if r["baseline"] is None:
            assert r["ratio"] is None and "baseline_case" not in r["params"], r
        else:
            assert r["params"]["baseline_case"] != r["case"]
            assert math.isclose(r["ratio"], r["value"] / r["baseline"]), r
        json.dumps(r)  # plain JSON values only


def find(items, case, metric="bandwidth", **params):
    hits = [r for r in items if r["case"] == case and r["metric"] == metric
            and all(r["params"].get(k) == v for k, v in params.items())]
    assert len(hits) == 1, (case, metric, params, hits)
    return hits[0]


def test_a_record_has_the_fixed_keys_and_its_ratio():
    rng = random.Random()
    v, b = rng.uniform(1, 60), rng.uniform(1, 60)
    r = record("copy", "ferry auto", "bandwidth", v, "GB/s", {"nbytes": 4096}, b)
    assert tuple(r) == KEYS and is_record(r)
    assert r["ratio"] == pytest.approx(v / b) and r["baseline"] == b
    assert record("copy", "x", "bandwidth", v, "GB/s")["ratio"] is None
    assert record("copy", "x", "bandwidth", v, "GB/s", baseline=0.0)["ratio"] is None
    assert record("copy", "x", "bandwidth", v, "GB/s", baseline=float("nan"))["baseline"] is None
    assert record("sanity", "x", "state", "Passed", None, baseline=3.0)["ratio"] is None
    with pytest.raises(ValueError, match="needs a suite, a case and a metric"):
        record("copy", "", "bandwidth", v, "GB/s")
    assert not is_record({"suite": "copy"})


def test_compare_gives_every_case_its_baseline_and_skips_missing_values():
    rng = random.Random()
    values = {"ferry": rng.uniform(1, 50), "cuda": rng.uniform(1, 50), "torch": None, "pinned": rng.uniform(1, 50)}
    out = Records("copy")
    made = out.compare({"nbytes": 123}, "bandwidth", "GB/s", values, baseline="cuda")
    assert [r["case"] for r in made] == ["ferry", "cuda", "pinned"] and out.items == made
    assert find(made, "ferry")["ratio"] == pytest.approx(values["ferry"] / values["cuda"])
    assert find(made, "cuda")["baseline"] is None
    assert find(made, "pinned")["params"] == {"nbytes": 123, "baseline_case": "cuda"}
    per_case = Records("copy").compare({}, "bandwidth", "GB/s", values, baseline={"ferry": "pinned", "cuda": "torch"})
    assert find(per_case, "ferry")["baseline"] == values["pinned"]
    assert find(per_case, "cuda")["baseline"] is None  # its baseline was not measured
    check_records(per_case, "copy")


def test_write_json_merges_suites_and_replaces_a_suites_earlier_records(tmp_path):
    path = str(tmp_path / "bench.json")
    a = Records("copy")
    a.add("ferry auto", "bandwidth", 50.0, "GB/s", baseline=8.0, baseline_case="cuda", nbytes=MiB)
    b = Records("pool")
    b.add("cudaHostAlloc", "time", 0.4, "s", nbytes=MiB)
    write_json(path, "copy", a.items)
    write_json(path, "pool", b.items)
    data = json.loads(open(path).read())
    assert set(data) == {"header", "suites", "records"}
    assert set(data["suites"]) == {"copy", "pool"} and data["suites"]["pool"]["waived"] is None
    assert data["records"] == a.items + b.items
    assert data["header"]["host"]["name"] and "ferry" in data["header"]
    again = Records("copy")
    again.add("ferry auto", "bandwidth", 51.0, "GB/s", nbytes=MiB)
    write_json(path, "copy", again.items)
    data = json.loads(open(path).read())
    assert data["records"] == b.items + again.items  # copy's earlier records replaced, pool's kept
    write_json(path, "thp", [], waived="needs a CUDA device: none here")
    data = json.loads(open(path).read())
    assert data["suites"]["thp"]["waived"] == "needs a CUDA device: none here" and len(data["records"]) == 2
    assert "details" not in data
    write_json(path, "nixl", [], details={"rows": [{"op": "READ"}]})
    write_json(path, "pool", b.items)
    data = json.loads(open(path).read())
    assert data["details"] == {"nixl": {"rows": [{"op": "READ"}]}}  # kept when another suite writes


def test_write_json_replaces_other_files_and_refuses_what_is_not_records(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"suite": "copy", "header": {}, "results": {"rows": []}}))  # the old shape
    r = Records("blocks")
    r.add("ferry batch auto", "bandwidth", 9.0, "GB/s")
    write_json(str(path), "blocks", r.items)
    assert json.loads(path.read_text())["records"] == r.items
    with pytest.raises(TypeError, match="takes a list of records"):
        write_json(str(path), "load", {"rows": []})
    with pytest.raises(TypeError, match="takes a list of records"):
        write_json(str(path), "load", [{"case": "x"}])
    assert json.loads(path.read_text())["records"] == r.items  # nothing written


def gbps(rng):
    return rng.uniform(0.5, 60)


def test_copy_records_compare_each_path_with_its_baseline():
    rng = random.Random()
    n = rng.choice([4096, MiB, 1 << 30])
    row = {"backing": "4k", "direction": "h2d", "nbytes": n, "strategy_auto": "staged"}
    for key in copy.ROW_CASES:
        row[key] = gbps(rng)
    bidir = {"backing": "thp", "direction": "bidir", "nbytes": n, "ferry_auto": gbps(rng),
             "cuda_pageable": gbps(rng)}
    sweep = {"direction": "d2h", "nbytes": n, **{k: gbps(rng) for k in copy.SWEEP_CASES}}
    results = {"sweep": [sweep], "rows": [row, bidir], "link_gbps": 63.0,
               "gpu_placement": [{"gpu": 0, "numa_node": -1, "crew_threads": 16, "crew_cpus": None}],
               "gpus": [{"gpus": "all", "kind": "pinned", "direction": "h2d", "gbps": gbps(rng)}]}
    items = copy.records(results)
    check_records(items, "copy")
    auto = find(items, "ferry auto", table="backings", backing="4k")
    assert auto["value"] == row["ferry_auto"] and auto["params"]["strategy"] == "staged"
    assert auto["ratio"] == pytest.approx(row["ferry_auto"] / row["cuda_pageable"])  # the table's "x cuda pageable"
    assert find(items, "ferry registered", nbytes=n)["baseline"] == row["cuda_pinned"]
    assert find(items, "ferry auto", backing="thp")["ratio"] == pytest.approx(
        bidir["ferry_auto"] / bidir["cuda_pageable"])
    s = find(items, "ferry.copy pageable", table="sweep")
    assert s["ratio"] == pytest.approx(sweep["ferry_auto"] / sweep["torch_pageable"])
    assert find(items, "link limit")["value"] == 63.0
    assert find(items, "engine placement", "crew_threads")["value"] == 16
    assert len([r for r in items if r["params"].get("table") == "backings"]) == len(copy.ROW_CASES) + 2 + 1


def test_blocks_latency_thp_tensors_and_apiperf_records():
    rng = random.Random()
    rows = [{"blocks": 1024, "block_bytes": 16384, "layout": "scattered", "direction": d, "path": "sm",
             "ferry": gbps(rng), "ferry_sm": gbps(rng), "ferry_dma": gbps(rng), "ferry_sm4": gbps(rng),
             "ferry_launch0": gbps(rng), "ferry_launch1048576": gbps(rng), "batch": gbps(rng), "torch_loop": None, "ferry_cpu_us": rng.uniform(0.01, 1),
             "batch_cpu_us": rng.uniform(0.1, 1)} for d in ("h2d", "d2h", "both")]
    gemm = [{"block_bytes": 4096, "sms": 0, "gemm_alone_ms": 1.4, "gemm_beside_ms": 1.45,
             "slowdown_pct": rng.uniform(0, 9), "copies_gbps": gbps(rng)}]
    items = blocks.records({"rows": rows, "gemm": gemm})
    check_records(items, "blocks")
    assert find(items, "ferry copy_many", direction="d2h")["ratio"] == pytest.approx(
        rows[1]["ferry"] / rows[1]["batch"])  # the table's "ferry x batch"
    assert find(items, "ferry copy_many", direction="bidir")["value"] == rows[2]["ferry"]
    assert find(items, "ferry sm 4 SMs", direction="h2d")["value"] == rows[0]["ferry_sm4"]
    assert find(items, "ferry SM one launch", direction="d2h")["value"] == rows[1]["ferry_launch0"]
    assert find(items, "ferry SM launch 1024 KiB", direction="h2d")["value"] == rows[0]["ferry_launch1048576"]
    assert find(items, "ferry copy_many", "submit_per_block", direction="h2d")["ratio"] == pytest.approx(
        rows[0]["ferry_cpu_us"] / rows[0]["batch_cpu_us"])
    assert find(items, "bf16 GEMM beside ferry copies", "slowdown")["value"] == gemm[0]["slowdown_pct"]
    assert not [r for r in items if r["case"] == "torch copy_ loop"]  # not measured: no record
    # --calibrate: the first size from which the copy engines keep up in every direction.
    cal = [{"block_bytes": b, "layout": "scattered", "direction": d, "ferry_sm": 40.0, "ferry_dma": dma}
           for b, dma in ((4096, 10.0), (32768, 45.0), (65536, 37.0), (131072, 38.5), (262144, 50.0))
           for d in ("h2d", "d2h")]
    assert blocks.calibrate(cal) == "batch_sm_below_bytes = 131072"  # within 5%: the copy engines
    assert blocks.calibrate(cal[:2]) is None


    def stats():
        m = rng.uniform(1, 20)
        return {"median_us": m, "min_us": m / 2, "p99_us": m * 3}

    lat = {"copies": [{"nbytes": 4, "direction": "h2d", "channel": stats(), "cudaMemcpy": stats(),
                       "cudaMemcpyAsync_pinned": stats()}],
           "ping": stats(), "first_after_idle": stats(), "idle_us": 200,
           "stats": {"requests": 10, "launches": 2}}
    items = latency.records(lat)
    check_records(items, "latency")
    c = lat["copies"][0]
    assert find(items, "ferry channel", "latency_median", nbytes=4)["ratio"] == pytest.approx(
        c["channel"]["median_us"] / c["cudaMemcpy"]["median_us"])
    assert find(items, "ferry channel ping", "latency_p99")["value"] == lat["ping"]["p99_us"]

    trow = {"backing": "memfd", "huge_bytes": 0, "pinned_d2h": gbps(rng), "cuda_pageable_d2h": gbps(rng),
            "cuda_pageable_h2d": gbps(rng), "ferry_pageable_d2h": gbps(rng), "ferry_pageable_h2d": gbps(rng)}
    items = thp.records([trow], 256 * MiB, "never", {"memfd-thp": "shmem_enabled=never"})
    check_records(items, "thp")
    assert find(items, "ferry pageable", direction="d2h")["ratio"] == pytest.approx(
        trow["ferry_pageable_d2h"] / trow["cuda_pageable_d2h"])
    assert find(items, "backing", "state", backing="memfd-thp")["value"] == "Waived"

    trows = [{"direction": d, "case": c, "seconds": rng.uniform(0.1, 2), "gbps": gbps(rng)}
             for d, cases in (("h2d", ["ferry.torch.to_device(dict)", '.to("cuda") loop']),
                              ("d2h", ["ferry.torch.to_host(dict)", ".cpu() loop"])) for c in cases]
    items = tensors.records(trows, 108, 5 * 10**9, "bfloat16", 3)
    check_records(items, "tensors")
    assert find(items, "ferry.torch.to_host(dict)")["ratio"] == pytest.approx(trows[2]["gbps"] / trows[3]["gbps"])
    assert find(items, '.to("cuda") loop', "time")["unit"] == "s"

    pools = [["Pool() (host)", rng.uniform(1, 100)]]
    regs = [["register 64 KiB", rng.uniform(1, 100), rng.uniform(1, 100)],
            ["unregister 1048576 KiB", rng.uniform(1, 100), rng.uniform(1, 100)]]
    chans = [["first request (launches the kernel)", rng.uniform(1, 100)]]
    items = apiperf.records(pools, regs, chans)
    check_records(items, "apiperf")
    r = find(items, "ferry register", "time_median", nbytes=64 * 1024)
    assert r["ratio"] == pytest.approx(regs[0][1] / regs[0][2]) and r["params"]["baseline_case"] == "cudaHostRegister"
    assert find(items, "ferry unregister", "time_median", nbytes=1 << 30)["unit"] == "us"


def test_pool_sanity_and_uvm_records():
    rng = random.Random()
    n = 1 << 30
    ttp = [{"method": m, "nbytes": n, "seconds": rng.uniform(0.1, 1), "pinned_bytes": n}
           for m in ("cudaHostAlloc", "ferry-target", "ferry-target+alloc")]
    ttp[2]["alloc_seconds"] = 0.001
    ttp[1]["runs_seconds"] = sorted([ttp[1]["seconds"], 0.05, 1.5])
    results = {
        "time_to_pinned": ttp,
        "recycle": [{"nbytes": 4096, "ferry_median_us": 0.5, "ferry_p99_us": 1.0, "cuda_median_us": 300.0}],
        "python_recycle": {"zero_recycled": False, "sizes": [
            {"nbytes": 65536, "ferry pool.alloc+del": {"median_us": 2.0, "p99_us": 3.0},
             "torch.empty(pin_memory=True)+del": {"median_us": 4.0, "p99_us": 9.0}}]},
        "registration": [{"backing": "4k", "nbytes": n, "register_seconds": 0.35, "register_gbps": 3.0,
                          "touch_seconds": 0.1},
                         {"backing": "thp", "nbytes": n, "register_seconds": 0.2, "register_gbps": 5.3},
                         {"backing": "hugetlb-1g", "nbytes": n, "waived": "no 1 GiB pages reserved"}],
    }
    items = pool.records(results)
    check_records(items, "pool")
    t = find(items, "ferry-target", "time")
    assert t["ratio"] == pytest.approx(ttp[1]["seconds"] / ttp[0]["seconds"])  # below 1: faster
    assert find(items, "ferry-target+alloc", "alloc_time")["value"] == 0.001
    assert (find(items, "ferry-target", "time_min")["value"], find(items, "ferry-target", "time_max")["value"]) == (
        0.05, 1.5)
    assert find(items, "ferry pool alloc+free", "latency_median")["ratio"] == pytest.approx(0.5 / 300.0)
    assert find(items, "ferry pool.alloc+del", "latency_p99")["ratio"] == pytest.approx(3.0 / 9.0)
    assert find(items, "register thp", "time")["ratio"] == pytest.approx(0.2 / 0.35)
    assert find(items, "register hugetlb-1g", "state")["params"]["why"] == "no 1 GiB pages reserved"

    checks = {"pool_recycles_exact_sizes": ("Passed", ""), "copy_staged": ("Waived", "needs a CUDA device")}
    items = sanity.records(checks)
    check_records(items, "sanity")
    assert find(items, "copy_staged", "state")["params"] == {"why": "needs a CUDA device"}
    assert find(items, "pool_recycles_exact_sizes", "state")["value"] == "Passed"

    rows = uvm.add_ratios([{"config": c, "nodes": 5_000_000, "epoch_s_median": s, "peak_bytes": 10**9}
                           for c, s in (("pytorch", 1.0), ("managed_pool+prefetch", 1.1))])
    rows.append({"config": "managed", "nodes": 5_000_000, "error": "timed out after 5 s"})
    items = uvm.records(rows, [{"nodes": 15_000_000, "why": "needs 120 GB"}], {"epochs": 2, "impl": "sparse"},
                        {"free": 10**11, "total": 1.4e11, "name": "H200", "torch": "2.11"})
    check_records(items, "uvm")
    assert find(items, "managed_pool+prefetch", "epoch_time", nodes=5_000_000)["ratio"] == pytest.approx(1.1)
    assert find(items, "managed", "error")["value"] == "timed out after 5 s"
    assert find(items, "all", "state", nodes=15_000_000)["params"]["why"] == "needs 120 GB"
    assert find(items, "study: managed", "epoch_time")["ratio"] == pytest.approx(34.2 / 1.14)


def test_every_suite_writes_records():
    import importlib
    import inspect

    for name in SUITE_MODULES:
        src = inspect.getsource(importlib.import_module(f"ferry.bench.{name}"))
        assert "write_json(args.json, self.key, rec" in src, f"bench {name} writes no records"


def test_ferry_bench_json_runs_several_suites_into_one_file(tmp_path):
    have_gpu = bool(ferry.cuda_info() and ferry.cuda_info().get("devices"))
    if have_gpu:
        pytest.skip("a CUDA device is present: these suites would measure (scripts/gpu-check runs them)")
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", "--json", str(out), "thp,blocks"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ferry bench thp: waived" in r.stdout and "ferry bench blocks: waived" in r.stdout
    data = json.loads(out.read_text())
    assert set(data["suites"]) == {"thp", "blocks"} and data["records"] == []
    assert "needs a CUDA device" in data["suites"]["blocks"]["waived"]
    # Another suite into the same file: sanity runs its checks here (GPU ones waive themselves).
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", "sanity", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert set(data["suites"]) == {"thp", "blocks", "sanity"} and data["suites"]["sanity"]["waived"] is None
    check_records(data["records"], "sanity")
    states = {rec["case"]: rec["value"] for rec in data["records"]}
    assert states["pool_recycles_exact_sizes"] == "Passed" and states["copy_staged"] == "Waived"
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", "thp,warp-drive"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2 and "unknown bench suite 'warp-drive'" in r.stderr


def test_small_runs_on_a_gpu_write_records_of_their_measurements(gpu, tmp_path):
    """On a device: blocks, latency and thp, small, into one file; every figure a
    positive number, every ferry figure compared with its baseline."""
    out = str(tmp_path / "bench.json")
    assert blocks.main(["--blocks", "64x16K,8x1M", "--repeats", "3", "--layouts", "scattered", "--directions",
                        "h2d,d2h", "--no-gemm", "--no-torch-loop", "--json", out]) == 0
    assert latency.main(["--repeats", "50", "--json", out]) == 0
    assert thp.main(["--size", "8M", "--repeats", "2", "--json", out]) == 0
    data = json.loads(open(out).read())
    assert set(data["suites"]) == {"blocks", "latency", "thp"}
    assert all(s["waived"] is None for s in data["suites"].values())
    by_suite = {}
    for r in data["records"]:
        by_suite.setdefault(r["suite"], []).append(r)
    for suite, items in by_suite.items():
        check_records(items, suite)
    b = by_suite["blocks"]
    bw = [r for r in b if r["metric"] == "bandwidth"]
    assert len(bw) == 2 * 2 * (len(blocks.CASES) - 1)  # two cases, two directions; no torch loop
    for r in bw:
        assert r["unit"] == "GB/s" and r["value"] > 0
        assert (r["baseline"] is None) == (r["case"] == blocks.BASELINE)
    cpu = [r for r in b if r["metric"] == "submit_per_block"]
    assert len(cpu) == 2 * 2 * 2 and all(r["unit"] == "us" and r["value"] > 0 for r in cpu)
    lat = [r for r in by_suite["latency"] if r["metric"] == "latency_median" and r["case"] == "ferry channel"]
    assert len(lat) == 2 * len(latency.SIZES) and all(r["value"] > 0 and r["ratio"] > 0 for r in lat)
    t = [r for r in by_suite["thp"] if r["case"] == "ferry pageable"]
    assert {r["params"]["direction"] for r in t} == {"h2d", "d2h"} and all(r["ratio"] > 0 for r in t)


def test_blocks_calibration_joins_the_profile_file(tmp_path):
    """--calibrate's line replaces its key in the engine's profile file and keeps the
    other lines (`ferry bench copy --calibrate`'s). A fresh process per write: the
    options (FERRY_PROFILE) are read once per process."""
    path = tmp_path / "profile.txt"
    env = dict(os.environ, FERRY_PROFILE=str(path))

    def write(line):
        code = f"from ferry.bench import blocks; print(blocks.write_calibration({line!r}))"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    path.write_text("# ferry machine profile\ncuda_below_bytes_h2d = 0\nbatch_sm_below_bytes = 4096  # old\n")
    assert write("batch_sm_below_bytes = 524288") == str(path)
    lines = path.read_text().splitlines()
    assert "cuda_below_bytes_h2d = 0" in lines
    assert [x for x in lines if x.startswith("batch_sm_below_bytes")] == [
        "batch_sm_below_bytes = 524288  # ferry bench blocks --calibrate"]
    path.unlink()
    assert write("batch_sm_below_bytes = 65536") == str(path)
    assert "batch_sm_below_bytes = 65536" in path.read_text()
