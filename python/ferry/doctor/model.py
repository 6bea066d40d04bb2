"""The doctor's report model: sections of labelled rows, built once from a report
dict (report.py builds them) and drawn by thin renderers (text_report.py,
html_report.py) that add no figure, label or ratio of their own.

A `Section` (findings, measurements, skipped measurements, facts) holds blocks:
a `Block` is an optional heading over labelled `Row`s, a `Table`, or one
sentence; a `FindingBlock` is one finding. `Figures` reads a report's
measurements leniently: anything that is not a finite number is "not measured",
so a report of an unexpected shape still renders.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Union

from .. import units


@dataclasses.dataclass(frozen=True)
class Row:
    """'label  value', with items listed under the value (evidence, notes)."""

    label: str
    value: str = ""
    items: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    """A grid: a header row, then rows of cells (all text); numeric: cells are figures."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: bool = False


@dataclasses.dataclass(frozen=True)
class Block:
    """A heading ('' for none) over rows, a table, or one sentence (text).

    detail: supporting figures that the HTML page shows folded and the text report
    leaves out (the JSON has them)."""

    heading: str = ""
    rows: tuple[Row, ...] = ()
    table: Table | None = None
    text: str = ""
    detail: bool = False


@dataclasses.dataclass(frozen=True)
class FindingBlock:
    """One finding: severity, id, title, the evidence and the fix."""

    severity: str
    id: str
    title: str
    evidence: tuple[str, ...] = ()
    fix: str = ""


@dataclasses.dataclass(frozen=True)
class Section:
    """A part of the report; id is stable (the HTML anchor), intro one line under the title."""

    id: str
    title: str
    intro: str = ""
    blocks: tuple[Union[Block, FindingBlock], ...] = ()


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def text(value: Any) -> str:
    """A fact as text: None is 'unknown'."""
    return "unknown" if value is None else str(value)


def gpu_order(key: str) -> tuple:
    """Sort key of GPU indexes given as strings: '2' before '10'."""
    return (len(key), key)


class Figures:
    """A report's measurements and GPU facts, read leniently."""

    def __init__(self, report: dict):
        self.m = as_dict(report.get("measurements"))
        gpus = report.get("gpus")
        self.gpus = {str(g.get("index", i)): g for i, g in enumerate(gpus if isinstance(gpus, list) else [])
                     if isinstance(g, dict)}

    def num(self, key: str) -> float | None:
        return units.number(self.m.get(key))

    def per_gpu(self, name: str, gpu: str) -> float | None:
        """A per-GPU figure ({"<gpu>": value}) of GPU `gpu`."""
        return units.number(as_dict(self.m.get(name)).get(gpu))

    def size(self, key: str) -> str:
        """The size recorded under key ('1 GiB'), '?' when none."""
        return units.fmt_bytes(self.m[key]) if self.num(key) else "?"

    def gpu_keys(self, *names: str) -> list[str]:
        """The GPUs with a figure under any of the per-GPU names, in index order."""
        return sorted({k for name in names for k in as_dict(self.m.get(name))}, key=gpu_order)

    def link(self, gpu: str) -> float | None:
        """The GPU's link limit (units.link_limit) given its pinned copies."""
        facts = self.gpus.get(gpu, {})
        pinned = [self.per_gpu(f"pinned_{d}_gbps", gpu) for d in ("h2d", "d2h")]
        return units.link_limit(facts.get("link_gbps"), facts.get("max_link_gbps"),
                                [v for v in pinned if v is not None])[0]

    def gpu_label(self, gpu: str) -> str:
        """'GPU 0 (NVIDIA H200)'."""
        name = self.gpus.get(gpu, {}).get("name")
        return f"GPU {gpu}" + (f" ({name})" if name else "")

    def points(self, name: str) -> list[tuple[int, float]]:
        """{"<int>": value} under name as sorted (int, value) pairs; other keys are ignored."""
        out = []
        for k, v in as_dict(self.m.get(name)).items():
            with contextlib.suppress(ValueError):
                if units.number(v) is not None:
                    out.append((int(k), float(v)))
        return sorted(out)
