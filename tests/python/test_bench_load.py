"""`ferry bench load`'s pieces that need no GPU: the presets' checkpoints
(written, then read back by safetensors bit for bit, mixed dtypes and
shards), peers that are not installed, and the records the run writes."""

from __future__ import annotations

import argparse
import json
import os

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

from ferry.bench import load as bl  # noqa: E402


def args_for(preset: str, **over) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bl.SUITE.add_arguments(p)
    a = p.parse_args(["--preset", preset] + [f"--{k}={v}" for k, v in over.items()])
    bl.apply_preset(a)
    return a


def test_moe_preset_is_many_small_mixed_tensors_in_shards():
    a = args_for("moe")
    t = bl.checkpoint_tensors(a)
    assert a.shards == 8 and len(t) == 2388
    assert {d for _, _, d in t} == {"bf16", "f32"}
    sizes = [bl._ST_DTYPES[d][2] * torch.Size(s).numel() for _, s, d in t]
    assert sum(sizes) == 5_240_979_456
    assert max(sizes) == 8 << 20 and sorted(sizes)[len(sizes) // 2] == 2 << 20  # most are 2 MiB experts
    assert len({n for n, _, _ in t}) == len(t)
    dense = bl.checkpoint_tensors(args_for("dense"))
    assert len(dense) == 108 and {d for _, _, d in dense} == {"bf16"}


def test_a_small_moe_checkpoint_reads_back_bit_for_bit(tmp_path):
    a = args_for("moe", layers=2, hidden=24, intermediate=10, experts=3, shards=3)
    tensors = bl.checkpoint_tensors(a)
    paths = bl.write_checkpoint(str(tmp_path), tensors, a.shards, seed=7)
    assert len(paths) == 3
    got = {}
    for p in paths:
        got.update(st_torch.load_file(p))
    assert list(sorted(got)) == sorted(n for n, _, _ in tensors)
    for name, shape, dtype in tensors:
        assert tuple(got[name].shape) == shape
        assert got[name].dtype == getattr(torch, bl._ST_DTYPES[dtype][1])
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        assert name in st_torch.load_file(os.path.join(tmp_path, shard))
    # the same seed writes the same bytes
    again = tmp_path / "again"
    again.mkdir()
    bl.write_checkpoint(str(again), tensors, a.shards, seed=7)
    for p in paths:
        assert (again / os.path.basename(p)).read_bytes() == open(p, "rb").read()


def test_bad_sizes_are_refused(capsys):
    """argparse refuses them, quoting the value, before any waiver or work."""
    with pytest.raises(SystemExit) as e:
        args_for("moe", experts=-1)
    assert e.value.code == 2 and "--experts: '-1'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        args_for("dense", shards=0)
    assert e.value.code == 2 and "--shards: '0'" in capsys.readouterr().err


def test_a_missing_peer_is_not_installed_and_never_raises():
    assert bl._why_not("ferry_no_such_module_xyz").startswith("not installed")
    assert bl._why_not("json") is None
    a = args_for("dense")
    labels = [m[0] for m in bl.methods(a, torch)]
    for want in ("runai-model-streamer", "tensorizer (num_readers 16)", "InstantTensor MMAP", "fastsafetensors (nogds)"):
        assert want in labels


def test_records_have_one_shape_and_ferry_carries_its_baselines():
    from test_bench_records import check_records, find

    cp = {"preset": "moe", "files": 8, "bytes": 10, "tensors": 3, "layers": 1, "hidden": 2, "intermediate": 1,
          "experts": 1, "dtype": "bf16", "dtypes": ["bf16", "f32"]}
    results = {"checkpoint": cp,
               "warm": {"ferry": {"gb_per_s": 48.0, "host_added_bytes": 2 << 20, "verified": True,
                                  "loader": {"outside_s": 0.004}},
                        "InstantTensor MMAP": {"gb_per_s": 32.0, "host_added_bytes": 0, "verified": True},
                        "tensorizer (num_readers 16)": {"gb_per_s": 40.0, "host_added_bytes": 0, "verified": True}},
               "cold": {bl.SEQUENTIAL_READ: {"gb_per_s": 1.5},
                        "parallel O_DIRECT read (16 threads)": {"gb_per_s": 3.0},
                        "ferry": {"gb_per_s": 1.4, "host_added_bytes": 0, "verified": True}},
               "transformers": {"from_pretrained_s": 0.6, "from_config_s": 0.1, "load_safetensors_s": 0.2,
                                "verified": True, "bytes": 1, "files": 1}}
    recs = bl.records(results)
    check_records(recs, "load")
    w = find(recs, "ferry", cache="warm")
    assert w["baseline"] == 40.0 and w["ratio"] == pytest.approx(1.2)
    assert w["params"]["baseline_case"] == "tensorizer (num_readers 16)" and w["params"]["preset"] == "moe"
    assert find(recs, "InstantTensor MMAP", cache="warm")["baseline"] is None
    c = find(recs, "ferry", cache="cold")
    assert c["baseline"] == 1.5 and c["ratio"] == pytest.approx(1.4 / 1.5)
    assert find(recs, "ferry", "time_outside_loader", cache="warm")["value"] == pytest.approx(4.0)
    assert find(recs, "ferry", "host_memory_added", cache="warm")["value"] == pytest.approx(2.0)
    tr = find(recs, "from_config + load_safetensors", "time")
    assert tr["value"] == pytest.approx(0.3) and tr["baseline"] == 0.6


def test_bench_load_writes_its_records_under_its_key():
    import inspect

    assert "write_json(args.json, self.key, rec" in inspect.getsource(bl)
