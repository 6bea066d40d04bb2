"""One CLI vocabulary (issue 43 item 3): every `ferry bench` suite takes --repeats N
and --json FILE ('-': stdout), a suite that picks a device takes --device, the
spellings of earlier releases still parse with a DeprecationWarning and a note on
stderr naming the new one, every option's help gives its default in one form,
`ferry doctor` takes --json [FILE] and has a description; `ferry.__all__` and
help(ferry) list the public classes and functions."""

from __future__ import annotations

import argparse
import json
import pydoc
import re
import subprocess
import sys
import warnings

import pytest

import ferry
from ferry import bench

SUITES = bench.suites()

# (suite, old spelling, its value, dest, the new spelling the note names, the parsed value)
OLD_FLAGS = [
    ("apiperf", "--reps", "7", "repeats", "--repeats", 7),
    ("blocks", "--iterations", "7", "repeats", "--repeats", 7),
    ("copy", "--iterations", "7", "repeats", "--repeats", 7),
    ("latency", "--iterations", "7", "repeats", "--repeats", 7),
    ("thp", "--iterations", "7", "repeats", "--repeats", 7),
    ("nixl", "--iters", "7", "repeats", "--repeats", 7),
    ("node", "--iters", "7", "repeats", "--repeats", 7),
    ("fork", "--repeat", "7", "repeats", "--repeats", 7),
    ("uvm", "--epochs", "7", "repeats", "--repeats", 7),
    ("offload", "--steps", "7", "repeats", "--repeats", 7),
    ("pool", "--iterations", "7", "recycle_repeats", "--recycle-repeats", 7),
    ("fork", "--loader-repeat", "7", "loader_repeats", "--loader-repeats", 7),
    ("fork", "--cpu", None, "device", "--device cpu", "cpu"),
    ("nixl", "--gpu", "1", "device", "--device", 1),
    ("nixl", "--peer-gpu", "1", "peer_device", "--peer-device", 1),
]


@pytest.mark.parametrize("key", sorted(SUITES))
def test_every_suite_takes_repeats_and_json(key, tmp_path):
    out = tmp_path / "records.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spellings warn about nothing
        args = SUITES[key].parser().parse_args(["--repeats", "3", "--json", str(out)])
        assert args.repeats == 3 and args.json == str(out)
        assert SUITES[key].parser().parse_args(["--json", "-"]).json == "-"


@pytest.mark.parametrize("key", sorted(SUITES))
def test_repeats_is_checked_on_any_machine(key, capsys):
    """By the parser, or by the suite's check_args before the waiver: exit status 2."""
    try:
        status = SUITES[key].main(["--repeats", "0"])
    except SystemExit as e:
        status = e.code
    assert status == 2 and "--repeats" in capsys.readouterr().err


@pytest.mark.parametrize("key, old, value, dest, new, parsed", OLD_FLAGS, ids=[f"{c[0]} {c[1]}" for c in OLD_FLAGS])
def test_old_spellings_still_parse_and_warn(key, old, value, dest, new, parsed, capsys):
    argv = [old] if value is None else [old, value]
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} is deprecated: use {new}")):
        args = SUITES[key].parser().parse_args(argv)
    assert getattr(args, dest) == parsed
    assert f"ferry bench {key}: {old} is deprecated: use {new}" in capsys.readouterr().err
    assert old not in SUITES[key].parser().format_help().split()  # --help shows the new spelling only


def test_a_suite_that_picks_cpu_or_cuda_says_device():
    for key in ("fork", "save"):
        action = next(a for a in SUITES[key].parser()._actions if "--device" in a.option_strings)
        assert set(action.choices) == {"cuda", "cpu"} and action.default == "cuda", key


def _expanded_help(parser: argparse.ArgumentParser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
            continue
        yield action, formatter._expand_help(action)


@pytest.mark.parametrize("key", sorted(SUITES))
def test_each_help_gives_its_default_in_one_form(key):
    """'(default: X)' (or '; default: X' inside a parenthesis) wherever an option has
    a default: never '(default X)', 'default 3' or '(default)'."""
    bad = []
    for action, text in _expanded_help(SUITES[key].parser()):
        if re.search(r"\bdefault [^:]|\(default\)|default=", text):
            bad.append(f"{action.option_strings}: {text}")
        elif action.default not in (None, False, [], "", argparse.SUPPRESS) and "default: " not in text:
            bad.append(f"{action.option_strings} has a default ({action.default!r}) its help does not give: {text}")
    assert not bad, "\n".join(bad)


def _ferry(*argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "ferry", *argv], capture_output=True, text=True, timeout=timeout)


def test_bench_json_dash_writes_the_document_to_stdout_and_the_tables_to_stderr():
    """sanity runs on any machine (each check passes or waives itself); latency waives
    itself without a GPU (or runs 2 requests a case): both land in one document on stdout."""
    r = _ferry("bench", "--json", "-", "sanity,latency", "--repeats", "2")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)  # stdout holds the JSON alone
    assert set(doc["suites"]) == {"sanity", "latency"}
    assert any(rec["suite"] == "sanity" and rec["metric"] == "state" for rec in doc["records"])
    assert "Total:" in r.stderr  # sanity's table went to stderr


def test_one_suite_with_json_dash(tmp_path):
    r = _ferry("bench", "sanity", "--repeats", "1", "--json", "-")
    doc = json.loads(r.stdout)
    assert list(doc["suites"]) == ["sanity"] and doc["records"], r.stderr[-2000:]


def test_the_old_flag_on_the_command_line_says_the_new_one():
    r = _ferry("bench", "sanity", "--help")
    assert r.returncode == 0 and "--repeats N" in r.stdout
    r = _ferry("bench", "latency", "--iterations", "2")  # waived without a GPU, or 2 requests a case
    assert "ferry bench latency: --iterations is deprecated: use --repeats" in r.stderr, r.stderr


# ---- ferry doctor ----------------------------------------------------------------------


def test_doctor_help_has_a_description():
    r = _ferry("doctor", "--help")
    assert r.returncode == 0
    description = r.stdout.split("\n\n")[1]
    assert "facts" in description and "findings" in description and "--quick" in description


def test_doctor_json_file_dash_and_alone(tmp_path):
    out = tmp_path / "doctor.json"
    r = _ferry("doctor", "--quick", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    written = json.loads(out.read_text())
    assert "host" in written and "facts_version" in written
    assert r.stdout.strip() and not r.stdout.lstrip().startswith("{")  # the text report on stdout, the JSON in the file
    assert f"JSON report written to {out}" in r.stderr
    for argv in (["--json", "-"], ["--json"]):  # `--json` alone is `--json -`, as before
        r = _ferry("doctor", "--quick", *argv)
        assert r.returncode == 0 and set(json.loads(r.stdout)) >= {"host"}, r.stderr[-2000:]
        assert "ferry doctor: [" not in r.stderr  # no progress with the JSON on stdout


def test_doctor_json_into_a_directory_is_refused_before_measuring(tmp_path):
    r = _ferry("doctor", "--quick", "--json", str(tmp_path))
    assert r.returncode == 2 and "cannot write the JSON report" in r.stderr
    assert "ferry doctor: [" not in r.stderr  # nothing was measured


# ---- help(ferry), ferry.__all__ ---------------------------------------------------------

PUBLIC = ["Pool", "PinnedPool", "Buffer", "copy", "copy_async", "copy_many", "copy_many_async", "Copy", "register",
          "Registration", "engine", "Channel", "Loader", "NodePool", "NodeBlock", "Handoff", "versions", "cuda_info",
          "FerryError", "InvalidArgumentError", "FerryTimeoutError", "InternalError"]


def test_all_lists_the_public_names_and_each_exists():
    assert set(PUBLIC) <= set(ferry.__all__)
    assert len(ferry.__all__) == len(set(ferry.__all__))
    for name in ferry.__all__:
        assert getattr(ferry, name) is not None, name
    assert ferry.Loader is __import__("ferry.load", fromlist=["Loader"]).Loader
    assert ferry.NodePool is __import__("ferry.node", fromlist=["NodePool"]).NodePool


def test_help_ferry_shows_the_classes_and_functions():
    text = pydoc.render_doc(ferry, renderer=pydoc.plaintext)
    for name in ("Pool", "PinnedPool", "Channel", "Loader", "NodePool", "Copy"):
        assert re.search(rf"\bclass {name}\b", text), name
    for name in ("copy", "copy_many", "register", "engine", "versions"):
        assert re.search(rf"^\s+{name}\(", text, re.M), name
