"""One `ferry doctor` run: read the facts, run each measurement step within the
mode's time budget, evaluate the rules, and return the report dict.

`Run` is what a step sees: the plan, the clock, progress lines, the figures
measured so far (`m`), and `attempt()`, which runs a measurement guarded (a
failure or a spent budget becomes an entry in `skipped`, never an exception).
The steps themselves, in order, are steps.STEPS. No formatting here: the report
model (report.py) and its renderers turn the dict into text and HTML.
"""

from __future__ import annotations

import sys
import time

from .. import _ferry, facts, measure, rules
from ..units import MiB
from . import plan as plans
from .steps import STEPS


class Run:
    """One doctor run: the plan, the clock, progress, and what was measured or skipped."""

    def __init__(self, mode: str, quiet: bool):
        self.mode, self.plan, self.quiet = mode, plans.PLANS[mode], quiet
        self.started = time.monotonic()
        self.steps = [s for s in STEPS if self.plan.by_size or not s.full_only]
        self.total = 1 + len(self.steps)  # the facts, then each step
        self.m: dict = {}
        self.skipped: list[dict] = []
        self.pool: dict = {}
        self.report: dict = {}  # the facts, then measurements (r.m) and the rest
        self.cuda_info: dict | None = None
        self.available: int | None = None  # host memory, bytes

    @property
    def devices(self) -> list[int]:
        """The CUDA device indexes the GPU steps measure."""
        info = self.cuda_info or {}
        return [int(d.get("index", i)) for i, d in enumerate(info.get("devices") or [])]

    def progress(self, step: int, text: str) -> None:
        if not self.quiet:
            print(f"ferry doctor: [{step}/{self.total}] {text}", file=sys.stderr, flush=True)

    def skip(self, step: int, what: str, keys: list[str], why: str) -> None:
        """Lists a measurement that did not run, and why."""
        self.progress(step, f"{what}: skipped: {why}")
        self.skipped.append({"what": what, "keys": list(keys), "why": why})

    def over_budget(self) -> str | None:
        budget = self.plan.budget_seconds
        if budget is None or time.monotonic() - self.started < plans.BUDGET_SHARE * budget:
            return None
        return (f"the {self.mode} run's time budget of {budget:.0f} s was spent "
                "(`ferry doctor --full` runs every measurement)")

    def fit(self, nbytes: int) -> int:
        """nbytes, or a third of the available host memory where that is less (in steps
        of 64 MiB, at least 64 MiB: a measurement that still runs out of memory fails
        inside its guard and is listed as skipped)."""
        if not self.available:
            return nbytes
        return min(nbytes, max(64 * MiB, self.available // 3 // (64 * MiB) * (64 * MiB)))

    def attempt(self, step: int, what: str, keys: list[str], fn, *args):
        """fn(*args) guarded: its result, or None with an entry in skipped."""
        why = self.over_budget()
        result = None
        if why is None:
            self.progress(step, what)
            result, why = measure.guarded(fn, *args)
        if why is not None:
            self.skip(step, what, keys, why)
        return result


def run(mode: str = "default", quiet: bool = False) -> dict:
    """Collect facts, measure, evaluate rules; return the whole report as a dict
    (its keys: the package docstring of ferry.doctor)."""
    r = Run(mode, quiet)
    r.progress(1, "reading host and GPU facts")
    r.cuda_info = _ferry.cuda_info()
    report = facts.collect(r.cuda_info, _ferry)
    report["ferry"] = _ferry.versions()
    report["mode"] = mode
    report["measurements"] = r.m
    r.report = report
    r.available = ((report.get("host") or {}).get("memory") or {}).get("available_bytes")
    absent = measure.gpu_absent_reason(r.cuda_info)
    for number, step in enumerate(r.steps, 2):
        if step.needs_gpu and absent is not None:
            r.skip(number, f"GPU {step.title}", list(step.keys), absent)
        else:
            step.run(r, number)
    report["skipped"] = r.skipped
    report["findings"] = [f.to_dict() for f in rules.evaluate(report, r.m)]
    report["pool"] = r.pool
    report["elapsed_seconds"] = round(time.monotonic() - r.started, 3)
    if not quiet:
        print(f"ferry doctor: done in {report['elapsed_seconds']:.1f} s", file=sys.stderr, flush=True)
    return report
