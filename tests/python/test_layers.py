"""The Python package's layers: every module imports in a fresh interpreter, the
import graph of python/ferry (every import statement, at the top of a module or
inside a function) has no cycle, and nothing imports the command line (ferry.cli)
but `python -m ferry`."""

import ast
import pathlib
import subprocess
import sys

import ferry

ROOT = pathlib.Path(ferry.__file__).resolve().parent  # the installed package, as the tests use it


def modules() -> dict[str, pathlib.Path]:
    """{"ferry.doctor.run": path} for every .py file of the package and its native module."""
    out = {"ferry._ferry": pathlib.Path(ferry._ferry.__file__)}  # imports nothing of ferry's
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("ferry", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The package's modules that `name` imports (a name imported from a package
    counts as the package, unless it is a module of its own)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # "ferry.doctor.report.x" -> its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) if path.suffix == ".py" else set() for name, path in known.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_correctly():
    edges = graph()
    assert "ferry.units" in edges["ferry.measure"]  # `from .units import ...` (ferry.rules is a package now)
    assert "ferry.doctor.steps" in edges["ferry.doctor.run"]
    assert "ferry.measure" in edges["ferry.bench.copy"]  # `from ..measure import ...`
    assert "ferry.cli" in edges["ferry.__main__"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle)


def test_nothing_imports_the_command_line():
    importers = sorted(name for name, targets in graph().items() if "ferry.cli" in targets)
    assert importers == ["ferry.__main__"]


def test_the_bottom_layers_import_nothing_above_them():
    edges = graph()
    assert edges["ferry.units"] <= {"ferry.errors"}
    assert edges["ferry.errors"] == set()
    assert edges["ferry.bounded_read"] == set()  # the one rule for reading a named file: below everything
    assert not {e for name, targets in edges.items() if name.startswith("ferry.facts")
                for e in targets if not e.startswith("ferry.facts") and e != "ferry.bounded_read"}


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(n for n in modules() if n != "ferry.__main__")  # __main__ runs the command
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
