"""`ferry doctor`'s measurements (python/ferry/doctor/, python/ferry/measure.py):
the command without and with a GPU, the formatting of ratio lines (units.py, the
report model and its text rendering), and the run's control flow (skips, budget,
failures) with faked GPU measurements."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

import ferry
from ferry import doctor, measure, units
from ferry.doctor import report as doctor_report
from ferry.doctor import text_report

GPU_KEYS = (
    "pinned_h2d_gbps", "pinned_d2h_gbps",
    "pageable_h2d_gbps_cuda", "pageable_d2h_gbps_cuda", "pageable_h2d_gbps_ferry", "pageable_d2h_gbps_ferry",
    "pinned_alloc_seconds_cuda", "pinned_alloc_seconds_ferry",
    "small_copy_us_cuda_h2d", "small_copy_us_cuda_d2h", "small_copy_us_channel_h2d", "small_copy_us_channel_d2h",
    "register_gbps_4k", "register_gbps_thp",
)
HOST_KEYS = ("first_touch_4k_1thread_gbps", "first_touch_4k_gbps", "first_touch_thp_gbps")


def doctor_cmd(*args):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ferry", "doctor", *args], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    return r, time.monotonic() - t0


def no_device() -> bool:
    info = ferry.cuda_info()
    return info is None or not info.get("devices")


# ---- the command ---------------------------------------------------------------


def test_quick_json_measures_the_host_and_lists_gpu_skips():
    r, seconds = doctor_cmd("--quick", "--json")
    assert r.returncode == 0, r.stderr
    assert "ferry doctor: [" not in r.stderr  # no progress with --json
    d = json.loads(r.stdout)
    for key in ("host", "cuda", "gpus", "measurements", "skipped", "findings", "pool", "elapsed_seconds"):
        assert key in d
    assert d["mode"] == "quick"
    m = d["measurements"]
    for key in HOST_KEYS:
        assert m[key] > 0, key
    assert m["memcpy_gbps_by_threads"]["1"] > 0
    assert all(v > 0 for v in m["memcpy_gbps_by_threads"].values())
    assert d["pool"]["chunk_reservations"] >= 1
    for f in d["findings"]:
        assert set(f) == {"id", "severity", "title", "evidence", "fix"}
    if no_device():
        skipped_keys = {k for s in d["skipped"] for k in s["keys"]}
        for key in GPU_KEYS:
            assert key not in m
            assert key in skipped_keys, key
        for s in d["skipped"]:
            assert s["why"].startswith(("no CUDA driver", "no CUDA device")), s
        assert seconds < 30, f"doctor --quick took {seconds:.1f} s"


def test_text_report_has_measurements_and_progress():
    r, _ = doctor_cmd("--quick")
    assert r.returncode == 0, r.stderr
    assert "Measurements" in r.stdout
    assert "first touch" in r.stdout and "GB/s" in r.stdout
    assert "ferry doctor: [1/" in r.stderr and "ferry doctor: done in" in r.stderr
    if no_device():
        assert "skipped" in r.stdout


def test_doctor_imports_no_torch():
    code = ("import sys, ferry.doctor, ferry.measure; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_gpu_measurements(gpu):
    r, _ = doctor_cmd("--quick", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    m = d["measurements"]
    assert m["pinned_h2d_gbps"]["0"] > 0 and m["pinned_d2h_gbps"]["0"] > 0, d["skipped"]
    assert "0" in m["pageable_h2d_gbps_ferry"], d["skipped"]
    assert m["pageable_h2d_gbps_ferry"]["0"] > 0
    assert m["pinned_alloc_seconds_ferry"] > 0 and m["small_copy_us_channel_h2d"] > 0, d["skipped"]


# ---- formatting ------------------------------------------------------------------


def test_versus_gives_the_ratio_in_ferrys_favour():
    assert units.versus(41.2, 6.9, units.fmt_gbps) == "ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x)"
    assert (units.versus(0.034, 0.495, units.fmt_seconds, "ferry pool", "cudaHostAlloc", lower_is_better=True)
            == "ferry pool 34 ms vs cudaHostAlloc 495 ms (14.6x)")
    assert units.versus(None, 6.9, units.fmt_gbps) == "ferry not measured vs CUDA 6.9 GB/s"
    assert units.versus(None, None, units.fmt_gbps) == "not measured"
    assert units.link_share(41.2, 63.0) == "65% of the 63.0 GB/s link"
    assert units.link_share(41.2, None) == ""
    assert units.fmt_us(1.94) == "1.9 us" and units.fmt_seconds(12.5) == "12.5 s"


def format_measurements(report: dict) -> str:
    """The Measurements and Skipped measurements sections of the text report."""
    return text_report.render([doctor_report.measurements_section(report), doctor_report.skipped_section(report)])


def synthetic_report(**measurements):
    return {
        "mode": "default",
        "elapsed_seconds": 21.5,
        "gpus": [{"index": 0, "name": "NVIDIA H200", "link_gbps": 63.0, "max_link_gbps": 63.0}],
        "measurements": measurements,
        "skipped": [{"what": "registration rate, hugetlb pages, GPU 0 (1 GiB)", "keys": ["register_gbps_hugetlb"],
                     "why": "0 free 2 MiB hugetlb pages, 512 needed"}],
    }


def test_format_measurements_shows_ratios_to_the_link_and_to_cuda():
    text = format_measurements(synthetic_report(
        copy_bytes=1 << 30,
        pinned_h2d_gbps={"0": 55.4}, pinned_d2h_gbps={"0": 55.0},
        pageable_h2d_gbps_ferry={"0": 41.2}, pageable_h2d_gbps_cuda={"0": 6.9},
        pageable_d2h_gbps_ferry={"0": 40.9}, pageable_d2h_gbps_cuda={"0": 15.6},
        pinned_alloc_seconds_ferry=0.034, pinned_alloc_seconds_cuda=0.495, pinned_alloc_bytes=1 << 30,
        small_copy_us_channel_h2d=1.9, small_copy_us_cuda_h2d=9.8,
        register_gbps_4k=2.0, register_gbps_thp=3.8, register_bytes=1 << 30,
        memcpy_gbps_by_threads={"16": 40.1, "1": 10.2, "2": 19.5}, memcpy_bytes=256 << 20,
        first_touch_4k_gbps=8.4, first_touch_thp_gbps=20.1,
        bandwidth_by_size={"0": [{"nbytes": 64 << 20, "pinned_h2d_gbps": 50.0, "pinned_d2h_gbps": 49.0,
                                  "pageable_h2d_gbps_ferry": 26.8, "pageable_d2h_gbps_ferry": 31.8,
                                  "pageable_h2d_gbps_cuda": 12.5, "pageable_d2h_gbps_cuda": 13.8}]},
    ))
    assert text.startswith("Measurements\n  default run, 21.5 s")
    assert "GPU 0 (NVIDIA H200), link 63.0 GB/s per direction" in text
    assert "pinned host->device (1 GiB)" in text and "55.4 GB/s, 88% of the 63.0 GB/s link" in text
    assert "ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x), 65% of the 63.0 GB/s link" in text
    assert "ferry 40.9 GB/s vs CUDA 15.6 GB/s (2.6x), 65% of the 63.0 GB/s link" in text
    assert "pinned 1 GiB ready to use" in text and "ferry pool 34 ms vs cudaHostAlloc 495 ms (14.6x)" in text
    assert "channel 1.9 us vs cudaMemcpy 9.8 us (5.2x)" in text
    assert "Bandwidth by size, GPU 0 (GB/s)" in text
    by_size = next(line for line in text.splitlines() if line.strip().startswith("64 MiB"))
    assert by_size.split() == ["64", "MiB", "50.0", "49.0", "26.8", "12.5", "31.8", "13.8"]
    assert "4 KiB pages 2.0 GB/s, THP 3.8 GB/s (1.9x)" in text
    assert "1 thread 10.2 GB/s, 2 threads 19.5 GB/s, 16 threads 40.1 GB/s" in text
    skipped = text[text.index("Skipped measurements"):]
    assert "registration rate, hugetlb pages, GPU 0 (1 GiB)  0 free 2 MiB hugetlb pages" in skipped


def test_text_report_opens_with_the_findings_then_measurements_then_facts():
    report = synthetic_report(pinned_h2d_gbps={"0": 55.4}, copy_bytes=1 << 30)
    report["findings"] = [
        {"id": "b-info", "severity": "info", "title": "an info", "evidence": ["e1"], "fix": "do b"},
        {"id": "a-warn", "severity": "warning", "title": "a warning", "evidence": ["e2"], "fix": "do a"},
    ]
    text = text_report.format_report(report)
    sections = [line for line in text.splitlines() if line and not line[0].isspace() and not line.startswith("[")]
    assert sections == ["Findings", "Measurements", "Skipped measurements", "Facts"]
    assert text.index("[warning] a-warn: a warning") < text.index("[info] b-info: an info") < text.index("Measurements")
    assert "    fix: do a" in text and "    - e2" in text
    assert "2 findings: 0 critical, 1 warning, 1 info" in text


def test_format_measurements_uses_the_max_link_when_an_idle_gpu_trained_down():
    report = synthetic_report(pinned_h2d_gbps={"0": 55.4}, copy_bytes=1 << 30)
    report["gpus"][0]["link_gbps"] = 4.0  # Gen1 x16 while idle
    text = format_measurements(report)
    assert "88% of the 63.0 GB/s link" in text


def test_format_measurements_of_nothing():
    text = format_measurements({"measurements": {}, "skipped": []})
    assert "Measurements" in text and "(none)" in text


def test_thread_counts_stop_at_the_usable_cores():
    assert measure.thread_counts(2) == [1, 2]
    assert measure.thread_counts(12) == [1, 2, 4, 8, 12]
    assert measure.thread_counts(64) == [1, 2, 4, 8, 16]
    assert measure.thread_counts(64, None) == [1, 2, 4, 8, 16, 32, 64]
    assert measure.thread_counts(1) == [1]


def test_guarded_turns_exceptions_into_reasons():
    def boom():
        raise RuntimeError("boom")

    def skip():
        raise measure.Skipped("not here")

    assert measure.guarded(lambda: 3) == (3, None)
    assert measure.guarded(boom) == (None, "RuntimeError: boom")
    assert measure.guarded(skip) == (None, "not here")
    assert measure.gpu_absent_reason(None).startswith("no CUDA driver")
    assert measure.gpu_absent_reason({"devices": []}) == "no CUDA device"
    assert measure.gpu_absent_reason({"devices": [{"index": 0}]}) is None


def test_host_memcpy_by_threads_is_positive():
    rates = measure.memcpy_gbps_by_threads(8 << 20, [1, 2], reps=2)
    assert set(rates) == {"1", "2"} and all(v > 0 for v in rates.values())


# ---- the run's control flow, with faked GPU measurements --------------------------


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two fake GPUs: cuda_info and facts say so, and every GPU measurement is faked."""
    info = {"driver_version": 13000, "runtime_version": 13000,
            "devices": [{"index": 0, "name": "Fake H200"}, {"index": 1, "name": "Fake H200"}]}
    real_collect = ferry.facts.collect

    def collect(cuda_info, engine=None):
        f = real_collect(None, engine)
        f["cuda"] = {"driver_version": "13.0", "runtime_version": "13.0", "device_count": 2}
        f["gpus"] = [{"index": i, "name": "Fake H200", "link_gbps": 63.0, "max_link_gbps": 63.0,
                      "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16}} for i in (0, 1)]
        f["host"]["hugetlb"] = [{"page_size_bytes": 2 << 20, "total": 0, "free": 0}]
        return f

    calls = []
    monkeypatch.setattr(ferry._ferry, "cuda_info", lambda: info)
    monkeypatch.setattr(ferry.facts, "collect", collect)
    monkeypatch.setattr(measure, "pinned_gbps", lambda dev, n, reps: calls.append(("pinned", dev, n))
                        or {"h2d": 55.4, "d2h": 53.0})
    monkeypatch.setattr(measure, "pageable_gbps", lambda dev, n, reps: calls.append(("pageable", dev, n))
                        or {"h2d_ferry": 41.2, "h2d_cuda": 6.9, "d2h_ferry": 40.9, "d2h_cuda": 15.6})
    monkeypatch.setattr(measure, "pinned_alloc_seconds", lambda dev, n: ({"cuda": 0.495, "ferry": 0.034},
                                                                         {"chunk_reservations": 1}))
    monkeypatch.setattr(measure, "small_copy_us", lambda dev, it: {"cuda_h2d": 9.8, "cuda_d2h": 9.5,
                                                                   "channel_h2d": 1.9, "channel_d2h": 2.4})
    monkeypatch.setattr(measure, "register_gbps", lambda dev, n, kind: {"4k": 2.0, "thp": 3.8}[kind])
    monkeypatch.setattr(measure, "aggregate_pinned_gbps", lambda devs, n, reps: calls.append(("all", tuple(devs)))
                        or {"h2d": 105.0, "d2h": 101.0})
    return calls


def test_run_fills_every_gpu_measurement(fake_gpus):
    report = doctor.run("quick", quiet=True)
    m = report["measurements"]
    assert m["pinned_h2d_gbps"] == {"0": 55.4, "1": 55.4}
    assert m["pinned_h2d_share_of_link"]["1"] == pytest.approx(55.4 / 63.0)
    assert m["pageable_d2h_gbps_cuda"] == {"0": 15.6, "1": 15.6}
    assert m["pinned_alloc_seconds_ferry"] == 0.034 and m["small_copy_us_channel_d2h"] == 2.4
    assert m["register_gbps_thp"] == 3.8 and "register_gbps_hugetlb" not in m
    assert [s["keys"] for s in report["skipped"]] == [["register_gbps_hugetlb"]]
    assert "hugetlb" in report["skipped"][0]["why"]
    assert report["pool"] == {"chunk_reservations": 1}  # the pinned pool's stats
    assert ("pinned", 1, 256 << 20) in fake_gpus
    assert ("all", (0, 1)) in fake_gpus and m["pinned_h2d_gbps_all_gpus"] == 105.0
    ids = [f["id"] for f in report["findings"]]
    assert "pageable-path-slow" in ids  # CUDA's 6.9 GB/s is below a quarter of 63 GB/s
    text = text_report.format_report(report)
    assert "GPU 1 (Fake H200)" in text and "(6.0x)" in text


def test_a_failing_measurement_is_skipped_with_its_error(fake_gpus, monkeypatch):
    def broken(dev, n, reps):
        raise ferry.CudaError("cudaMemcpy: an illegal memory access was encountered")

    monkeypatch.setattr(measure, "pageable_gbps", broken)
    report = doctor.run("quick", quiet=True)
    bad = [s for s in report["skipped"] if "pageable_h2d_gbps_ferry" in s["keys"]]
    assert len(bad) == 2 and "CudaError: cudaMemcpy" in bad[0]["why"]
    assert report["measurements"]["pinned_d2h_gbps"]["0"] == 53.0


def test_measurements_after_the_budget_are_skipped(fake_gpus, monkeypatch):
    monkeypatch.setitem(doctor.PLANS, "quick", dataclasses.replace(doctor.PLANS["quick"], budget_seconds=0))
    report = doctor.run("quick", quiet=True)
    assert not {k for k in report["measurements"] if k.endswith(("gbps", "seconds_ferry"))}
    assert report["skipped"] and all("time budget" in s["why"] or "hugetlb" in s["why"]
                                     for s in report["skipped"])
    assert fake_gpus == []


def test_a_full_run_measures_bandwidth_by_size_on_every_gpu(fake_gpus, monkeypatch):
    small = dataclasses.replace(doctor.PLANS["full"], touch_bytes=64 << 20, memcpy_bytes=16 << 20, most_threads=2,
                                by_size=(4 << 20, 64 << 20))
    monkeypatch.setitem(doctor.PLANS, "full", small)
    report = doctor.run("full", quiet=True)
    rows = report["measurements"]["bandwidth_by_size"]
    assert sorted(rows) == ["0", "1"] and [r["nbytes"] for r in rows["1"]] == [4 << 20, 64 << 20]
    assert rows["0"][0]["pageable_d2h_gbps_cuda"] == 15.6 and rows["0"][1]["pinned_h2d_gbps"] == 55.4
    assert ("pinned", 1, 64 << 20) in fake_gpus
    text = text_report.format_report(report)
    assert "Bandwidth by size, GPU 1 (GB/s)" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("64 MiB"))
    assert line.split()[2:] == ["55.4", "53.0", "41.2", "6.9", "40.9", "15.6"]
