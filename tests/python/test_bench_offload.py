"""`ferry bench offload` without a GPU: its waiver on this machine (every missing
piece named, with how to get it), its argument checks (refused before anything
runs), the link floor and the activation share as arithmetic, the targets' verdicts,
the records and tables it would make from a run's figures, and the two readings it
takes of the process (VmRSS, a real pool's stats)."""

import importlib.util
import mmap
import json
import random

import pytest

import ferry
from ferry import cli
from ferry.bench import offload, suites
from ferry.bench.records import is_record
from ferry.errors import InvalidArgumentError
from ferry.measure import gpu_absent_reason

GB = 10 ** 9
MiB = 1 << 20


def _runnable_here() -> bool:
    return (gpu_absent_reason(ferry.cuda_info()) is None and importlib.util.find_spec("torch") is not None
            and importlib.util.find_spec("transformers") is not None)


def test_is_registered():
    assert suites()["offload"] is offload.SUITE


def test_waived_here_names_each_missing_piece(tmp_path, capsys):
    if _runnable_here():
        pytest.skip("this machine has a GPU, torch and transformers: the suite runs rather than waives")
    out = tmp_path / "o.json"
    assert offload.main(["--repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ferry bench offload: waived: "), printed
    gpu = gpu_absent_reason(ferry.cuda_info())
    if gpu is not None:
        assert f"needs a CUDA device: {gpu}" in printed
    if importlib.util.find_spec("torch") is None:
        assert "pip install 'ferry[torch]'" in printed
    if importlib.util.find_spec("transformers") is None:
        assert "needs transformers: pip install transformers" in printed
    doc = json.loads(out.read_text())
    assert doc["suites"]["offload"]["waived"] == printed.strip().split("waived: ", 1)[1]
    assert doc["records"] == []


@pytest.mark.parametrize("argv, named", [
    (["--cases", "none,ferry,bogus"], "'none,ferry,bogus'"),
    (["--cases", ","], "','"),
    (["--cases", "ferry overhead"], "'ferry overhead'"),
    (["--repeats", "0"], "'0'"),
    (["--warmup", "1"], "'1'"),  # ferry-overhead's calibration step needs one more
    (["--hidden", "2k"], "'2k'"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, capsys, argv, named):
    out = tmp_path / "o.json"
    with pytest.raises(SystemExit) as e:
        offload.main(argv + ["--json", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert named in err.err and "ferry bench offload: error: argument" in err.err
    if argv[0] == "--cases":
        assert ("none, save_on_cpu, torchtune, ferry, ferry-overhead-0.03, ferry-overhead-0.1, ferry-overhead-0.25"
                in err.err)
    assert err.out == "" and not out.exists()  # not even the waiver ran


def test_a_head_size_a_llama_cannot_take_is_refused_on_any_machine(capsys):
    for hidden, heads in ((2048, 3), (2050, 2050), (1000, 8)):  # 682.67, 1 (odd), 125 (odd)
        with pytest.raises(InvalidArgumentError) as e:
            offload.main(["--hidden", str(hidden), "--heads", str(heads)])
        assert f"--hidden {hidden} / --heads {heads}" in str(e.value)
    assert capsys.readouterr().out == ""
    assert cli.main(["bench", "offload", "--heads", "3"]) == 2
    assert "ferry: error: --hidden 2048 / --heads 3" in capsys.readouterr().err


def test_link_floor_takes_the_longer_of_compute_and_copies_per_pass():
    # compute-bound both ways: the copies hide
    assert offload.link_floor(0.05, 0.1, 0.01, 1 * GB, 50 * GB, 50 * GB) == pytest.approx(0.16)
    # link-bound both ways: 10 GB at 40 and 50 GB/s
    assert offload.link_floor(0.05, 0.1, 0.01, 10 * GB, 40 * GB, 50 * GB) == pytest.approx(0.25 + 0.2 + 0.01)
    # forward link-bound, backward compute-bound
    assert offload.link_floor(0.02, 0.3, 0.004, 3 * GB, 25 * GB, 55 * GB) == pytest.approx(0.12 + 0.3 + 0.004)
    # nothing offloaded: the step's own compute
    assert offload.link_floor(0.051, 0.099, 0.013, 0, 50 * GB, 50 * GB) == pytest.approx(0.163)
    rng = random.Random(31)
    for _ in range(200):
        f, b, o = rng.uniform(0.01, 1), rng.uniform(0.01, 2), rng.uniform(0, 0.1)
        n, d2h, h2d = rng.randrange(1, 50 * GB), rng.uniform(5, 60) * GB, rng.uniform(5, 60) * GB
        floor = offload.link_floor(f, b, o, n, d2h, h2d)
        assert floor >= f + b + o and floor >= n / d2h + n / h2d + o
        assert floor == pytest.approx(max(f, n / d2h) + max(b, n / h2d) + o)


def test_activation_freed_is_the_share_of_the_peak_over_the_model():
    # the figures: 20.07 GB without offload, 7.54 GB with save_on_cpu; a 1.5 GB model
    assert offload.activation_freed(20_070_000_000, 7_540_000_000, 1_500_000_000) == pytest.approx(12.53 / 18.57)
    assert offload.activation_freed(10 * GB, 10 * GB, 2 * GB) == 0
    assert offload.activation_freed(10 * GB, 11 * GB, 2 * GB) == pytest.approx(-1 / 8)  # a case that used more
    assert offload.activation_freed(2 * GB, 1 * GB, 2 * GB) is None  # no activation memory to free


def _case(step, peak, fwd=0.05, bwd=0.1, opt=0.01, offloaded=None, rss=4 * GB, rss_growth=3 * MiB, pinned=0,
          reserved=None):
    r = {"step_s": step, "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt, "peak_bytes": peak,
         "peak_reserved": peak + 300 * MiB if reserved is None else reserved, "rss_before": rss, "rss_growth": rss_growth, "loss": 10.4,
         "steps_s": [step] * 3}
    if offloaded is not None:
        r.update(offloaded_bytes=offloaded, pinned_in_use=pinned, pinned_reserved=offloaded + 7 * MiB,
                 pinned_growth=0)
    return r


MODEL = 3_000_000_003
D2H = 50 * GB


def _run_figures(ferry_step=0.185, soc_step=0.98, ferry_peak=7_700_000_000, over_step=0.16, over_peak=14 * GB,
                 over_rss_growth=3 * MiB, pinned=0, ferry_reserved=None, over_reserved=None):
    return {"none": _case(0.151, 20_070_000_000, fwd=0.047, bwd=0.095, opt=0.009),
            "save_on_cpu": _case(soc_step, 7_540_000_000),
            "ferry": _case(ferry_step, ferry_peak, offloaded=9_876_543_210, reserved=ferry_reserved),
            "ferry-overhead-0.1": _case(over_step, over_peak, offloaded=2_345_678_901, rss_growth=over_rss_growth,
                                        pinned=pinned, reserved=over_reserved),
            "ferry-overhead-0.25": _case(0.2, 12 * GB, offloaded=4 * GB)}


def test_the_bound_is_forward_and_the_overhead_at_the_link_rate():
    none = _case(0.151, 20_070_000_000, fwd=0.047)
    # (0.047 + 0.1 x 0.151) s x 50 GB/s = 3.105 GB of 17.07 GB of activations
    assert offload.bound_share(none, 0.1, D2H, MODEL) == pytest.approx(3.105 / (20.07 - 3.000000003))
    assert offload.bound_share(none, 0.0, 2 * D2H, MODEL) == pytest.approx(4.7 / (20.07 - 3.000000003))
    assert offload.bound_share(none, 10.0, D2H, MODEL) == 1.0  # no more than all of them
    assert offload.bound_share(none, 0.1, D2H, 21 * GB) is None
    assert [offload.overhead_of(c) for c in offload.CASES] == [None, None, None, None, 0.03, 0.1, 0.25]


def test_targets_say_met_or_not_for_each_goal():
    floor = 0.18
    got = {what: ok for what, _, _, ok in offload.targets(_run_figures(), floor, MODEL, D2H)}
    assert got == {"ferry: step over the link floor": True,  # 0.185 / 0.18 = 1.03
                   "ferry: faster than save_on_cpu": True,  # 5.3x
                   "ferry: peak over save_on_cpu's": True,  # +2.1%
                   "ferry: reserved peak over save_on_cpu's": True,  # +2.0%
                   "ferry-overhead-0.1: step over none": True,  # 1.06x
                   "ferry-overhead-0.1: freed over its bound": True,  # 35.6% of 18.2%
                   "ferry-overhead-0.1: reserved peak over none's": True,  # 14.3 of 20.4 GB
                   "ferry-overhead-0.25: freed over its bound": True,
                   "ferry-overhead-0.25: reserved peak over none's": True,
                   "ferry: host RSS growth over the timed steps": True,
                   "ferry-overhead-0.1: host RSS growth over the timed steps": True,
                   "ferry-overhead-0.25: host RSS growth over the timed steps": True,
                   "ferry: pinned in use between steps": True,
                   "ferry-overhead-0.1: pinned in use between steps": True,
                   "ferry-overhead-0.25: pinned in use between steps": True}
    bad = _run_figures(ferry_step=0.21, soc_step=0.35, ferry_peak=7_960_000_000, over_step=0.167,
                       over_peak=18_500_000_000, over_rss_growth=41 * MiB, pinned=200 * MiB,
                       ferry_reserved=25_800_000_000, over_reserved=20_400_000_000)
    got = {what: ok for what, _, _, ok in offload.targets(bad, floor, MODEL, D2H)}
    assert got == {"ferry: step over the link floor": False,  # 1.167x
                   "ferry: faster than save_on_cpu": False,  # 1.67x
                   "ferry: peak over save_on_cpu's": False,  # +5.6%
                   "ferry: reserved peak over save_on_cpu's": False,  # 25.8 GB against 7.85 (the H100's kind)
                   "ferry-overhead-0.1: step over none": False,  # 1.106x
                   "ferry-overhead-0.1: freed over its bound": False,  # 9.2% of 18.2%: 50%
                   "ferry-overhead-0.1: reserved peak over none's": False,  # 20.40 GB against 20.38
                   "ferry-overhead-0.25: freed over its bound": True,
                   "ferry-overhead-0.25: reserved peak over none's": True,
                   "ferry: host RSS growth over the timed steps": True,
                   "ferry-overhead-0.1: host RSS growth over the timed steps": False,  # 1.03%
                   "ferry-overhead-0.25: host RSS growth over the timed steps": True,
                   "ferry: pinned in use between steps": True,
                   "ferry-overhead-0.1: pinned in use between steps": False,  # 210 MB of 2.35 GB: 8.9%
                   "ferry-overhead-0.25: pinned in use between steps": True}
    only = {c: r for c, r in _run_figures().items() if c in ("none", "ferry-overhead-0.1")}
    assert [t[0] for t in offload.targets(only, None, MODEL, D2H)] == [
        "ferry-overhead-0.1: step over none", "ferry-overhead-0.1: freed over its bound",
        "ferry-overhead-0.1: reserved peak over none's", "ferry-overhead-0.1: host RSS growth over the timed steps", "ferry-overhead-0.1: pinned in use between steps"]


def test_records_and_tables_from_a_runs_figures(capsys):
    res = _run_figures()
    n = res["none"]
    d2h, h2d = 53.1 * GB, 54.7 * GB
    floor = offload.link_floor(n["forward_s"], n["backward_s"], n["optimizer_s"], res["ferry"]["offloaded_bytes"],
                               d2h, h2d)
    params = {"hidden": 2048, "layers": 12, "batch": 8, "seq": 2048, "model_bytes": MODEL}
    items = offload._records("offload", params, res, floor, d2h, h2d, MODEL).items
    assert items and all(is_record(r) and r["suite"] == "offload" for r in items)
    keys = [(r["case"], r["metric"], json.dumps(r["params"], sort_keys=True)) for r in items]
    assert len(keys) == len(set(keys))  # one record per figure

    def one(case, metric):
        hits = [r for r in items if r["case"] == case and r["metric"] == metric]
        assert len(hits) == 1, (case, metric, hits)
        return hits[0]

    step = one("ferry", "step_time")
    assert step["value"] == 0.185 and step["baseline"] == 0.151 and step["params"]["baseline_case"] == "none"
    assert one("none", "step_time")["baseline"] is None
    vs = one("ferry", "step_time_vs_save_on_cpu")
    assert vs["ratio"] == pytest.approx(0.185 / 0.98) and vs["params"]["baseline_case"] == "save_on_cpu"
    assert one(offload.FLOOR, "step_time")["value"] == pytest.approx(floor)
    assert one("save_on_cpu", "step_time_vs_floor")["ratio"] == pytest.approx(0.98 / floor)
    freed = one("ferry-overhead-0.1", "activation_memory_freed")
    assert freed["value"] == pytest.approx((20_070_000_000 - 14 * GB) / (20_070_000_000 - MODEL))
    assert one("ferry", "offloaded_per_step")["value"] == 9_876_543_210
    rates = {r["params"]["direction"]: r["value"] for r in items if r["metric"] == "bandwidth"}
    assert rates == {"d2h": pytest.approx(53.1), "h2d": pytest.approx(54.7)}
    assert not [r for r in items if r["case"] in ("none", "save_on_cpu") and r["metric"] == "offloaded_per_step"]
    bound = one("ferry-overhead-0.1", "activation_memory_bound")
    assert bound["value"] == pytest.approx(offload.bound_share(n, 0.1, d2h, MODEL))
    assert bound["params"]["max_overhead"] == 0.1 and bound["params"]["forward_s"] == n["forward_s"]
    assert one("ferry", "peak_gpu_reserved")["value"] == res["ferry"]["peak_reserved"]

    offload._print(res, floor, d2h, h2d, MODEL)
    printed = capsys.readouterr().out
    for header in ("step s", "peak GB", "peak rsv GB", "offl. GB", "RSS +MB", "freed", "bound", "of bound",
                   "issues 31 and 42's targets"):
        assert header in printed
    assert "bound of a budgeted case F: (fwd 0.047 s + F x step 0.151 s) x d2h 53.1 GB/s" in printed
    assert f"link floor: {floor:.3f} s" in printed and "NO" not in printed


def test_rss_and_pool_readings_follow_real_memory():
    before = offload.rss_bytes()
    n = 96 * MiB + 12345
    block = mmap.mmap(-1, n)  # fresh pages (a bytearray may reuse freed, resident heap: 0 growth on the H200)
    for i in range(0, n, 4096):  # touch every page
        block[i] = 1
    grown = offload.rss_bytes() - before
    assert n * 0.9 <= grown <= n * 1.5, grown
    pool = ferry.Pool()
    assert offload.pool_bytes(pool.stats(), "in_use") == 0
    buf = pool.alloc(3 * MiB + 12345)
    in_use, reserved = offload.pool_bytes(pool.stats(), "in_use"), offload.pool_bytes(pool.stats(), "reserved")
    assert 3 * MiB + 12345 <= in_use <= 3 * MiB + 12345 + 64 * 1024 and reserved >= in_use
    buf.release()
    assert offload.pool_bytes(pool.stats(), "in_use") == 0
    block.close()
