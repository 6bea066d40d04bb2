"""Tables and JSON for `ferry bench`: fixed keys, units in every label."""

from __future__ import annotations

import json
import platform
import sys
import time


def header() -> dict:
    """Versions and the facts that decide transfer speed (THP, hugetlb, NUMA, PCIe)."""
    from .. import _ferry, facts

    f = facts.collect(_ferry.cuda_info())
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


def write_json(path: str | None, suite: str, results: dict) -> None:
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"suite": suite, "header": header(), "results": results}, f, indent=2)
    progress(f"wrote {path}")
