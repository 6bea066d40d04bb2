"""scripts/soak is for the GPU machine (scripts/soak OUTDIR [SECONDS]); elsewhere it
says why it cannot run, exits 2 and writes that to OUTDIR/soak.json."""

import json
import pathlib
import subprocess
import sys

import pytest

import ferry

SOAK = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "soak"


def test_soak_without_a_gpu_fails_clearly(tmp_path):
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a GPU is present: the soak runs for real there (scripts/soak OUTDIR)")
    r = subprocess.run([sys.executable, str(SOAK), str(tmp_path), "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot run: no CUDA" in r.stderr, r.stderr
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["ran"] is False and "CUDA" in report["why"]


def test_soak_usage():
    r = subprocess.run([sys.executable, str(SOAK)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "OUTDIR" in r.stdout
