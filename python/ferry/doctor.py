"""`ferry doctor`: the facts of this machine, what ferry measured on it, and the
findings (rules.py) that explain what holds host<->GPU transfers back.

This first version measures the host side only (first-touch rates through a
ferry pool); GPU bandwidth and latency measurements join as the copy engine and
channel land. What is skipped is listed with the reason.
"""

from __future__ import annotations

import json
import sys
import time

from . import _ferry, facts, rules
from .pool import Pool

MiB = 1 << 20
GiB = 1 << 30


def _progress(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"ferry doctor: {message}", file=sys.stderr, flush=True)


def measure_first_touch(nbytes: int, huge: bool, threads: int) -> tuple[float, dict]:
    """GB/s of first touch of nbytes through a fresh pool chunk, and the pool's stats.

    The pool reserves one chunk of exactly nbytes and touches it with `threads`
    threads (4 KiB pages with MADV_NOHUGEPAGE, or THP with MADV_HUGEPAGE).
    """
    pool = Pool(
        chunk_bytes=nbytes,
        huge_pages="thp" if huge else "off",
        touch_threads=threads,
        zero_recycled=False,
    )
    buf = pool.alloc(nbytes, huge=huge)
    stats = pool.stats()
    buf.release()
    pool.trim()
    seconds = stats["touch_seconds"]
    return (nbytes / seconds / 1e9 if seconds > 0 else float("nan")), stats


def measure_host(quick: bool, quiet: bool) -> tuple[dict, dict]:
    """Host-side measurements, and the stats of the last pool used."""
    size = 256 * MiB if quick else GiB
    m: dict = {}
    stats: dict = {}
    cases = [
        ("first_touch_4k_1thread_gbps", False, 1),
        ("first_touch_4k_gbps", False, 0),
        ("first_touch_thp_gbps", True, 0),
    ]
    for key, huge, threads in cases:
        _progress(f"measuring {key} ({size // MiB} MiB)", quiet)
        m[key], stats = measure_first_touch(size, huge, threads)
    return m, stats


def run(quick: bool = True, quiet: bool = False) -> dict:
    """Collect facts, measure, evaluate rules; return the whole report as a dict."""
    _progress("reading host and GPU facts", quiet)
    cuda_info = _ferry.cuda_info()
    report = facts.collect(cuda_info)
    report["ferry"] = _ferry.versions()
    skipped = []
    if cuda_info is None:
        skipped.append(
            {"what": "GPU measurements", "why": "no CUDA driver (libcuda.so.1 not found)"}
        )
    elif not cuda_info.get("devices"):
        skipped.append({"what": "GPU measurements", "why": "no CUDA device"})
    else:
        skipped.append(
            {"what": "GPU bandwidth and latency", "why": "not yet implemented in this version"}
        )
    started = time.monotonic()
    measurements, pool_stats = measure_host(quick, quiet)
    report["measurements"] = measurements
    report["pool"] = pool_stats
    report["skipped"] = skipped
    report["findings"] = [f.to_dict() for f in rules.evaluate(report, measurements)]
    report["elapsed_seconds"] = round(time.monotonic() - started, 3)
    return report


def format_report(report: dict) -> str:
    lines = [facts.report.format_facts(report), "", "Measurements (host)"]
    for key, value in report.get("measurements", {}).items():
        lines.append(f"  {key:<32} {value:8.2f} GB/s")
    for s in report.get("skipped", []):
        lines.append(f"  skipped: {s['what']}: {s['why']}")
    lines.append("")
    findings = [rules.Finding(**f) for f in report.get("findings", [])]
    lines.append(rules.format_findings(findings))
    return "\n".join(lines)


def main(args) -> int:
    report = run(quick=not getattr(args, "full", False), quiet=args.json)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0
