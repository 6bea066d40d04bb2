"""The Python package's layers: every module imports in a fresh interpreter, the
import graph of python/ferry (every import statement, at the top of a module or
inside a function) has no cycle, and nothing imports the command line (ferry.cli)
but `python -m ferry`."""

import ast
import pathlib
import re
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
    # the one rule for reading a named file: below everything but the native OS layer that reads it
    assert edges["ferry.bounded_read"] <= {"ferry._ferry"}
    # facts: itself, the file rule, and the native module for the library's cpulist/THP parsers
    # (src/os/sysfs.h through sysfs_bindings.cpp: one grammar, issue 43)
    assert not {e for name, targets in edges.items() if name.startswith("ferry.facts")
                for e in targets if not e.startswith("ferry.facts") and e not in ("ferry.bounded_read", "ferry._ferry")}


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(n for n in modules() if n != "ferry.__main__")  # __main__ runs the command
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]



# ---- PyTorch's private names: only in ferry/torch/_torch_private.py ---------------------

TORCH_ADAPTER = ROOT / "torch" / "_torch_private.py"
# Private attributes of tensors (besides those of the installed PyTorch's Tensor class).
TENSOR_PRIVATE = frozenset({"_base", "_version", "_neg_view", "_cdata", "_typed_storage", "_is_view", "_grad_fn"})
# What holds the torch module in ferry's code besides a name bound by an import:
# `torch = _torch()`, `self._torch`, `torch_module()`.
TORCH_HOLDERS = {"torch", "_torch", "torch_module"}


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _chain(node) -> list[str] | None:
    """["torch", "cuda", "_x"] for torch.cuda._x (and for self._torch.cuda._x,
    _torch().cuda._x); None when no name is at its root."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):
        node = node.func
    if not isinstance(node, ast.Name):
        return None
    chain = [node.id, *reversed(parts)]
    if chain[0] in ("self", "cls") and len(chain) > 1 and chain[1] in TORCH_HOLDERS:
        chain = chain[1:]
    return chain


def private_torch_names(source: str, tensor_private=TENSOR_PRIVATE) -> list[str]:
    """'line: text' for each private PyTorch name the code (not its strings)
    names: a private module or name imported from torch; a private attribute
    reached from the torch module (imported under any name, or held as in
    TORCH_HOLDERS); getattr/hasattr of a private name on it; a tensor's private
    attribute on anything."""
    tree = ast.parse(source)
    roots = set(TORCH_HOLDERS)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    roots.add(alias.asname or "torch")
                    if any(map(_private, alias.name.split("."))):
                        found.add((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                roots.add(alias.asname or alias.name)
                if any(map(_private, node.module.split("."))) or _private(alias.name):
                    found.add((node.lineno, f"from {node.module} import {alias.name}"))
    chains = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is None:
                if node.attr in tensor_private:
                    found.add((node.lineno, f"(...).{node.attr}"))
            elif chain[0] in roots and any(map(_private, chain[1:])):
                chains.add((node.lineno, ".".join(chain)))
            elif chain[-1] in tensor_private and chain[0] not in ("self", "cls"):
                chains.add((node.lineno, ".".join(chain)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            chain = _chain(node.args[0])
            if chain is not None and chain[0] in roots:
                found.add((node.lineno, f"{node.func.id}({'.'.join(chain)}, {node.args[1].value!r})"))
    # torch._C._x is one name, not also torch._C.
    found |= {(line, text) for line, text in chains
              if not any(l2 == line and t2.startswith(text + ".") for l2, t2 in chains)}
    return [f"{line}: {text}" for line, text in sorted(found)]


def _tensor_private() -> frozenset:
    try:
        import torch
    except ImportError:
        return TENSOR_PRIVATE
    return TENSOR_PRIVATE | {n for n in dir(torch.Tensor) if _private(n)}


def test_private_torch_names_are_found():
    code = """
import torch
import torch.utils.data as _data
from torch.utils.data import _utils
from torch._utils import ExceptionWrapper
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, DataLoader
x = torch.cuda._is_in_bad_fork()
f = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
k = _data._DatasetKind.Map
def g(self, t):
    torch = self._torch
    b = t._base, t.grad._version, self._version, torch.__version__, torch.cuda.is_available()
    return self._torch.cuda._lazy_init(), _torch()._C, t[0]._neg_view(), hasattr(torch, "_x")
s = "torch._C in a string"
"""
    assert private_torch_names(code) == [
        "4: from torch.utils.data import _utils",
        "5: from torch._utils import ExceptionWrapper",
        "6: from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter",
        "7: torch.cuda._is_in_bad_fork",
        "8: getattr(torch._C, '_from_dlpack')",
        "8: torch._C",
        "9: _data._DatasetKind.Map",
        "12: t._base",
        "12: t.grad._version",
        "13: (...)._neg_view",
        "13: _torch._C",
        "13: _torch.cuda._lazy_init",
        "13: hasattr(torch, '_x')",
    ]
    assert private_torch_names("import torch\nx = torch.cuda.is_available()\n") == []


def test_private_torch_names_only_in_the_adapter():
    assert TORCH_ADAPTER.is_file()
    tensor_private = _tensor_private()
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path != TORCH_ADAPTER:
            found += [f"{path.relative_to(ROOT.parent)}:{hit}"
                      for hit in private_torch_names(path.read_text(), tensor_private)]
    assert not found, ("private PyTorch names outside ferry/torch/_torch_private.py (add a function there, "
                       "with the versions it was checked against):\n  " + "\n  ".join(found))


def test_bindings_reach_pytorch_only_through_the_adapter():
    """No file of src/python imports a PyTorch module but torch_adapter.cpp, and
    that one only asks ferry/torch/_torch_private.py (where the private names and
    their checked versions are) for the callables it keeps."""
    src = pathlib.Path(__file__).resolve().parents[2] / "src" / "python"
    if not src.is_dir():
        import pytest

        pytest.skip("no source tree beside the tests")
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(src.iterdir()) if p.suffix in (".cpp", ".h")
             and p.name != "torch_adapter.cpp"
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r'import_\("torch', line)]
    assert not found, "PyTorch imported outside src/python/torch_adapter.cpp:\n  " + "\n  ".join(found)
    adapter = (src / "torch_adapter.cpp").read_text()
    assert re.findall(r'import_\("([\w.]+)"\)', adapter) == ["ferry.torch._torch_private"]
    from ferry.torch import _torch_private

    asked = re.findall(r'adapter_callable\(&\w+, "(\w+)"\)', adapter)
    assert asked and all(callable(getattr(_torch_private, name, None)) for name in asked), asked
