"""The measurements of `ferry doctor`, one `Step` each, in the order they run.

A step says everything the doctor needs to know about one measurement:
  - title and keys: its progress line and the measurement keys it fills (the
    keys listed under `skipped` when it cannot run); doc: what those keys hold,
    with units (the --json contract);
  - scope: "host", "gpu" (each GPU) or "first-gpu"; GPU steps are skipped, with
    the reason, where there is no CUDA device;
  - run(r, number): measures through r.attempt() (guarded, within the time
    budget; the figures come from measure.py) and records into r.m;
  - report(figures, gpu): the rows the report shows for it (model.Row, or a
    whole model.Block such as a table), with units, the share of the link and
    ferry beside its baseline. The text and HTML reports draw these rows as
    they are.

Adding a measurement is adding a Step here (and its test in
tests/python/test_doctor.py); measure.py holds the measuring functions the bench
suites share.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .. import measure
from ..units import fmt_bytes, fmt_gbps, fmt_ratio, fmt_seconds, fmt_us, join, link_share, number, versus
from .model import Block, Figures, Row, Table

DIRECTIONS = (("h2d", "host->device"), ("d2h", "device->host"))


@dataclasses.dataclass(frozen=True)
class Step:
    title: str
    keys: tuple[str, ...]
    doc: str
    scope: str  # "host", "gpu" or "first-gpu"
    run: Callable  # (run.Run, step number) -> None
    report: Callable[[Figures, "str | None"], list]  # -> [Row | Block]
    full_only: bool = False  # only in --full runs (the plan has by_size)

    @property
    def needs_gpu(self) -> bool:
        return self.scope != "host"


# ---- host memcpy ----------------------------------------------------------------------


def _run_memcpy(r, number: int) -> None:
    def memcpy():
        n = r.fit(r.plan.memcpy_bytes)
        counts = measure.thread_counts(measure.usable_cpus(), r.plan.most_threads)
        r.m["memcpy_gbps_by_threads"] = measure.memcpy_gbps_by_threads(n, counts, 3)
        r.m["memcpy_bytes"] = n

    r.attempt(number, f"host memcpy bandwidth by threads ({fmt_bytes(r.plan.memcpy_bytes)})",
              ["memcpy_gbps_by_threads"], memcpy)


def memcpy_points(f: Figures) -> list[tuple[int, float]]:
    """(threads, GB/s) of the host memcpy, by thread count."""
    return f.points("memcpy_gbps_by_threads")


def _report_memcpy(f: Figures, gpu=None) -> list:
    points = memcpy_points(f)
    if not points:
        return []
    return [Row(f"host memcpy ({f.size('memcpy_bytes')})",
                ", ".join(f"{t} thread{'' if t == 1 else 's'} {fmt_gbps(v)}" for t, v in points))]


# ---- first touch ----------------------------------------------------------------------

TOUCH = (  # key, 4 KiB pages or THP, threads (0: all), label
    ("first_touch_4k_1thread_gbps", False, 1, "4 KiB pages 1 thread"),
    ("first_touch_4k_gbps", False, 0, "4 KiB pages all threads"),
    ("first_touch_thp_gbps", True, 0, "THP all threads"),
)


def _run_first_touch(r, number: int) -> None:
    for key, huge, threads, label in TOUCH:
        def touch(huge=huge, threads=threads):
            n = r.fit(r.plan.touch_bytes)
            rate, stats = measure.first_touch(n, huge, threads)
            r.m["first_touch_bytes"] = n
            return rate, stats

        got = r.attempt(number, f"first touch, {label} ({fmt_bytes(r.plan.touch_bytes)})", [key], touch)
        if got is not None:
            r.m[key], pool_stats = got
            if huge:
                r.pool = pool_stats


def touch_points(f: Figures) -> list[tuple[str, float]]:
    """(label, GB/s) of each first-touch figure measured."""
    return [(label, f.num(key)) for key, _, _, label in TOUCH if f.num(key) is not None]


def _report_first_touch(f: Figures, gpu=None) -> list:
    points = touch_points(f)
    if not points:
        return []
    return [Row(f"first touch ({f.size('first_touch_bytes')})",
                ", ".join(f"{label} {fmt_gbps(v)}" for label, v in points))]


# ---- pinned bandwidth -----------------------------------------------------------------


def _run_pinned(r, number: int) -> None:
    for dev in r.devices:
        key = str(dev)
        n = r.fit(r.plan.copy_bytes)
        got = r.attempt(number, f"pinned bandwidth, GPU {dev} ({fmt_bytes(n)})", list(PINNED.keys),
                        measure.pinned_gbps, dev, n, r.plan.reps)
        if got is None:
            continue
        r.m["copy_bytes"] = n
        for d, _ in DIRECTIONS:
            r.m.setdefault(f"pinned_{d}_gbps", {})[key] = got[d]
        link = Figures(r.report).link(key)
        if link:
            for d, _ in DIRECTIONS:
                r.m.setdefault(f"pinned_{d}_share_of_link", {})[key] = got[d] / link


def _report_pinned(f: Figures, gpu: str) -> list:
    rows, link = [], f.link(gpu)
    for d, direction in DIRECTIONS:
        v = f.per_gpu(f"pinned_{d}_gbps", gpu)
        if v is not None:
            rows.append(Row(f"pinned {direction} ({f.size('copy_bytes')})", join(fmt_gbps(v), link_share(v, link))))
    return rows


# ---- all GPUs at once -------------------------------------------------------------------


def _run_all_gpus(r, number: int) -> None:
    if len(r.devices) < 2:
        return  # one GPU: the pinned step already says it all
    n = r.fit(r.plan.copy_bytes)
    got = r.attempt(number, f"pinned bandwidth, all {len(r.devices)} GPUs at once ({fmt_bytes(n)} each)",
                    list(ALL_GPUS.keys), measure.aggregate_pinned_gbps, list(r.devices), n, r.plan.reps)
    for d, _ in DIRECTIONS:
        if got:
            r.m[f"pinned_{d}_gbps_all_gpus"] = got[d]


def _report_all_gpus(f: Figures, gpu=None) -> list:
    rows = []
    for d, direction in DIRECTIONS:
        total = number(f.m.get(f"pinned_{d}_gbps_all_gpus"))
        alone = [number(v) for v in (f.m.get(f"pinned_{d}_gbps") or {}).values()]
        alone = [v for v in alone if v is not None]
        if total is None:
            continue
        text = fmt_gbps(total)
        if alone:
            text = join(text, f"{total / sum(alone):.0%} of the {len(alone)} GPUs' {fmt_gbps(sum(alone))} alone")
        rows.append(Row(f"pinned {direction}, all GPUs at once", text))
    return rows


# ---- pageable copies ------------------------------------------------------------------


def _run_pageable(r, number: int) -> None:
    for dev in r.devices:
        n = r.fit(r.plan.copy_bytes)
        got = r.attempt(number, f"pageable copies, ferry vs CUDA, GPU {dev} ({fmt_bytes(n)})",
                        list(PAGEABLE.keys), measure.pageable_gbps, dev, n, r.plan.reps)
        for name, value in (got or {}).items():
            d, who = name.split("_")
            r.m.setdefault(f"pageable_{d}_gbps_{who}", {})[str(dev)] = value
        if got:
            r.m["copy_bytes"] = n


def _report_pageable(f: Figures, gpu: str) -> list:
    rows, link = [], f.link(gpu)
    for d, direction in DIRECTIONS:
        ours, theirs = f.per_gpu(f"pageable_{d}_gbps_ferry", gpu), f.per_gpu(f"pageable_{d}_gbps_cuda", gpu)
        if ours is None and theirs is None:
            continue
        rows.append(Row(f"pageable {direction} ({f.size('copy_bytes')})",
                        join(versus(ours, theirs, fmt_gbps), link_share(ours, link) if ours is not None else "")))
    return rows


# ---- pinned allocation ----------------------------------------------------------------


def _run_alloc(r, number: int) -> None:
    dev, n = r.devices[0], r.fit(r.plan.alloc_bytes)
    got = r.attempt(number, f"pinned allocation, ferry pool vs cudaHostAlloc, GPU {dev} ({fmt_bytes(n)})",
                    list(ALLOC.keys), measure.pinned_alloc_seconds, dev, n)
    if got is not None:
        seconds, r.pool = got
        r.m["pinned_alloc_seconds_cuda"], r.m["pinned_alloc_seconds_ferry"] = seconds["cuda"], seconds["ferry"]
        r.m["pinned_alloc_bytes"] = n


def _report_alloc(f: Figures, gpu=None) -> list:
    ours, theirs = f.num("pinned_alloc_seconds_ferry"), f.num("pinned_alloc_seconds_cuda")
    if ours is None and theirs is None:
        return []
    return [Row(f"pinned {f.size('pinned_alloc_bytes')} ready to use",
                versus(ours, theirs, fmt_seconds, "ferry pool", "cudaHostAlloc", lower_is_better=True))]


# ---- small-copy latency ---------------------------------------------------------------


def _run_latency(r, number: int) -> None:
    dev = r.devices[0]
    got = r.attempt(number, f"small-copy latency, channel vs cudaMemcpy, GPU {dev} (4 B)", list(LATENCY.keys),
                    measure.small_copy_us, dev, r.plan.latency_iterations)
    for name, value in (got or {}).items():
        who, d = name.split("_")
        r.m[f"small_copy_us_{who}_{d}"] = value


def _report_latency(f: Figures, gpu=None) -> list:
    rows = []
    for d, direction in DIRECTIONS:
        ours, theirs = f.num(f"small_copy_us_channel_{d}"), f.num(f"small_copy_us_cuda_{d}")
        if ours is not None or theirs is not None:
            rows.append(Row(f"4-byte copy {direction}",
                            versus(ours, theirs, fmt_us, "channel", "cudaMemcpy", lower_is_better=True)))
    return rows


# ---- registration by page size --------------------------------------------------------

REGISTER = (("4k", "4 KiB pages"), ("thp", "THP"), ("hugetlb", "hugetlb 2 MiB"))


def _run_registration(r, number: int) -> None:
    dev, n = r.devices[0], r.fit(r.plan.register_bytes)
    free_hugetlb = measure.hugetlb_free_bytes(r.report.get("host") or {})
    for kind, _ in REGISTER:
        what = f"registration rate, {kind} pages, GPU {dev} ({fmt_bytes(n)})"
        if kind == "hugetlb" and free_hugetlb < n:
            page = measure.HUGE_PAGE
            r.skip(number, what, ["register_gbps_hugetlb"],
                   f"{free_hugetlb // page} free 2 MiB hugetlb pages, {n // page} needed")
            continue
        got = r.attempt(number, what, [f"register_gbps_{kind}"], measure.register_gbps, dev, n, kind)
        if got is not None:
            r.m[f"register_gbps_{kind}"] = got
            r.m["register_bytes"] = n


def _report_registration(f: Figures, gpu=None) -> list:
    base, rates = f.num("register_gbps_4k"), []
    for kind, label in REGISTER:
        v = f.num(f"register_gbps_{kind}")
        if v is not None:
            rates.append(f"{label} {fmt_gbps(v)}" + (f" ({fmt_ratio(v / base)})" if base and kind != "4k" else ""))
    return [Row(f"cudaHostRegister rate ({f.size('register_bytes')})", ", ".join(rates))] if rates else []


# ---- bandwidth by size (--full) -------------------------------------------------------

BY_SIZE_COLUMNS = (
    ("pinned_h2d_gbps", "pinned h2d"), ("pinned_d2h_gbps", "pinned d2h"),
    ("pageable_h2d_gbps_ferry", "pageable h2d ferry"), ("pageable_h2d_gbps_cuda", "pageable h2d CUDA"),
    ("pageable_d2h_gbps_ferry", "pageable d2h ferry"), ("pageable_d2h_gbps_cuda", "pageable d2h CUDA"),
)


def _run_by_size(r, number: int) -> None:
    for dev in r.devices:
        rows = r.m.setdefault("bandwidth_by_size", {}).setdefault(str(dev), [])
        for size in r.plan.by_size:
            def one(size=size):
                size = r.fit(size)
                row = {"nbytes": size}
                row.update({f"pinned_{d}_gbps": v for d, v in measure.pinned_gbps(dev, size, r.plan.reps).items()})
                for name, v in measure.pageable_gbps(dev, size, r.plan.reps).items():
                    d, who = name.split("_")
                    row[f"pageable_{d}_gbps_{who}"] = v
                return row

            row = r.attempt(number, f"bandwidth by size, GPU {dev} ({fmt_bytes(size)})", ["bandwidth_by_size"], one)
            if row is not None:
                rows.append(row)


def by_size_rows(f: Figures, gpu: str) -> list[dict]:
    """The GPU's bandwidth-by-size rows that have a size, smallest first."""
    rows = f.m.get("bandwidth_by_size")
    rows = rows.get(gpu) if isinstance(rows, dict) else None
    rows = [r for r in rows or [] if isinstance(r, dict) and number(r.get("nbytes"))]
    return sorted(rows, key=lambda r: r["nbytes"])


def _report_by_size(f: Figures, gpu: str) -> list:
    rows = by_size_rows(f, gpu)
    if not rows:
        return []
    cells = []
    for r in rows:
        values = Figures({"measurements": r})
        cells.append((fmt_bytes(r["nbytes"]),
                      *(f"{v:.1f}" if (v := values.num(k)) is not None else "" for k, _ in BY_SIZE_COLUMNS)))
    table = Table(("size", *(label for _, label in BY_SIZE_COLUMNS)), tuple(cells), numeric=True)
    return [Block(f"Bandwidth by size, GPU {gpu} (GB/s)", table=table)]


# ---- NIXL --------------------------------------------------------------------------------


def _run_nixl(r, number: int) -> None:
    from . import nixl_check

    quick = r.mode == "quick"
    what = "NIXL: installation" + ("" if quick else ", UCX transports, pool->GPU self-test")
    got = r.attempt(number, what, ["nixl"], nixl_check.check, quick, len(r.devices))
    if got is not None:
        r.m["nixl"] = got


def _report_nixl(f: Figures, gpu=None) -> list:
    n = f.m.get("nixl")
    if not isinstance(n, dict):
        return []
    if not n.get("installed"):
        return [Block("NIXL", (Row("installed", "no", (str(n.get("reason") or ""),)),))]
    settings = n.get("settings") if isinstance(n.get("settings"), dict) else {}
    env = settings.get("effective_env") if isinstance(settings.get("effective_env"), dict) else {}
    transports = n.get("transports") if isinstance(n.get("transports"), dict) else {}
    rows = [Row("installed", f"{n.get('module')} {n.get('version') or ''} at {n.get('location')}"),
            Row("UCX", str(n.get("ucx_version") or "unknown")),
            Row("transports that start",
                ", ".join(f"{t} ({'/'.join(d)})" for t, d in sorted(transports.items()))
                or str(n.get("probe_error") or "unknown"))]
    user = settings.get("user") if isinstance(settings.get("user"), dict) else {}
    if n.get("probe_error") and not transports:
        rows.append(Row("ferry.nixl.agent picks", "decided when an agent is made (UCX was not probed)",
                        tuple(f"the user's {k}={v} wins" for k, v in sorted(user.items()))))
    else:
        rows.append(Row("ferry.nixl.agent picks",
                        f"UCX_TLS={env.get('UCX_TLS', '(UCX default)')}, error handling "
                        f"{settings.get('error_handling', 'peer')}, RMA pipeline "
                        f"{env.get('UCX_RMA_PPLN_ENABLE', '(UCX default: n)')}"
                        + (f", rendezvous fragments {env['UCX_RNDV_FRAG_SIZE']}" if env.get("UCX_RNDV_FRAG_SIZE")
                           else ""),
                        tuple(f"the user's {k}={v} wins" for k, v in sorted(user.items()))))
    t = n.get("self_test") if isinstance(n.get("self_test"), dict) else {}
    if t.get("error"):
        rows.append(Row("self-test", f"not run: {t['error']}"))
    elif t:
        verified = "verified" if t.get("verified") else "NOT VERIFIED"
        gbps = lambda v: fmt_gbps(v) if number(v) is not None else "-"  # noqa: E731
        rows.append(Row(f"self-test ({t.get('memory')}, {fmt_bytes(t.get('bytes') or 0)} in "
                        f"{fmt_bytes(t.get('block_bytes') or 0)} blocks)",
                        f"WRITE {gbps(t.get('write_gbps'))}, READ {gbps(t.get('read_gbps'))}, {verified}"))
    return [Block("NIXL", tuple(rows))]


# ---- the table --------------------------------------------------------------------------

MEMCPY = Step(
    "host memcpy bandwidth by threads", ("memcpy_gbps_by_threads",),
    'memcpy_gbps_by_threads: {"threads": GB/s} of a host memcpy split over that many threads; memcpy_bytes',
    "host", _run_memcpy, _report_memcpy)
TOUCH_STEP = Step(
    "first touch", tuple(key for key, *_ in TOUCH),
    "first_touch_4k_1thread_gbps, first_touch_4k_gbps, first_touch_thp_gbps: GB/s of the first touch of a "
    "fresh pool chunk (4 KiB pages on 1 and all threads, THP on all threads); first_touch_bytes",
    "host", _run_first_touch, _report_first_touch)
PINNED = Step(
    "pinned bandwidth", ("pinned_h2d_gbps", "pinned_d2h_gbps"),
    "pinned_{h2d,d2h}_gbps: cudaMemcpyAsync from cudaHostAlloc memory, GB/s (per GPU); "
    "pinned_{h2d,d2h}_share_of_link: the same as a fraction of the link limit (per GPU); copy_bytes",
    "gpu", _run_pinned, _report_pinned)
ALL_GPUS = Step(
    "pinned bandwidth, all GPUs at once", ("pinned_h2d_gbps_all_gpus", "pinned_d2h_gbps_all_gpus"),
    "pinned_{h2d,d2h}_gbps_all_gpus: cudaMemcpyAsync from cudaHostAlloc memory to every GPU at once, one "
    "thread each, total GB/s (two GPUs or more)",
    "first-gpu", _run_all_gpus, _report_all_gpus)
PAGEABLE = Step(
    "pageable copies, ferry vs CUDA", tuple(f"pageable_{d}_gbps_{w}" for d, _ in DIRECTIONS for w in ("cuda", "ferry")),
    "pageable_{h2d,d2h}_gbps_{cuda,ferry}: cudaMemcpy vs ferry's copy of the same fresh 4 KiB-page buffer, "
    "GB/s (per GPU); copy_bytes",
    "gpu", _run_pageable, _report_pageable)
ALLOC = Step(
    "pinned allocation, ferry pool vs cudaHostAlloc", ("pinned_alloc_seconds_cuda", "pinned_alloc_seconds_ferry"),
    "pinned_alloc_seconds_{cuda,ferry}: seconds until N bytes are pinned and usable, cudaHostAlloc(N) vs "
    "PinnedPool(target_bytes=N) (first GPU); pinned_alloc_bytes",
    "first-gpu", _run_alloc, _report_alloc)
LATENCY = Step(
    "small-copy latency, channel vs cudaMemcpy",
    tuple(f"small_copy_us_{w}_{d}" for w in ("cuda", "channel") for d, _ in DIRECTIONS),
    "small_copy_us_{cuda,channel}_{h2d,d2h}: median microseconds of a 4-byte copy, cudaMemcpy vs ferry's "
    "channel (first GPU)",
    "first-gpu", _run_latency, _report_latency)
REGISTRATION = Step(
    "registration by page size", tuple(f"register_gbps_{k}" for k, _ in REGISTER),
    "register_gbps_{4k,thp,hugetlb}: GB/s of cudaHostRegister of a pinned pool by page backing (first GPU); "
    "register_bytes",
    "first-gpu", _run_registration, _report_registration)
BY_SIZE = Step(
    "bandwidth by size", ("bandwidth_by_size",),
    'bandwidth_by_size (--full): {"<gpu>": [{"nbytes", "pinned_h2d_gbps", "pinned_d2h_gbps", '
    '"pageable_{h2d,d2h}_gbps_{ferry,cuda}"}]}',
    "gpu", _run_by_size, _report_by_size, full_only=True)

NIXL = Step(
    "NIXL", ("nixl",),
    "nixl: {installed, module, version, location | reason, ucx_version, transports: {name: [devices]}, "
    "settings (ferry.nixl.agent's choice: env, backend_params, user, reasons, warnings), warnings: "
    "[{setting, problem, fix}], self_test: {memory, bytes, block_bytes, write_gbps, read_gbps, verified | error}} "
    "(--quick: no transports and no self-test)",
    "host", _run_nixl, _report_nixl)

STEPS: tuple[Step, ...] = (MEMCPY, TOUCH_STEP, PINNED, ALL_GPUS, PAGEABLE, ALLOC, LATENCY, REGISTRATION, BY_SIZE,
                           NIXL)
