"""Bench results in one shape, nvbandwidth's test cases: a flat list of records.

Every suite turns what it measured into records (one per figure) and hands them
to report.write_json; a file holds the records of one or more suites under one
header of machine facts. A record:

    {"suite": "copy",                  # the suite's key
     "case": "ferry auto",             # what was measured (ferry's path or a baseline's)
     "params": {"direction": "h2d", "nbytes": 1073741824, "backing": "4k",
                "baseline_case": "cudaMemcpy pageable"},
     "metric": "bandwidth",            # what `value` is: bandwidth, time, latency_median, ...
     "value": 52.1,                    # a number (a string for a state or fact: "Passed")
     "unit": "GB/s",                   # GB/s = 1e9 bytes/s; s, ms, us; null for a state
     "baseline": 8.4,                  # the baseline's value measured in the same run, or null
     "ratio": 6.2}                     # value / baseline, or null

`params` holds the case's parameters (sizes in bytes under keys ending in
`bytes`, directions as h2d/d2h/bidir) and, where the record has a baseline,
`baseline_case`: the case whose value `baseline` is (its own record is in the
list too, with baseline null). (suite, case, params, metric) names one
figure: a case with two baselines gets one record, with its main one. For
times lower is better, so a ratio below 1
there means ferry is faster; the unit says which kind a metric is.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..errors import InvalidArgumentError

KEYS = ("suite", "case", "params", "metric", "value", "unit", "baseline", "ratio")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def record(suite: str, case: str, metric: str, value: Any, unit: str | None, params: dict | None = None,
           baseline: Any = None) -> dict:
    """One record; ratio = value / baseline where both are numbers and baseline is not 0."""
    if not suite or not case or not metric:
        raise InvalidArgumentError(f"a bench record needs a suite, a case and a metric (got {suite!r}, {case!r}, {metric!r})")
    ratio = value / baseline if _number(value) and _number(baseline) and baseline != 0 else None
    return {"suite": suite, "case": case, "params": dict(params or {}), "metric": metric, "value": value,
            "unit": unit, "baseline": baseline if _number(baseline) else None, "ratio": ratio}


def is_record(r: Any) -> bool:
    return isinstance(r, dict) and tuple(r) == KEYS and isinstance(r["params"], dict)


class Records:
    """The records of one suite, built as it measures.

        out = Records("copy")
        out.compare({"direction": "h2d", "nbytes": n}, "bandwidth", "GB/s",
                    {"ferry auto": 52.1, "cudaMemcpy pageable": 8.4}, baseline="cudaMemcpy pageable")
        out.add("ferry auto", "strategy", "staged", None, direction="h2d", nbytes=n)
        write_json(args.json, "copy", out.items)
    """

    def __init__(self, suite: str):
        self.suite = suite
        self.items: list[dict] = []

    def add(self, case: str, metric: str, value: Any, unit: str | None, baseline: Any = None,
            baseline_case: str | None = None, **params) -> dict:
        """One record; params are keyword arguments (None values left out)."""
        p = {k: v for k, v in params.items() if v is not None}
        if baseline_case is not None and _number(baseline):
            p["baseline_case"] = baseline_case
        r = record(self.suite, case, metric, value, unit, p, baseline)
        self.items.append(r)
        return r

    def compare(self, params: dict, metric: str, unit: str, values: dict[str, Any],
                baseline: str | dict[str, str] | None = None) -> list[dict]:
        """One record per case of `values` measured with the same params (cases
        whose value is None are left out). baseline: the case every other case
        is compared with, or {case: its baseline case} (cases not in it have
        none); a record gets its baseline's value and the ratio to it."""
        out = []
        for case, value in values.items():
            if value is None:
                continue
            base_case = baseline.get(case) if isinstance(baseline, dict) else baseline
            vs = values.get(base_case) if base_case and base_case != case else None
            out.append(self.add(case, metric, value, unit, baseline=vs,
                                baseline_case=base_case if vs is not None else None, **params))
        return out

    def extend(self, records: Iterable[dict]) -> None:
        self.items.extend(records)
