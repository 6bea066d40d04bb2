"""`ferry bench uvm` without a GPU: node counts, the plan that skips what does
not fit, ratios beside the study's figures, the table (no project targets), the worker's
RESULT line, the waiver; and (with PyTorch) the GCN itself on the CPU, whose
sparse propagation must match a dense reference and whose loss must fall."""

import json

import pytest

import ferry
from ferry import measure
from ferry.bench import suites, uvm
from ferry.errors import InvalidArgumentError


def test_registered():
    assert suites()["uvm"] is uvm.SUITE and uvm.SUITE.key == "uvm"


def test_parse_nodes():
    assert uvm.parse_nodes("1M, 3M,500K,2000,1.5M") == [1_000_000, 3_000_000, 500_000, 2000, 1_500_000]
    with pytest.raises(InvalidArgumentError, match="'lots'"):
        uvm.parse_nodes("lots")
    with pytest.raises(InvalidArgumentError, match="at least 100"):
        uvm.parse_nodes("5")
    with pytest.raises(InvalidArgumentError):
        uvm.parse_nodes(" , ")


def test_plan_skips_what_does_not_fit_and_keeps_the_order():
    configs = list(uvm.CONFIGS)
    runs, skipped = uvm.plan([1_000_000, 15_000_000], configs, free_bytes=80 * 10**9)
    assert runs == [(1_000_000, c) for c in configs]
    assert skipped[0]["nodes"] == 15_000_000 and "80 GB free" in skipped[0]["why"]
    runs, skipped = uvm.plan([1_000_000, 15_000_000], configs, free_bytes=140 * 10**9)
    assert len(runs) == 2 * len(configs) and not skipped
    assert uvm.estimate_bytes(5_000_000) > 23 * 10**9  # at least the study's estimate


def test_ratios_and_the_study_beside_them():
    rows = [{"nodes": 5_000_000, "config": "pytorch", "epoch_s_median": 1.0, "peak_bytes": 20 * 10**9},
            {"nodes": 5_000_000, "config": "managed_pool+prefetch", "epoch_s_median": 1.2},
            {"nodes": 5_000_000, "config": "device", "epoch_s_median": 1.6},
            {"nodes": 5_000_000, "config": "managed", "error": "timed out after 1800 s"},
            {"nodes": 1_000_000, "config": "device", "epoch_s_median": 0.3}]
    uvm.add_ratios(rows)
    assert rows[1]["ratio_to_pytorch"] == pytest.approx(1.2)
    assert rows[2]["study_s"] == 1.89 and rows[2]["study_ratio"] == pytest.approx(1.89 / 1.14)
    assert rows[3]["ratio_to_pytorch"] is None and rows[3]["study_s"] == 34.2
    assert rows[4]["ratio_to_pytorch"] is None and rows[4]["study_s"] is None  # no baseline at 1M
    assert rows[0]["study_memory_gb"] == 23
    text = uvm.render(rows, 3, 1)
    assert "managed_pool+prefetch" in text and "1.20x" in text and "1.66x" in text and "timed out" in text
    assert "1.60x" in text and "target" not in text.lower()


def test_worker_result_line():
    out = "noise\nRESULT " + json.dumps({"epoch_s_median": 1.5}) + "\n"
    assert uvm.parse_result(out) == {"epoch_s_median": 1.5}
    assert uvm.parse_result("Traceback ...") is None


def test_unknown_configuration_is_refused():
    with pytest.raises(InvalidArgumentError, match="unknown configuration 'fast'"):
        uvm.main(["--configs", "pytorch,fast"])


def test_without_a_device_the_suite_is_waived(capsys):
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    assert uvm.main(["--nodes", "1M"]) == 0
    assert "waived" in capsys.readouterr().out


def test_gcn_on_the_cpu_propagates_correctly_and_learns():
    torch = pytest.importorskip("torch")
    n = 3000
    blocks, blocks_t = uvm.build_graph(torch, n, "cpu", seed=3, chunk_rows=700)
    assert len(blocks) == 5 and blocks[-1][1] == n
    dense = torch.cat([b[2].to_dense() for b in blocks], 0)
    dense_t = torch.cat([b[2].to_dense() for b in blocks_t], 0)
    assert torch.allclose(dense.t(), dense_t)
    assert (dense.diagonal() > 0).all()  # self loops
    x = torch.randn(n, 8)
    assert torch.allclose(uvm.spmm(torch, blocks, x), dense @ x, atol=1e-5)
    # gradients through the custom propagation match the dense ones
    prop = uvm.make_propagate(torch)
    xa = x.clone().requires_grad_()
    prop.apply(xa, blocks, blocks_t).square().sum().backward()
    xb = x.clone().requires_grad_()
    (dense @ xb).square().sum().backward()
    assert torch.allclose(xa.grad, xb.grad, atol=1e-4)
    r = uvm.train(torch, n, "cpu", epochs=3, warmup=1, chunk_rows=1000)
    assert len(r["epoch_s"]) == 3 and r["loss"] > 0


def test_the_parent_runs_each_configuration_in_its_own_child(monkeypatch, tmp_path, capsys):
    # The parent's loop with stand-in children: probe, skip, progress, table, JSON.
    calls = []

    def child(args, timeout):
        calls.append(args)
        if args == ["--probe"]:
            return {"free": 100 * 10**9, "total": 141 * 10**9, "name": "H200", "torch": "2.11",
                    "torch_geometric": False}, ""
        config, nodes = args[args.index("--worker") + 1], int(args[args.index("--nodes") + 1])
        if config == "managed":
            return None, "timed out after 5 s"
        t = {"pytorch": 1.0, "device": 1.4, "managed+prefetch": 5.0, "managed_pool+prefetch": 1.1}[config]
        return {"config": config, "nodes": nodes, "epoch_s_median": t * nodes / 5e6, "epoch_s": [t],
                "peak_bytes": nodes * 4000}, ""

    monkeypatch.setattr(measure, "gpu_absent_reason", lambda info: None)
    monkeypatch.setattr(uvm, "_have_torch", lambda: True)
    monkeypatch.setattr(uvm, "_run_child", child)
    out = tmp_path / "uvm.json"
    assert uvm.main(["--nodes", "5M,15M", "--repeats", "2", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "15M nodes: skipped" in captured.out  # 15M needs more than 90% of 100 GB
    assert "1.10x" in captured.out  # the ratio to PyTorch stays; no project target is printed
    assert "target" not in captured.out.lower() and "met)" not in captured.out
    assert "timed out" in captured.out
    assert "[bench] uvm: 5M nodes, device (2/5) ..." in captured.err
    assert len(calls) == 1 + 5 and all("--repeats" in c for c in calls[1:])
    data = json.loads(out.read_text())
    assert set(data["suites"]) == {"uvm"} and all(r["suite"] == "uvm" for r in data["records"])
    runs = [r for r in data["records"] if r["params"].get("nodes") == 5_000_000 and "setup" not in r["params"]]
    assert {r["case"] for r in runs if r["metric"] in ("epoch_time", "error")} == {
        "pytorch", "device", "managed", "managed+prefetch", "managed_pool+prefetch"}
    pool = next(r for r in runs if r["case"] == "managed_pool+prefetch" and r["metric"] == "epoch_time")
    assert pool["ratio"] == pytest.approx(1.1) and pool["params"]["baseline_case"] == "pytorch"
    assert next(r for r in runs if r["case"] == "managed")["value"] == "timed out after 5 s"
    skipped = [r for r in data["records"] if r["metric"] == "state"]
    assert [(r["params"]["nodes"], r["value"]) for r in skipped] == [(15_000_000, "Skipped")]
