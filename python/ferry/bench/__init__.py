"""`ferry bench SUITE`: each suite prints ferry beside its baseline, measured in
the same run, with the ratio, and writes JSON with the machine's facts.

A suite is a module here with a `Suite` subclass (suite.py: key, one-line
description, waived() check, run()) bound to `SUITE`; SUITE_MODULES lists them
in the order `ferry bench --help` shows them.
"""

from __future__ import annotations

import importlib

from .suite import Suite, Waived  # noqa: F401

SUITE_MODULES = ("apiperf", "blocks", "copy", "dataloader", "fork", "latency", "load", "nixl", "node", "offload",
                 "pool", "sanity", "save", "tensors", "thp", "uvm")


def suites() -> dict[str, Suite]:
    """Every suite by key, in SUITE_MODULES order (imports each suite's module: light,
    no torch and no CUDA work at import)."""
    out = {}
    for name in SUITE_MODULES:
        suite = importlib.import_module(f"{__name__}.{name}").SUITE
        out[suite.key] = suite
    return out


def listing() -> str:
    """'  copy      pageable host<->GPU copies ...' lines, one per suite."""
    found = suites()
    width = max(len(k) for k in found)
    return "\n".join(f"  {k:<{width}}  {s.description}" for k, s in found.items())
