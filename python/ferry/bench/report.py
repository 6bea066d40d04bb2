"""Tables and JSON for `ferry bench`: fixed keys, units in every label.

The JSON file: {"header": machine facts, "suites": {key: {"time", "waived"}},
"records": [records.py's records of every suite in the file], and where a
suite keeps raw rows for its own scripts "details": {key: ...}}.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from .records import is_record


def header() -> dict:
    """Versions and the facts that decide transfer speed (THP, hugetlb, NUMA, PCIe)."""
    from .. import _ferry, facts

    f = facts.collect(_ferry.cuda_info(), _ferry)
    host = f["host"]
    return {
        "ferry": _ferry.versions(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "name": platform.node(),
            "kernel": host.get("kernel"),
            "virtualization": (host.get("virtualization") or {}).get("kind"),
            "cpu": (host.get("cpu") or {}).get("model"),
            "thp": host.get("thp"),
            "hugetlb": host.get("hugetlb"),
            "numa_nodes": len(host.get("numa_nodes") or []),
        },
        "cuda": f["cuda"],
        "gpus": [
            {k: g.get(k) for k in ("name", "pcie", "link_gbps", "numa_node", "bar1_bytes")}
            for g in f["gpus"]
        ],
    }


def table(title: str, columns: list[str], rows: list[list]) -> str:
    """A plain aligned table; floats with 3 significant decimals."""

    def cell(x):
        if isinstance(x, float):
            return "-" if x != x else (f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}")
        return "-" if x is None else str(x)

    cells = [[cell(x) for x in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    out = [title, "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    out += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def write_json(path: str | None, suite: str, records: list[dict], waived: str | None = None,
               details: dict | None = None) -> None:
    """Writes `suite`'s records (records.py) to `path` under the machine's header.

    A file that holds records of other suites, written on this host, keeps
    them: this suite's earlier records are replaced, the header refreshed
    (`ferry bench --json FILE a,b` and runs one after another fill one file).
    Any other file at `path` is replaced. waived: why the suite did not run.
    details: the suite's raw rows for its own scripts (file["details"][suite]);
    every figure still goes into a record.
    """
    if not path:
        return
    bad = [r for r in records if not is_record(r)] if isinstance(records, list) else [records]
    if bad:
        raise TypeError(f"bench {suite}: write_json takes a list of records (ferry/bench/records.py), "
                        f"got {str(bad[0])[:120]}")
    head = header()
    kept, suites, extra = [], {}, {}
    old = _read_records_file(path)
    if old is not None and (old["header"].get("host") or {}).get("name") == head["host"]["name"]:
        kept = [r for r in old["records"] if r.get("suite") != suite]
        suites = {k: v for k, v in old["suites"].items() if k != suite}
        extra = {k: v for k, v in (old.get("details") or {}).items() if k != suite}
    elif old is None and os.path.exists(path):
        progress(f"replacing {path} (not a ferry bench records file of this host)")
    suites[suite] = {"time": head["time"], "waived": waived}
    doc = {"header": head, "suites": suites, "records": kept + list(records)}
    if details is not None:
        extra[suite] = details
    if extra:
        doc["details"] = extra
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    progress(f"wrote {path} ({len(records)} records of {suite}"
             + (f", {len(kept)} of {', '.join(k for k in suites if k != suite)} kept)" if kept else ")"))


def _read_records_file(path: str) -> dict | None:
    """The file at path if it is one write_json wrote, else None."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if (isinstance(data, dict) and isinstance(data.get("records"), list) and isinstance(data.get("suites"), dict)
            and isinstance(data.get("header"), dict)):
        return data
    return None
