"""Every error ferry raises is a ferry.errors class (issue 43 item 2).

The rule, for python/ferry (docs/errors.md says it to users):

- ferry raises a ferry.errors class, never a bare builtin: a bad argument (its
  type included) is InvalidArgumentError (a ValueError), as the C++ bindings
  answer a wrong type (their translator turns std::bad_cast into it); a system
  call's failure OSLayerError (an OSError with .errno); a bounded wait that ended
  a FerryTimeoutError subclass (a TimeoutError); a ferry bug InternalError; each
  class also derives from the builtin a user would catch.
- A bare ``raise RuntimeError/ValueError/TypeError/TimeoutError/OSError/
  Exception(...)`` is refused anywhere in python/ferry, except:
  * ALLOWED: the argument-checking helpers listed below, where Python's own
    contract asks for the builtin (a TypeError for an argument of the wrong type
    in an API whose users are suite authors, not ferry's users);
  * the ``ferry.facts`` package, which imports nothing of ferry's but
    bounded_read (test_layers: the doctor's facts are collected by code that
    stands alone): its text parsers raise ValueError/TypeError, and ferry's
    callers (ferry.rules, the doctor) turn those into InvalidArgumentError or a
    finding;
  * re-raising what was caught (``raise``, ``raise e``) and the internal signals
    of INTERNAL, each caught inside ferry.
- Every exception class defined in python/ferry outside errors.py is either a
  re-export of a ferry.errors class or an internal signal in INTERNAL.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import ferry
import ferry.errors as fe

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "ferry"
HERE = pathlib.Path(__file__).resolve().parent

BANNED = {"RuntimeError", "ValueError", "TypeError", "TimeoutError", "OSError", "IOError", "EnvironmentError",
          "Exception"}

# (file under python/ferry, function): why the builtin is right there.
ALLOWED = {
    ("bench/report.py", "write_json"): "TypeError: a suite author passed something that is not a list of "
                                       "records (bench/records.py), Python's contract for a wrong type",
}

# Exception classes outside errors.py that never leave ferry: (file, class): who catches it.
INTERNAL = {
    ("bounded_read.py", "Unreadable"): "its callers turn it into InvalidArgumentError or a finding",
    ("measure.py", "Skipped"): "the doctor records a skipped measurement with the reason",
    ("bench/suite.py", "Waived"): "Suite.main prints 'waived: why' and records it",
    ("bench/load_child.py", "Stop"): "the child's main sends it to the parent as its error line",
    ("bench/load_procs.py", "ChildFailed"): "the parent records it as that child's error (_all, _release)",
}

SKIPPED_PACKAGES = ("facts/",)


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(SKIPPED_PACKAGES):
            yield rel, ast.parse(path.read_text(), filename=str(path))


def _functions_by_line(tree) -> dict[int, str]:
    """line -> name of the innermost function holding it."""
    owner = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                if line not in owner or owner[line][0] < node.lineno:
                    owner[line] = (node.lineno, node.name)
    return {line: name for line, (_, name) in owner.items()}


def _raised_name(exc) -> str | None:
    target = exc.func if isinstance(exc, ast.Call) else exc
    return target.id if isinstance(target, ast.Name) else None


def test_no_bare_builtin_is_raised():
    found, used = [], set()
    for rel, tree in _sources():
        owners = _functions_by_line(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            name = _raised_name(node.exc)
            if name not in BANNED:
                continue
            if isinstance(node.exc, ast.Name):  # `raise e`: a caught exception, re-raised
                continue
            key = (rel, owners.get(node.lineno, "<module>"))
            if key in ALLOWED:
                used.add(key)
                continue
            found.append(f"{rel}:{node.lineno} in {key[1]}(): raise {name}(...)")
    assert not found, "bare builtins raised (use a ferry.errors class, see this file's docstring):\n" + \
        "\n".join(found)
    assert used == set(ALLOWED), f"ALLOWED entries that no longer raise: {set(ALLOWED) - used}"


def test_the_ast_walk_sees_a_bare_raise():
    """The walk above can fail: a bare raise in a snippet is found, a ferry class is not."""
    tree = ast.parse("def f():\n    raise RuntimeError('x')\n\ndef g():\n    raise fe.CudaError('y')\n")
    names = [_raised_name(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    assert sorted(n for n in names if n) == ["RuntimeError"]


def test_every_exception_class_lives_in_ferry_errors():
    defined = set()
    for rel, tree in _sources():
        if rel == "errors.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Timeout")) for b in bases):
                    defined.add((rel, node.name))
    assert defined == set(INTERNAL), (f"exception classes outside ferry.errors: {sorted(defined - set(INTERNAL))}; "
                                      f"INTERNAL entries gone: {sorted(set(INTERNAL) - defined)}")


# ---- the classes ---------------------------------------------------------------------


def _classes():
    return {n: c for n, c in vars(fe).items() if isinstance(c, type) and issubclass(c, BaseException)}


def test_every_class_is_a_ferry_error_and_listed():
    classes = _classes()
    assert all(issubclass(c, fe.FerryError) for c in classes.values())
    assert set(fe.__all__) == set(classes), set(fe.__all__) ^ set(classes)
    for name in fe.__all__:  # and ferry names each one
        assert getattr(ferry, name) is classes[name], name


def test_every_timeout_is_under_one_base_that_is_pythons_timeout():
    assert issubclass(fe.FerryTimeoutError, TimeoutError) and issubclass(fe.FerryTimeoutError, fe.FerryError)
    timeouts = {n for n, c in _classes().items() if issubclass(c, TimeoutError)}
    assert timeouts == {"FerryTimeoutError", "HandoffTimeoutError", "NodeLoadTimeoutError", "NodeLoadTimeout",
                        "NixlTimeoutError", "DataLoaderTimeoutError"}
    assert all(issubclass(getattr(fe, n), fe.FerryTimeoutError) for n in timeouts)
    assert issubclass(fe.HandoffTimeoutError, fe.HandoffError)
    assert issubclass(fe.NixlTimeoutError, fe.NixlError)


def test_old_names_are_the_same_classes():
    from ferry import nixl, node
    from ferry.torch import AllocatorTooLateError, node_load

    assert node_load.NodeLoadTimeout is fe.NodeLoadTimeoutError is fe.NodeLoadTimeout
    assert nixl.NixlTimeoutError is fe.NixlTimeoutError and nixl.NixlError is fe.NixlError
    assert nixl.NixlUnavailableError is fe.NixlUnavailableError
    assert node.HandoffTimeoutError is fe.HandoffTimeoutError and AllocatorTooLateError is fe.AllocatorTooLateError


def test_dataloader_errors_stay_runtime_errors():
    assert issubclass(fe.DataLoaderError, RuntimeError) and issubclass(fe.InternalError, RuntimeError)


def _status_enum() -> list[str]:
    header = (ROOT / "include" / "ferry" / "ferry.h").read_text()
    body = re.search(r"typedef enum\s*\w*\s*\{(.*?)\}\s*ferry_status_t;", header, re.S)
    assert body, "ferry_status_t not found in include/ferry/ferry.h"
    return re.findall(r"\b(FERRY_ERROR_\w+)\s*=", body.group(1))


def test_every_c_status_has_its_class_in_the_translator():
    statuses = _status_enum()
    assert "FERRY_ERROR_INTERNAL" in statuses and len(statuses) >= 7
    source = (ROOT / "src" / "python" / "error_bindings.cpp").read_text()
    mapped = dict(re.findall(r'case (FERRY_ERROR_\w+): return "(\w+)";', source))
    missing = [s for s in statuses if s not in mapped]
    assert not missing, f"statuses without a class in src/python/error_bindings.cpp's error_class(): {missing}"
    for status, cls in mapped.items():
        assert isinstance(getattr(fe, cls, None), type), f"{status} -> {cls}, not in ferry.errors"
    assert mapped["FERRY_ERROR_INTERNAL"] == "InternalError"


# ---- raised for real -----------------------------------------------------------------


def test_a_bad_argument_from_the_bindings_is_invalid_argument_and_a_value_error():
    with pytest.raises(fe.InvalidArgumentError) as e:
        ferry.Pool(chunk_bytes="big")
    assert isinstance(e.value, ValueError)


def test_a_bench_argument_converter_raises_invalid_argument(capsys):
    import argparse

    from ferry.bench.suite import int_at_least

    with pytest.raises(fe.InvalidArgumentError, match="expected an integer >= 3"):
        int_at_least(3).__closure__[0].cell_contents("2")  # the converter itself
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int_at_least(3))
    with pytest.raises(SystemExit):  # argparse's usage error, from InvalidArgumentError
        p.parse_args(["--n", "2"])
    assert "expected an integer >= 3" in capsys.readouterr().err


def test_the_doctors_measurement_error_is_a_ferry_error():
    from ferry import measure

    with pytest.raises(fe.MeasurementError, match="no usable timing"):
        measure._usable_gbps(1 << 20, [0, 0, 0])
    with pytest.raises(fe.InvalidArgumentError, match="backing 'teleport'"):
        measure.HostBuffer(4096, "teleport")


def test_a_killed_dataloader_worker_is_a_dataloader_error_and_a_runtime_error():
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import ferry.errors, ferry.torch as ft, dataloader_cases as cases
        try:
            for b in ft.DataLoader(cases.KillsItsWorker(40, victim=13), batch_size=2, num_workers=2):
                pass
        except RuntimeError as e:
            print("ERROR", type(e).__name__, isinstance(e, ferry.errors.DataLoaderError), e)
        else:
            print("NO ERROR")
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=HERE)
    assert r.stdout.startswith("ERROR DataLoaderError True ferry DataLoader:"), r.stdout + r.stderr[-2000:]


def test_a_dataloader_timeout_is_a_timeout_error_and_a_runtime_error():
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import time, torch, ferry.errors as fe, ferry.torch as ft

        class Slow(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                time.sleep(30)
                return torch.zeros(2)

        try:
            next(iter(ft.DataLoader(Slow(), batch_size=1, num_workers=1, timeout=1)))
        except TimeoutError as e:
            print("TIMEOUT", type(e).__name__, isinstance(e, RuntimeError), isinstance(e, fe.FerryTimeoutError))
        else:
            print("NO ERROR")
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=HERE)
    assert r.stdout.startswith("TIMEOUT DataLoaderTimeoutError True True"), r.stdout + r.stderr[-2000:]
