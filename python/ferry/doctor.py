"""`ferry doctor`: the facts of this machine, what ferry measured on it, and the
findings (rules.py) that explain what holds host<->GPU transfers back.

Modes: default (<= 60 s on a 16-core GPU machine), `--quick` (<= 15 s, smaller
sizes), `--full` (more sizes and threads, no time promise). A measurement that
would start after 85% of the mode's time budget is skipped instead. Progress
goes to stderr ("ferry doctor: [4/8] pinned bandwidth ...") unless --json.
`--html FILE` also writes the report as one self-contained HTML page with plots
(html_report.py); the path goes to stderr.

The report (also the --json object) has fixed keys: the facts at the top level
(facts_version, host, cuda, gpus, notes; see facts/__init__.py), ferry
(versions), mode, measurements (below), skipped ([{what, keys, why}]: each
measurement that did not run, and why), findings ([{id, severity, title,
evidence, fix}], rules.py), pool (stats of the pool the doctor used: the pinned
pool of the allocation measurement, else the THP first-touch pool) and
elapsed_seconds.

measurements (GB/s = 10^9 bytes/s, one direction; per-GPU figures are
{"<gpu index>": value}):
  pinned_h2d_gbps, pinned_d2h_gbps           cudaMemcpyAsync from cudaHostAlloc memory (per GPU)
  pinned_h2d_share_of_link, ..._d2h_...      the same as a fraction of the link limit (per GPU)
  pageable_{h2d,d2h}_gbps_{cuda,ferry}       cudaMemcpy vs ferry's copy, same pageable buffer (per GPU)
  pinned_alloc_seconds_{cuda,ferry}          cudaHostAlloc(N) vs PinnedPool(target_bytes=N) ready (GPU 0)
  small_copy_us_{cuda,channel}_{h2d,d2h}     4-byte copy: cudaMemcpy vs ferry's channel, median us (GPU 0)
  register_gbps_{4k,thp,hugetlb}             cudaHostRegister rate of a pinned pool by page size (GPU 0)
  memcpy_gbps_by_threads                     {"threads": GB/s} host memcpy
  first_touch_4k_1thread_gbps, first_touch_4k_gbps, first_touch_thp_gbps
  copy_bytes, pinned_alloc_bytes, register_bytes, memcpy_bytes, first_touch_bytes: the sizes used
  bandwidth_by_size (--full): {"<gpu>": [{"nbytes", "pinned_h2d_gbps", ...}]}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from . import _ferry, facts, measure, rules
from .measure import GiB, MiB


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one mode measures, and its time budget (None: no promise)."""

    budget_seconds: float | None
    copy_bytes: int  # pinned and pageable bandwidth
    reps: int  # timed repeats of each copy
    alloc_bytes: int
    register_bytes: int
    memcpy_bytes: int
    touch_bytes: int
    latency_iterations: int
    most_threads: int | None = 16  # host memcpy thread counts stop here
    by_size: tuple[int, ...] = ()  # extra bandwidth sizes (--full)


_DEFAULT = Plan(budget_seconds=60, copy_bytes=GiB, reps=5, alloc_bytes=GiB, register_bytes=GiB,
                memcpy_bytes=256 * MiB, touch_bytes=GiB, latency_iterations=1000)
PLANS = {
    "quick": dataclasses.replace(_DEFAULT, budget_seconds=15, copy_bytes=256 * MiB, reps=3,
                                 alloc_bytes=256 * MiB, register_bytes=512 * MiB, memcpy_bytes=64 * MiB,
                                 touch_bytes=256 * MiB, latency_iterations=300),
    "default": _DEFAULT,
    "full": dataclasses.replace(_DEFAULT, budget_seconds=None, latency_iterations=5000, most_threads=None,
                                by_size=(4 * MiB, 64 * MiB, 256 * MiB, GiB, 4 * GiB)),
}
BUDGET_SHARE = 0.85  # no measurement starts after this share of the budget
STEPS = 9  # facts, memcpy, first touch, pinned, pageable, allocation, latency, registration, by size


# ---------------------------------------------------------------------------- run


class _Run:
    """One doctor run: the plan, the clock, progress, and what was measured or skipped."""

    def __init__(self, mode: str, quiet: bool):
        self.mode, self.plan, self.quiet = mode, PLANS[mode], quiet
        self.started = time.monotonic()
        self.total = STEPS if self.plan.by_size else STEPS - 1
        self.m: dict = {}
        self.skipped: list[dict] = []
        self.pool: dict = {}
        self.available: int | None = None  # host memory, bytes

    def progress(self, step: int, text: str) -> None:
        if not self.quiet:
            print(f"ferry doctor: [{step}/{self.total}] {text}", file=sys.stderr, flush=True)

    def skip(self, what: str, keys: list[str], why: str) -> None:
        self.skipped.append({"what": what, "keys": keys, "why": why})

    def over_budget(self) -> str | None:
        budget = self.plan.budget_seconds
        if budget is None or time.monotonic() - self.started < BUDGET_SHARE * budget:
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
            self.progress(step, f"{what}: skipped: {why}")
            self.skip(what, keys, why)
        return result


def _gpu_indexes(cuda_info: dict) -> list[int]:
    return [int(d.get("index", i)) for i, d in enumerate(cuda_info.get("devices") or [])]


def _link_limit(gpu: dict, measured: list[float]) -> float | None:
    """The link's per-direction limit: link_gbps, or max_link_gbps when a copy beat the
    current link (an idle GPU trains its link down and back up under load)."""
    link, top = gpu.get("link_gbps"), gpu.get("max_link_gbps")
    if link and top and measured and max(measured) > link:
        return top
    return link or None


def _measure_host(r: _Run) -> None:
    p, m = r.plan, r.m

    def memcpy():
        n = r.fit(p.memcpy_bytes)
        counts = measure.thread_counts(measure.usable_cpus(), p.most_threads)
        m["memcpy_gbps_by_threads"] = measure.memcpy_gbps_by_threads(n, counts, 3)
        m["memcpy_bytes"] = n

    r.attempt(2, f"host memcpy bandwidth by threads ({_size(p.memcpy_bytes)})",
              ["memcpy_gbps_by_threads"], memcpy)
    for key, huge, threads, label in (
        ("first_touch_4k_1thread_gbps", False, 1, "4 KiB pages, 1 thread"),
        ("first_touch_4k_gbps", False, 0, "4 KiB pages, all threads"),
        ("first_touch_thp_gbps", True, 0, "THP, all threads"),
    ):
        def touch(huge=huge, threads=threads):
            n = r.fit(p.touch_bytes)
            rate, stats = measure.first_touch(n, huge, threads)
            m["first_touch_bytes"] = n
            return rate, stats

        got = r.attempt(3, f"first touch, {label} ({_size(p.touch_bytes)})", [key], touch)
        if got is not None:
            m[key], pool_stats = got
            if huge:
                r.pool = pool_stats


def _measure_gpus(r: _Run, report: dict, cuda_info: dict | None) -> None:
    p, m = r.plan, r.m
    gpu_steps = [
        (4, "pinned bandwidth", ["pinned_h2d_gbps", "pinned_d2h_gbps"]),
        (5, "pageable copies, ferry vs CUDA",
         [f"pageable_{d}_gbps_{w}" for d in ("h2d", "d2h") for w in ("cuda", "ferry")]),
        (6, "pinned allocation, ferry pool vs cudaHostAlloc",
         ["pinned_alloc_seconds_cuda", "pinned_alloc_seconds_ferry"]),
        (7, "small-copy latency, channel vs cudaMemcpy",
         [f"small_copy_us_{w}_{d}" for w in ("cuda", "channel") for d in ("h2d", "d2h")]),
        (8, "registration by page size", ["register_gbps_4k", "register_gbps_thp", "register_gbps_hugetlb"]),
    ]
    if p.by_size:
        gpu_steps.append((9, "bandwidth by size", ["bandwidth_by_size"]))
    absent = measure.gpu_absent_reason(cuda_info)
    if absent is not None:
        for step, what, keys in gpu_steps:
            r.progress(step, f"GPU {what}: skipped: {absent}")
            r.skip(f"GPU {what}", keys, absent)
        return
    gpus = {str(g.get("index", i)): g for i, g in enumerate(report.get("gpus") or [])}
    devices = _gpu_indexes(cuda_info)

    for dev in devices:
        key = str(dev)
        n = r.fit(p.copy_bytes)
        got = r.attempt(4, f"pinned bandwidth, GPU {dev} ({_size(n)})", gpu_steps[0][2],
                        measure.pinned_gbps, dev, n, p.reps)
        if got is None:
            continue
        m["copy_bytes"] = n
        for d in ("h2d", "d2h"):
            m.setdefault(f"pinned_{d}_gbps", {})[key] = got[d]
        link = _link_limit(gpus.get(key, {}), list(got.values()))
        if link:
            for d in ("h2d", "d2h"):
                m.setdefault(f"pinned_{d}_share_of_link", {})[key] = got[d] / link

    for dev in devices:
        n = r.fit(p.copy_bytes)
        got = r.attempt(5, f"pageable copies, ferry vs CUDA, GPU {dev} ({_size(n)})", gpu_steps[1][2],
                        measure.pageable_gbps, dev, n, p.reps)
        for name, value in (got or {}).items():
            d, who = name.split("_")
            m.setdefault(f"pageable_{d}_gbps_{who}", {})[str(dev)] = value
        if got:
            m["copy_bytes"] = n

    dev = devices[0]
    n = r.fit(p.alloc_bytes)
    got = r.attempt(6, f"pinned allocation, ferry pool vs cudaHostAlloc, GPU {dev} ({_size(n)})",
                    gpu_steps[2][2], measure.pinned_alloc_seconds, dev, n)
    if got is not None:
        seconds, r.pool = got
        m["pinned_alloc_seconds_cuda"], m["pinned_alloc_seconds_ferry"] = seconds["cuda"], seconds["ferry"]
        m["pinned_alloc_bytes"] = n

    got = r.attempt(7, f"small-copy latency, channel vs cudaMemcpy, GPU {dev} (4 B)", gpu_steps[3][2],
                    measure.small_copy_us, dev, p.latency_iterations)
    for name, value in (got or {}).items():
        who, d = name.split("_")
        m[f"small_copy_us_{who}_{d}"] = value

    n = r.fit(p.register_bytes)
    free_hugetlb = measure.hugetlb_free_bytes(report.get("host") or {})
    for kind in ("4k", "thp", "hugetlb"):
        what = f"registration rate, {kind} pages, GPU {dev} ({_size(n)})"
        if kind == "hugetlb" and free_hugetlb < n:
            why = (f"{free_hugetlb // measure.HUGETLB_PAGE} free 2 MiB hugetlb pages, "
                   f"{n // measure.HUGETLB_PAGE} needed")
            r.progress(8, f"{what}: skipped: {why}")
            r.skip(what, ["register_gbps_hugetlb"], why)
            continue
        got = r.attempt(8, what, [f"register_gbps_{kind}"], measure.register_gbps, dev, n, kind)
        if got is not None:
            m[f"register_gbps_{kind}"] = got
            m["register_bytes"] = n

    for dev in devices if p.by_size else ():
        rows = m.setdefault("bandwidth_by_size", {}).setdefault(str(dev), [])
        for size in p.by_size:
            def one(size=size):
                size = r.fit(size)
                row = {"nbytes": size}
                row.update({f"pinned_{d}_gbps": v for d, v in measure.pinned_gbps(dev, size, p.reps).items()})
                for name, v in measure.pageable_gbps(dev, size, p.reps).items():
                    d, who = name.split("_")
                    row[f"pageable_{d}_gbps_{who}"] = v
                return row

            row = r.attempt(9, f"bandwidth by size, GPU {dev} ({_size(size)})", ["bandwidth_by_size"], one)
            if row is not None:
                rows.append(row)


def run(mode: str = "default", quiet: bool = False) -> dict:
    """Collect facts, measure, evaluate rules; return the whole report as a dict."""
    r = _Run(mode, quiet)
    r.progress(1, "reading host and GPU facts")
    cuda_info = _ferry.cuda_info()
    report = facts.collect(cuda_info)
    report["ferry"] = _ferry.versions()
    report["mode"] = mode
    r.available = ((report.get("host") or {}).get("memory") or {}).get("available_bytes")
    _measure_host(r)
    _measure_gpus(r, report, cuda_info)
    report["measurements"] = r.m
    report["skipped"] = r.skipped
    report["findings"] = [f.to_dict() for f in rules.evaluate(report, r.m)]
    report["pool"] = r.pool
    report["elapsed_seconds"] = round(time.monotonic() - r.started, 3)
    if not quiet:
        print(f"ferry doctor: done in {report['elapsed_seconds']:.1f} s", file=sys.stderr, flush=True)
    return report


# ------------------------------------------------------------------------ formatting


def _size(n: float) -> str:
    return rules._fmt_bytes(n)


def fmt_gbps(x: float) -> str:
    return f"{x:.1f} GB/s"


def fmt_seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def fmt_us(x: float) -> str:
    return f"{x:.1f} us" if x < 100 else f"{x:.0f} us"


def link_share(x: float, link: float | None) -> str:
    """'65% of the 63.0 GB/s link', or '' when the link is unknown."""
    return f"{100 * x / link:.0f}% of the {fmt_gbps(link)} link" if link else ""


def versus(ours: float | None, theirs: float | None, fmt, ours_name: str = "ferry",
           theirs_name: str = "CUDA", lower_is_better: bool = False) -> str:
    """'ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x)'; the ratio says how many times better
    ours is (rates: ours/theirs; times: theirs/ours). A missing side is 'not measured'."""
    if ours is None and theirs is None:
        return "not measured"
    a = f"{ours_name} {fmt(ours) if ours is not None else 'not measured'}"
    b = f"{theirs_name} {fmt(theirs) if theirs is not None else 'not measured'}"
    text = f"{a} vs {b}"
    if ours and theirs:
        text += f" ({(theirs / ours if lower_is_better else ours / theirs):.1f}x)"
    return text


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def _gpu_value(m: dict, name: str, key: str):
    table = m.get(name)
    return table.get(key) if isinstance(table, dict) else None


def format_measurements(report: dict) -> list[str]:
    """The Measurements section of the readable report: each figure with its unit, its
    share of the link where it has one, and ferry beside CUDA with the ratio."""
    m = report.get("measurements") or {}
    lines = [f"Measurements ({report.get('mode', 'default')} run, "
             f"{report.get('elapsed_seconds', 0):.1f} s; GB/s = 10^9 bytes/s per direction)"]
    row = "  {:<34} {}".format

    def sized(key: str) -> str:
        return _size(m[key]) if m.get(key) else "?"

    gpus = {str(g.get("index", i)): g for i, g in enumerate(report.get("gpus") or [])}
    keys = sorted({k for name in ("pinned_h2d_gbps", "pageable_h2d_gbps_ferry", "pageable_h2d_gbps_cuda")
                   for k in (m.get(name) or {})}, key=lambda k: (len(k), k))
    copy = sized("copy_bytes")
    for key in keys:
        gpu = gpus.get(key, {})
        pinned = {d: _gpu_value(m, f"pinned_{d}_gbps", key) for d in ("h2d", "d2h")}
        link = _link_limit(gpu, [v for v in pinned.values() if v is not None])
        lines.append(f"  GPU {key}" + (f" ({gpu['name']})" if gpu.get("name") else "")
                     + (f", link {fmt_gbps(link)} per direction" if link else ", link limit unknown"))
        for d, direction in (("h2d", "host->device"), ("d2h", "device->host")):
            if pinned[d] is not None:
                lines.append(row(f"  pinned {direction} ({copy})",
                                 _join(fmt_gbps(pinned[d]), link_share(pinned[d], link))))
        for d, direction in (("h2d", "host->device"), ("d2h", "device->host")):
            ours = _gpu_value(m, f"pageable_{d}_gbps_ferry", key)
            theirs = _gpu_value(m, f"pageable_{d}_gbps_cuda", key)
            if ours is None and theirs is None:
                continue
            lines.append(row(f"  pageable {direction} ({copy})",
                             _join(versus(ours, theirs, fmt_gbps),
                                   link_share(ours, link) if ours is not None else "")))
        for r in (m.get("bandwidth_by_size") or {}).get(key, []):
            pair = "{:.1f} / {:.1f} GB/s".format
            lines.append(row(f"  {_size(r['nbytes'])}, h2d / d2h",
                             f"pinned {pair(r['pinned_h2d_gbps'], r['pinned_d2h_gbps'])}; pageable ferry "
                             f"{pair(r['pageable_h2d_gbps_ferry'], r['pageable_d2h_gbps_ferry'])}, CUDA "
                             f"{pair(r['pageable_h2d_gbps_cuda'], r['pageable_d2h_gbps_cuda'])}"))
    if "pinned_alloc_seconds_ferry" in m or "pinned_alloc_seconds_cuda" in m:
        lines.append(row(f"pinned {sized('pinned_alloc_bytes')} ready to use",
                         versus(m.get("pinned_alloc_seconds_ferry"), m.get("pinned_alloc_seconds_cuda"),
                                fmt_seconds, "ferry pool", "cudaHostAlloc", lower_is_better=True)))
    for d, direction in (("h2d", "host->device"), ("d2h", "device->host")):
        ours, theirs = m.get(f"small_copy_us_channel_{d}"), m.get(f"small_copy_us_cuda_{d}")
        if ours is not None or theirs is not None:
            lines.append(row(f"4-byte copy {direction}",
                             versus(ours, theirs, fmt_us, "channel", "cudaMemcpy", lower_is_better=True)))
    base = m.get("register_gbps_4k")
    reg = []
    for kind, label in (("4k", "4 KiB pages"), ("thp", "THP"), ("hugetlb", "hugetlb 2 MiB")):
        v = m.get(f"register_gbps_{kind}")
        if v is not None:
            reg.append(f"{label} {fmt_gbps(v)}" + (f" ({v / base:.1f}x)" if base and kind != "4k" else ""))
    if reg:
        lines.append(row(f"cudaHostRegister rate ({sized('register_bytes')})", ", ".join(reg)))
    by_threads = m.get("memcpy_gbps_by_threads") or {}
    if by_threads:
        lines.append(row(f"host memcpy ({sized('memcpy_bytes')})", ", ".join(
            f"{t} thread{'' if t == '1' else 's'} {fmt_gbps(v)}"
            for t, v in sorted(by_threads.items(), key=lambda kv: int(kv[0])))))
    touch = [(label, m.get(k)) for k, label in (("first_touch_4k_1thread_gbps", "4 KiB pages 1 thread"),
                                                ("first_touch_4k_gbps", "4 KiB pages all threads"),
                                                ("first_touch_thp_gbps", "THP all threads"))]
    touch = [f"{label} {fmt_gbps(v)}" for label, v in touch if v is not None]
    if touch:
        lines.append(row(f"first touch ({sized('first_touch_bytes')})", ", ".join(touch)))
    if len(lines) == 1:
        lines.append("  (none)")
    for s in report.get("skipped", []):
        lines.append(f"  skipped: {s['what']}: {s['why']}")
    return lines


def format_report(report: dict) -> str:
    lines = [facts.report.format_facts(report), *format_measurements(report), ""]
    findings = [rules.Finding(**f) for f in report.get("findings", [])]
    lines.append(rules.format_findings(findings))
    return "\n".join(lines)


# ------------------------------------------------------------------------ command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's options, for `ferry doctor` (cli.py) and `python -m ferry.doctor`."""
    parser.add_argument("--json", action="store_true", help="print one JSON object (no progress)")
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="smaller sizes, at most 15 s")
    speed.add_argument("--full", action="store_true", help="more sizes and threads, no time limit")
    parser.add_argument("--html", metavar="FILE",
                        help="also write the report as one self-contained HTML page with plots to FILE "
                             "(plots need matplotlib)")


def main(args) -> int:
    mode = "full" if getattr(args, "full", False) else "quick" if getattr(args, "quick", False) else "default"
    html_path = getattr(args, "html", None)
    if html_path:
        from . import html_report

        problem = html_report.unwritable(html_path)  # before measuring, not after
        if problem:
            print(f"ferry doctor: error: cannot write the HTML report: {problem}", file=sys.stderr)
            return 2
    report = run(mode, quiet=args.json)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    if html_path:
        sys.stdout.flush()
        try:
            written = html_report.write(report, html_path)
        except OSError as e:
            print(f"ferry doctor: error: cannot write the HTML report to {html_path}: {e}", file=sys.stderr)
            return 1
        print(f"ferry doctor: HTML report written to {written}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m ferry.doctor", description=__doc__.split("\n\n")[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
