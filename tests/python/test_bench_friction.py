"""Issue 30, item 11: what a newcomer met first. The `torch` extra and one way of
saying that PyTorch is missing (checked in an interpreter without site-packages,
where PyTorch really is absent); every suite's help in one form; `bench save
--device cpu` labels and figures; `bench dataloader`'s worker counts follow the
CPUs this process may use."""

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

import ferry
from ferry.bench import suites
from ferry.bench.dataloader import default_workers
from ferry.bench.suite import NEEDS, missing_module
from ferry.measure import usable_cpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = pathlib.Path(ferry.__file__).resolve().parents[1]


def test_the_torch_extra_is_what_the_message_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["torch"]
    # PyTorch's tested range, and numpy (the DataLoader's workers; PyTorch's wheel lacks it)
    assert len(extra) == 2 and re.fullmatch(r"torch>=2\.\d+,<2\.\d+", extra[0]) and extra[1] == "numpy", extra
    assert NEEDS["torch"] == "needs PyTorch: pip install 'ferry[torch]'"


WITHOUT_SITE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ferry.bench import dataloader, save, suite
out = {"missing": suite.missing_module("torch"), "missing_st": suite.missing_module("safetensors")}
out["dataloader"] = dataloader.SUITE.waived(dataloader.SUITE.parser().parse_args([]))
out["save"] = save.SUITE.waived(save.SUITE.parser().parse_args(["--device", "cpu"]))
try:
    import ferry.torch
    ferry.torch.load_safetensors("model.safetensors")
except ImportError as e:
    out["ferry.torch"] = str(e)
print(json.dumps(out))
"""


def test_every_suite_says_the_same_when_pytorch_is_missing(tmp_path):
    """An interpreter without site-packages (-S) has no PyTorch and no safetensors. Only
    ferry is put on its path (a link to the package: where ferry is installed, its
    parent folder is site-packages, which holds PyTorch too)."""
    (tmp_path / "ferry").symlink_to(PYTHON_DIR / "ferry", target_is_directory=True)
    r = subprocess.run([sys.executable, "-I", "-S", "-c", WITHOUT_SITE, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    torch_why = NEEDS["torch"]
    assert got["missing"] == torch_why and got["missing_st"] == NEEDS["safetensors"]
    for key in ("dataloader", "save"):  # the suites that ask for PyTorch before a GPU
        assert got[key] == torch_why, (key, got[key])
    assert got["ferry.torch"] == f"ferry.torch {torch_why}"


def test_no_suite_words_a_missing_pytorch_its_own_way():
    bench = pathlib.Path(ferry.__file__).parent / "bench"
    for path in sorted(bench.glob("*.py")):
        text = path.read_text()
        for pattern in (r'"needs PyTorch"', r"pip install torch\b", r"needs torch \("):
            assert not re.search(pattern, text), f"{path.name}: {pattern} (say suite.NEEDS['torch'])"


def test_a_package_that_is_there_but_fails_to_import_is_not_told_to_install():
    assert missing_module("json", "os") is None
    why = missing_module("ferry.no_such_module_here")
    assert why.startswith("needs ferry.no_such_module_here: pip install")


def test_every_suites_help_has_one_form():
    """`ferry bench KEY`: one line, then text as the terminal shows it (no RST ``)."""
    for key, suite in suites().items():
        text = suite.parser().description
        assert text.startswith(f"`ferry bench {key}`: "), (key, text[:80])
        assert "``" not in text, key
        first = text.split("\n\n")[0]
        assert first.rstrip().endswith("."), (key, first)


def test_dataloader_worker_counts_follow_the_cpus():
    assert default_workers(16) == "8,14" and default_workers(64) == "8,14"  # the H200 machine's figures
    assert default_workers(2) == "2" and default_workers(1) == "1" and default_workers(4) == "2,4"
    assert default_workers(9) == "7,8"
    from ferry.bench import dataloader

    counts = [int(n) for n in dataloader.SUITE.parser().parse_args([]).workers.split(",")]
    assert counts and max(counts) <= usable_cpus(), (counts, usable_cpus())


def test_bench_save_on_the_cpu_labels_rows_by_where_the_state_dict_is(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from ferry.bench import save as bench

    out = tmp_path / "save.json"
    rc = bench.main(["--device", "cpu", "--sets", "moe", "--scale", "0.1", "--repeats", "1", "--disk-bytes", "8M",
                     "--savers", "save_file,ferry save_safetensors", "--dir", str(tmp_path), "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "(GPU)" not in table and "(CPU)" not in table, table
    header = next(line for line in table.splitlines() if "saver" in line)
    assert "host MB" in header and "vs save_file" in header, header
    rows = [line.split() for line in table.splitlines() if line.startswith("moe")]
    assert rows and all(not re.search(r"\d[eE][-+]\d", " ".join(r)) for r in rows), table  # no 9.01e-05
    records = json.loads(out.read_text())["records"]
    assert {"save_file", "ferry save_safetensors"} <= {r["case"] for r in records}
    durable = [r for r in records if r["metric"] == "durable_time" and r["case"] == "ferry save_safetensors"]
    assert len(durable) == 1 and durable[0]["params"]["baseline_case"] == "save_file"
    assert [n for n in os.listdir(tmp_path) if n != "save.json"] == []
