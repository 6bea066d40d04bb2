"""`ferry doctor --html FILE`: the doctor's report as one self-contained HTML page.

build(report) gives the page; write(report, path) writes it atomically (a temporary
file beside it, then a rename) and returns the absolute path.

The page: the facts (host, CUDA, GPUs) as tables; the measurements with their units
and the ratio lines of the text report (share of the link, ferry beside CUDA), the
bandwidth-by-size table (--full), the skipped measurements with their reasons; plots;
the findings sorted by severity (id, severity, title, evidence, fix).

Self-contained: no script, and no stylesheet, image or font from anywhere else. The
plots are PNGs drawn with matplotlib's Agg canvas (no pyplot, no global backend
change) and embedded as data: URIs: bandwidth by path (with the link limit), bandwidth
by size for each path (--full), host memcpy by thread count, first-touch rates.
Every text taken from the report is escaped (html.escape).

Plotting never breaks the page: without matplotlib the page says "plots need
matplotlib (pip install matplotlib)" where the plots would be, and a plot that fails
to draw is replaced by a line saying why. A section that fails to render (a report of
an unexpected shape) is replaced the same way, so the page is always written.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import html
import io
import math
import os
import tempfile
from typing import Any, Callable, Iterable

from . import doctor, rules
from .facts import report as facts_text

TITLE = "ferry doctor report"
NEED_MATPLOTLIB = "plots need matplotlib (pip install matplotlib)"

_DIRECTIONS = (("h2d", "host->device"), ("d2h", "device->host"))
# The copy paths of the bandwidth plots: measurement key (per GPU), short label, kind.
_PATHS = (
    ("pinned_h2d_gbps", "pinned\nh2d", "pinned"),
    ("pinned_d2h_gbps", "pinned\nd2h", "pinned"),
    ("pageable_h2d_gbps_cuda", "pageable\nh2d CUDA", "cuda"),
    ("pageable_h2d_gbps_ferry", "pageable\nh2d ferry", "ferry"),
    ("pageable_d2h_gbps_cuda", "pageable\nd2h CUDA", "cuda"),
    ("pageable_d2h_gbps_ferry", "pageable\nd2h ferry", "ferry"),
)
_KIND_COLOR = {"pinned": "#4c72b0", "cuda": "#dd8452", "ferry": "#55a868"}


def _e(value: Any) -> str:
    """Text for the page: None is 'unknown', everything is escaped."""
    return html.escape("unknown" if value is None else str(value), quote=True)


def _num(value: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and the like are not figures)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _gpu_facts(report: dict) -> dict[str, dict]:
    return {str(g.get("index", i)): g for i, g in enumerate(report.get("gpus") or []) if isinstance(g, dict)}


# ---------------------------------------------------------------------------- facts


def _host_rows(host: dict) -> list[tuple[str, str, list]]:
    """(label, value, items) rows in the order of the text report's Host section."""
    T = facts_text
    virt = _dict(host.get("virtualization"))
    cpu = _dict(host.get("cpu"))
    memory = _dict(host.get("memory"))
    thp = _dict(host.get("thp"))
    iommu = _dict(host.get("iommu"))
    process = _dict(host.get("process"))
    rows: list[tuple[str, str, list]] = [
        ("kernel", T._text(host.get("kernel")), []),
        ("os", T._text(host.get("os")), []),
        ("virtualization", T._virtualization_text(virt), list(virt.get("evidence") or [])),
        ("cpu", T._text(cpu.get("model")), []),
        ("logical CPUs", f"{T._text(cpu.get('logical_cpus'))} online ({cpu.get('online') or 'unknown'})", []),
        ("memory", f"{T.format_bytes(memory.get('total_bytes'))} total, "
                   f"{T.format_bytes(memory.get('available_bytes'))} available", []),
    ]
    nodes = host.get("numa_nodes")
    if not nodes:
        rows.append(("NUMA nodes", "unknown (no /sys/devices/system/node)", []))
    for node in nodes or []:
        node = _dict(node)
        rows.append((f"NUMA node {node.get('id')}",
                     f"CPUs {node.get('cpus') or 'none'}, {T.format_bytes(node.get('mem_total_bytes'))}", []))
    rows.append(("THP", f"enabled={T._text(thp.get('enabled'))} defrag={T._text(thp.get('defrag'))} "
                        f"shmem_enabled={T._text(thp.get('shmem_enabled'))}", []))
    rows.append(("THP PMD size", T.format_bytes(thp.get("pmd_size_bytes")), []))
    sizes = [_dict(s) for s in thp.get("sizes") or [] if _dict(s).get("enabled") not in (None, "never")]
    if sizes:
        rows.append(("mTHP sizes", ", ".join(f"{T.format_bytes(s.get('page_size_bytes'))}: {s.get('enabled')}"
                                             for s in sizes) + " (other sizes never)", []))
    pools = host.get("hugetlb")
    if not pools:
        rows.append(("hugetlb", "no pools (no /sys/kernel/mm/hugepages)", []))
    for pool in pools or []:
        pool = _dict(pool)
        rows.append((f"hugetlb {T.format_bytes(pool.get('page_size_bytes'))}",
                     f"{T._text(pool.get('total'))} pages ({T._text(pool.get('free'))} free, "
                     f"{T._text(pool.get('reserved'))} reserved, {T._text(pool.get('surplus'))} surplus)", []))
    memlock = host.get("memlock_bytes")
    rows.append(("memlock limit", "unlimited" if memlock is None else T.format_bytes(memlock), []))
    rows.append(("IOMMU", f"{'present' if iommu.get('present') else 'not present'}, mode "
                          f"{T._text(iommu.get('mode'))}, {T._text(iommu.get('groups'))} groups",
                 list(iommu.get("evidence") or [])))
    rows.append(("process CPUs", process.get("cpus_allowed") or "unknown", []))
    rows.append(("process NUMA mems", T._text(process.get("mems_allowed")), []))
    rows.append(("kernel modules", T._modules_text(_dict(host.get("kernel_modules"))), []))
    rows.append(("GDRCopy", T._gdrcopy_text(_dict(host.get("gdrcopy"))), []))
    if host.get("notes"):
        rows.append(("notes", "", list(host.get("notes") or [])))
    return rows


def _kv_table(rows: Iterable[tuple[str, str, list]], cls: str = "kv") -> str:
    out = [f'<table class="{cls}">']
    for label, value, items in rows:
        cell = _e(value) if value != "" or not items else ""
        if items:
            cell += "<ul>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"
        out.append(f"<tr><th>{_e(label)}</th><td>{cell}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _gpu_table(gpus: list[dict]) -> str:
    T = facts_text
    labels = ("name", "compute capability", "memory", "PCI bus id", "PCIe link now", "PCIe link max",
              "BAR1", "NUMA node", "CPU affinity", "notes")

    def cells(gpu: dict) -> list[str]:
        pcie = _dict(gpu.get("pcie"))
        source = f" (source: {pcie['source']})" if pcie.get("source") else ""
        bar1_source = f" (source: {gpu['bar1_source']})" if gpu.get("bar1_source") else ""
        numa = gpu.get("numa_node")
        values = [
            T._text(gpu.get("name")),
            T._text(gpu.get("compute_capability")),
            T.format_bytes(gpu.get("memory_bytes")),
            T._text(gpu.get("pci_bus_id")),
            T._link_text(pcie.get("gen"), pcie.get("width"), _num(gpu.get("link_gbps"))) + source,
            T._link_text(pcie.get("max_gen"), pcie.get("max_width"), _num(gpu.get("max_link_gbps"))),
            T.format_bytes(gpu.get("bar1_bytes")) + bar1_source,
            "none reported" if numa is None else str(numa),
            T._text(gpu.get("cpu_affinity")),
        ]
        out = [_e(v) for v in values]
        notes = gpu.get("notes") or []
        out.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else "")
        return out

    columns = [cells(_dict(g)) for g in gpus]
    head = "".join(f"<th>GPU {_e(_dict(g).get('index', i))}</th>" for i, g in enumerate(gpus))
    out = ['<table class="grid">', f"<tr><th></th>{head}</tr>"]
    for r, label in enumerate(labels):
        out.append(f"<tr><th>{_e(label)}</th>" + "".join(f"<td>{col[r]}</td>" for col in columns) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _facts_section(report: dict) -> str:
    out = ['<h2 id="facts">Facts</h2>', "<h3>Host</h3>", _kv_table(_host_rows(_dict(report.get("host"))))]
    cuda = report.get("cuda")
    out.append("<h3>CUDA</h3>")
    if not isinstance(cuda, dict):
        out.append("<p>no CUDA driver found: GPU facts skipped</p>")
    else:
        out.append(_kv_table([("driver", facts_text._text(cuda.get("driver_version")), []),
                              ("runtime", facts_text._text(cuda.get("runtime_version")), []),
                              ("devices", facts_text._text(cuda.get("device_count")), [])]))
    out.append("<h3>GPUs</h3>")
    gpus = [g for g in report.get("gpus") or [] if isinstance(g, dict)]
    if not isinstance(cuda, dict):
        out.append("<p>skipped (no CUDA driver)</p>")
    elif not gpus:
        out.append("<p>no CUDA device</p>")
    else:
        out.append(_gpu_table(gpus))
    if report.get("notes"):
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report["notes"]) + "</ul>")
    return "\n".join(out)


# ---------------------------------------------------------------------- measurements


def _measurement_blocks(report: dict) -> list[tuple[str, list[tuple[str, str]]]]:
    """(heading, [(what, value)]) blocks with the text report's figures and ratio lines."""
    m = _dict(report.get("measurements"))
    gpus = _gpu_facts(report)

    def sized(key: str) -> str:
        return doctor._size(m[key]) if _num(m.get(key)) else "?"

    def gpu_value(name: str, key: str) -> float | None:
        return _num(_dict(m.get(name)).get(key))

    blocks: list[tuple[str, list[tuple[str, str]]]] = []
    keys = sorted({k for name in ("pinned_h2d_gbps", "pageable_h2d_gbps_ferry", "pageable_h2d_gbps_cuda")
                   for k in _dict(m.get(name))}, key=lambda k: (len(k), k))
    copy = sized("copy_bytes")
    for key in keys:
        gpu = gpus.get(key, {})
        pinned = {d: gpu_value(f"pinned_{d}_gbps", key) for d, _ in _DIRECTIONS}
        link = doctor._link_limit(gpu, [v for v in pinned.values() if v is not None])
        heading = (f"GPU {key}" + (f" ({gpu['name']})" if gpu.get("name") else "")
                   + (f", link {doctor.fmt_gbps(link)} per direction" if link else ", link limit unknown"))
        rows = []
        for d, direction in _DIRECTIONS:
            if pinned[d] is not None:
                rows.append((f"pinned {direction} ({copy})",
                             doctor._join(doctor.fmt_gbps(pinned[d]), doctor.link_share(pinned[d], link))))
        for d, direction in _DIRECTIONS:
            ours, theirs = gpu_value(f"pageable_{d}_gbps_ferry", key), gpu_value(f"pageable_{d}_gbps_cuda", key)
            if ours is None and theirs is None:
                continue
            rows.append((f"pageable {direction} ({copy})",
                         doctor._join(doctor.versus(ours, theirs, doctor.fmt_gbps),
                                      doctor.link_share(ours, link) if ours is not None else "")))
        blocks.append((heading, rows))

    rows = []
    ferry_s, cuda_s = _num(m.get("pinned_alloc_seconds_ferry")), _num(m.get("pinned_alloc_seconds_cuda"))
    if ferry_s is not None or cuda_s is not None:
        rows.append((f"pinned {sized('pinned_alloc_bytes')} ready to use",
                     doctor.versus(ferry_s, cuda_s, doctor.fmt_seconds, "ferry pool", "cudaHostAlloc",
                                   lower_is_better=True)))
    for d, direction in _DIRECTIONS:
        ours, theirs = _num(m.get(f"small_copy_us_channel_{d}")), _num(m.get(f"small_copy_us_cuda_{d}"))
        if ours is not None or theirs is not None:
            rows.append((f"4-byte copy {direction}",
                         doctor.versus(ours, theirs, doctor.fmt_us, "channel", "cudaMemcpy", lower_is_better=True)))
    base = _num(m.get("register_gbps_4k"))
    reg = []
    for kind, label in (("4k", "4 KiB pages"), ("thp", "THP"), ("hugetlb", "hugetlb 2 MiB")):
        v = _num(m.get(f"register_gbps_{kind}"))
        if v is not None:
            reg.append(f"{label} {doctor.fmt_gbps(v)}" + (f" ({v / base:.1f}x)" if base and kind != "4k" else ""))
    if reg:
        rows.append((f"cudaHostRegister rate ({sized('register_bytes')})", ", ".join(reg)))
    if rows:
        blocks.append(("Pinned allocation, small copies and registration (first GPU)", rows))

    rows = []
    for t, v in _memcpy_points(m):
        rows.append((f"host memcpy ({sized('memcpy_bytes')}), {t} thread{'' if t == 1 else 's'}",
                     doctor.fmt_gbps(v)))
    for label, v in _touch_points(m):
        rows.append((f"first touch ({sized('first_touch_bytes')}), {label}", doctor.fmt_gbps(v)))
    if rows:
        blocks.append(("Host", rows))
    return blocks


def _memcpy_points(m: dict) -> list[tuple[int, float]]:
    points = []
    for t, v in _dict(m.get("memcpy_gbps_by_threads")).items():
        with contextlib.suppress(ValueError):
            if _num(v) is not None:
                points.append((int(t), float(v)))
    return sorted(points)


def _touch_points(m: dict) -> list[tuple[str, float]]:
    labels = (("first_touch_4k_1thread_gbps", "4 KiB pages, 1 thread"),
              ("first_touch_4k_gbps", "4 KiB pages, all threads"),
              ("first_touch_thp_gbps", "THP, all threads"))
    return [(label, _num(m.get(k))) for k, label in labels if _num(m.get(k)) is not None]


_BY_SIZE_COLUMNS = (
    ("pinned_h2d_gbps", "pinned h2d"), ("pinned_d2h_gbps", "pinned d2h"),
    ("pageable_h2d_gbps_ferry", "pageable h2d ferry"), ("pageable_h2d_gbps_cuda", "pageable h2d CUDA"),
    ("pageable_d2h_gbps_ferry", "pageable d2h ferry"), ("pageable_d2h_gbps_cuda", "pageable d2h CUDA"),
)


def _by_size_tables(report: dict) -> str:
    by_size = _dict(_dict(report.get("measurements")).get("bandwidth_by_size"))
    out = []
    for key in sorted(by_size, key=lambda k: (len(k), k)):
        rows = [_dict(r) for r in by_size[key] or []]
        if not rows:
            continue
        out.append(f"<h4>Bandwidth by size, GPU {_e(key)} (GB/s)</h4>")
        out.append('<table class="grid num"><tr><th>size</th>'
                   + "".join(f"<th>{_e(label)}</th>" for _, label in _BY_SIZE_COLUMNS) + "</tr>")
        for r in rows:
            size = doctor._size(r["nbytes"]) if _num(r.get("nbytes")) else "?"
            cells = "".join(f"<td>{_e(f'{v:.1f}') if (v := _num(r.get(k))) is not None else ''}</td>"
                            for k, _ in _BY_SIZE_COLUMNS)
            out.append(f"<tr><th>{_e(size)}</th>{cells}</tr>")
        out.append("</table>")
    return "\n".join(out)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flatten(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")]
    return [(prefix, value)]


def _measurements_section(report: dict) -> str:
    elapsed = _num(report.get("elapsed_seconds")) or 0.0
    out = ['<h2 id="measurements">Measurements</h2>',
           f"<p>{_e(report.get('mode', 'default'))} run, {_e(f'{elapsed:.1f}')} s; "
           "GB/s = 10<sup>9</sup> bytes/s per direction</p>"]
    blocks = _measurement_blocks(report)
    if not blocks:
        out.append("<p>(none)</p>")
    for heading, rows in blocks:
        out.append(f"<h3>{_e(heading)}</h3>")
        out.append(_kv_table([(what, value, []) for what, value in rows]))
    out.append(_by_size_tables(report))
    pool = _flatten(_dict(report.get("pool")))
    if pool:
        out.append("<details><summary>Statistics of the pool the doctor used</summary>")
        out.append(_kv_table([(k, str(v), []) for k, v in pool]))
        out.append("</details>")
    return "\n".join(out)


def _skipped_section(report: dict) -> str:
    skipped = [_dict(s) for s in report.get("skipped") or []]
    out = ['<h2 id="skipped">Skipped measurements</h2>']
    if not skipped:
        out.append("<p>none: every measurement of this mode ran</p>")
        return "\n".join(out)
    out.append('<table class="grid"><tr><th>measurement</th><th>why</th><th>keys</th></tr>')
    for s in skipped:
        keys = ", ".join(str(k) for k in s.get("keys") or [])
        out.append(f"<tr><td>{_e(s.get('what'))}</td><td>{_e(s.get('why'))}</td><td><code>{_e(keys)}</code></td></tr>")
    out.append("</table>")
    return "\n".join(out)


# -------------------------------------------------------------------------- findings


def sorted_findings(report: dict) -> list[dict]:
    """The report's findings as dicts, sorted by severity (critical, warning, info) then id."""
    rank = {name: i for i, name in enumerate(rules.SEVERITIES)}
    findings = [_dict(f) for f in report.get("findings") or []]
    return sorted(findings, key=lambda f: (rank.get(f.get("severity"), len(rank)), str(f.get("id")),
                                           str(f.get("title"))))


def _sev_class(severity: str) -> str:
    return severity if severity in rules.SEVERITIES else "unknown"


def _anchors(findings: list[dict]) -> list[str]:
    """An element id for each finding: 'finding-<id>', made safe and unique."""
    out: list[str] = []
    for f in findings:
        base = "finding-" + "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in str(f.get("id")))
        anchor, n = base, 1
        while anchor in out:
            n += 1
            anchor = f"{base}-{n}"
        out.append(anchor)
    return out


def _findings_section(report: dict) -> str:
    findings = sorted_findings(report)
    anchors = _anchors(findings)
    out = ['<h2 id="findings">Findings</h2>']
    if not findings:
        out.append("<p>No findings: nothing in the facts or measurements needs fixing.</p>")
        return "\n".join(out)
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in rules.SEVERITIES}
    out.append(f"<p>{len(findings)} finding{'s' if len(findings) != 1 else ''}: "
               + ", ".join(f"{counts[s]} {s}" for s in rules.SEVERITIES) + "</p>")
    out.append('<table class="grid"><tr><th>severity</th><th>id</th><th>title</th></tr>')
    for f, anchor in zip(findings, anchors):
        sev = str(f.get("severity"))
        out.append(f'<tr><td><span class="sev sev-{_sev_class(sev)}">{_e(sev)}</span></td>'
                   f'<td><a href="#{anchor}"><code>{_e(f.get("id"))}</code></a></td>'
                   f"<td>{_e(f.get('title'))}</td></tr>")
    out.append("</table>")
    for f, anchor in zip(findings, anchors):
        sev = str(f.get("severity"))
        out.append(f'<div class="finding sev-border-{_sev_class(sev)}" id="{anchor}">')
        out.append(f'<h3><span class="sev sev-{_sev_class(sev)}">{_e(sev)}</span> <code>{_e(f.get("id"))}</code> '
                   f"{_e(f.get('title'))}</h3>")
        evidence = f.get("evidence") or []
        if evidence:
            out.append("<ul>" + "".join(f"<li>{_e(item)}</li>" for item in evidence) + "</ul>")
        if f.get("fix"):
            out.append(f'<p class="fix"><b>fix</b> <code>{_e(f.get("fix"))}</code></p>')
        out.append("</div>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots


def _mpl(text: Any) -> str:
    """Text for a matplotlib label: '$' would start mathtext."""
    return str(text).replace("$", r"\$")


def _link_limits(report: dict, keys: list[str]) -> dict[float, list[str]]:
    """{link limit GB/s: [gpu keys]} for the GPUs in keys whose limit is known."""
    m, gpus = _dict(report.get("measurements")), _gpu_facts(report)
    limits: dict[float, list[str]] = {}
    for key in keys:
        pinned = [v for d, _ in _DIRECTIONS if (v := _num(_dict(m.get(f"pinned_{d}_gbps")).get(key))) is not None]
        link = _num(doctor._link_limit(gpus.get(key, {}), pinned))
        if link:
            limits.setdefault(link, []).append(key)
    return limits


def _gpu_label(report: dict, key: str) -> str:
    name = _gpu_facts(report).get(key, {}).get("name")
    return f"GPU {key}" + (f" ({name})" if name else "")


def _plot_by_path(report: dict, Figure) -> Any:
    m = _dict(report.get("measurements"))
    paths = [p for p in _PATHS if any(_num(v) is not None for v in _dict(m.get(p[0])).values())]
    keys = sorted({k for p in paths for k in _dict(m.get(p[0]))}, key=lambda k: (len(k), k))
    fig = Figure(figsize=(8.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(keys)
    top = 0.0
    for g, key in enumerate(keys):
        values = [_num(_dict(m.get(p[0])).get(key)) for p in paths]
        xs = [i - 0.4 + width * (g + 0.5) for i in range(len(paths))]
        heights = [v or 0.0 for v in values]
        top = max([top, *heights])
        if len(keys) == 1:
            bars = ax.bar(xs, heights, width * 0.9, color=[_KIND_COLOR[p[2]] for p in paths])
        else:
            bars = ax.bar(xs, heights, width * 0.9, label=_mpl(_gpu_label(report, key)))
        if len(keys) <= 4:
            ax.bar_label(bars, labels=[f"{v:.1f}" if v is not None else "n/a" for v in values], fontsize=8,
                         padding=2)
    for link, gpu_keys in sorted(_link_limits(report, keys).items()):
        which = "" if len(keys) == 1 else f" (GPU {', '.join(gpu_keys)})"
        ax.axhline(link, color="#c44e52", linestyle="--", linewidth=1.2,
                   label=f"link limit {link:.1f} GB/s{which}")
        top = max(top, link)
    ax.set_xticks(range(len(paths)), [p[1] for p in paths])
    ax.set_ylabel("GB/s (10^9 bytes/s)")
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_title(f"Bandwidth by path ({_mpl(doctor._size(m['copy_bytes']) if _num(m.get('copy_bytes')) else '?')}"
                 " copies)")
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not on them
    return fig


def _plot_by_size(report: dict, Figure) -> Any:
    by_size = _dict(_dict(report.get("measurements")).get("bandwidth_by_size"))
    keys = [k for k in sorted(by_size, key=lambda k: (len(k), k)) if by_size[k]]
    ncols = 1 if len(keys) == 1 else 2
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(8.5 if ncols == 1 else 11, 3.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    limits = _link_limits(report, keys)
    for ax, key in zip(axes, keys):
        rows = sorted((_dict(r) for r in by_size[key] if _num(_dict(r).get("nbytes"))), key=lambda r: r["nbytes"])
        sizes = [r["nbytes"] for r in rows]
        for name, label, kind in _PATHS:
            points = [(s, v) for s, r in zip(sizes, rows) if (v := _num(r.get(name))) is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=_KIND_COLOR[kind],
                        linestyle="-" if "h2d" in name else "--", label=label.replace("\n", " "))
        for link, gpu_keys in limits.items():
            if key in gpu_keys:
                ax.axhline(link, color="#c44e52", linestyle=":", linewidth=1.2, label=f"link limit {link:.1f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [doctor._size(s) for s in sizes])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("copy size")
        ax.set_ylabel("GB/s")
        ax.set_title(_mpl(_gpu_label(report, key)))
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    try:  # one legend below the plots, not on the lines (matplotlib >= 3.7)
        fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8)
    except (ValueError, TypeError):
        axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Bandwidth by size for each path (solid: host->device, dashed: device->host)")
    return fig


def _plot_memcpy(report: dict, Figure) -> Any:
    m = _dict(report.get("measurements"))
    points = _memcpy_points(m)
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar([str(t) for t, _ in points], [v for _, v in points], color="#8172b3")
    ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    ax.set_xlabel("threads")
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, max(v for _, v in points) * 1.18)
    size = doctor._size(m["memcpy_bytes"]) if _num(m.get("memcpy_bytes")) else "?"
    ax.set_title(f"Host memcpy bandwidth by thread count ({size})")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_first_touch(report: dict, Figure) -> Any:
    m = _dict(report.get("measurements"))
    points = _touch_points(m)
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh([p[0] for p in points][::-1], [p[1] for p in points][::-1], color="#937860")
    ax.bar_label(bars, fmt="%.2f GB/s", fontsize=8, padding=3)
    ax.set_xlabel("GB/s")
    ax.set_xlim(0, max(v for _, v in points) * 1.3)
    size = doctor._size(m["first_touch_bytes"]) if _num(m.get("first_touch_bytes")) else "?"
    ax.set_title(f"First-touch rate ({size})")
    ax.grid(axis="x", alpha=0.3)
    return fig


def plans(report: dict) -> list[tuple[str, Callable]]:
    """(title, draw) for each plot whose measurements exist; draw(report, Figure) -> Figure."""
    m = _dict(report.get("measurements"))
    out: list[tuple[str, Callable]] = []
    if any(_num(v) is not None for p in _PATHS for v in _dict(m.get(p[0])).values()):
        out.append(("Bandwidth by path", _plot_by_path))
    if any(_dict(m.get("bandwidth_by_size")).values()):
        out.append(("Bandwidth by size", _plot_by_size))
    if _memcpy_points(m):
        out.append(("Host memcpy by threads", _plot_memcpy))
    if _touch_points(m):
        out.append(("First-touch rates", _plot_first_touch))
    return out


def _matplotlib() -> tuple[Any, Any] | str:
    """(Figure, FigureCanvasAgg), or why plots cannot be drawn."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return NEED_MATPLOTLIB
    except Exception as e:  # a broken installation
        return f"{NEED_MATPLOTLIB}: importing it failed: {type(e).__name__}: {e}"
    return Figure, FigureCanvasAgg


def png(fig: Any, canvas_class: Any) -> bytes:
    canvas_class(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _plots_section(report: dict) -> str:
    out = ['<h2 id="plots">Plots</h2>']
    todo = plans(report)
    if not todo:
        out.append("<p>no measurements to plot</p>")
        return "\n".join(out)
    mpl = _matplotlib()
    if isinstance(mpl, str):
        out.append(f'<p class="note">{_e(mpl)}</p>')
        return "\n".join(out)
    Figure, canvas_class = mpl
    out.append('<div class="plots">')
    for title, draw in todo:
        try:
            data = base64.b64encode(png(draw(report, Figure), canvas_class)).decode("ascii")
        except Exception as e:  # one plot must never break the page
            out.append(f'<p class="note">plot "{_e(title)}" could not be drawn: {_e(type(e).__name__)}: {_e(e)}</p>')
            continue
        out.append(f'<figure><img alt="{_e(title)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{_e(title)}</figcaption></figure>")
    out.append("</div>")
    return "\n".join(out)


# ------------------------------------------------------------------------------ page


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 1.5em auto;
       max-width: 1200px; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
nav a { margin-right: 1em; } .meta { color: #555; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; vertical-align: top; text-align: left; }
table.kv th { background: #f6f6f6; white-space: nowrap; font-weight: 600; }
table.grid tr:first-child th { background: #f0f0f0; }
table.num td { text-align: right; font-variant-numeric: tabular-nums; }
td ul, .finding ul { margin: 0.2em 0; padding-left: 1.2em; }
code { font-family: "DejaVu Sans Mono", monospace; font-size: 0.92em; }
.fix code { display: block; white-space: pre-wrap; background: #f4f6f8; border: 1px solid #dde3ea;
            padding: 0.4em 0.6em; margin-top: 0.2em; }
.sev { display: inline-block; border-radius: 3px; padding: 0 0.45em; color: #fff; font-size: 0.85em;
       font-weight: 600; text-transform: uppercase; }
.sev-critical { background: #c0392b; } .sev-warning { background: #d68910; } .sev-info { background: #2e86c1; }
.finding { border-left: 5px solid #aaa; padding: 0.1em 1em 0.4em; margin: 1em 0; background: #fcfcfc; }
.sev-border-critical { border-color: #c0392b; } .sev-border-warning { border-color: #d68910; }
.sev-border-info { border-color: #2e86c1; }
.finding h3 { margin: 0.5em 0 0.3em; font-size: 1.05em; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.note { background: #fff8e1; border: 1px solid #f0d58c; padding: 0.4em 0.7em; }
"""


def _guarded(section: Callable[[dict], str], name: str, report: dict) -> str:
    """A section, or a note saying why it could not be rendered (the page is always written)."""
    try:
        return section(report)
    except Exception as e:
        return f'<h2>{_e(name)}</h2><p class="note">could not be rendered: {_e(type(e).__name__)}: {_e(e)}</p>'


def _header(report: dict, generated: str) -> str:
    versions = _dict(report.get("ferry"))
    findings = sorted_findings(report)
    counts = ", ".join(f"{sum(1 for f in findings if f.get('severity') == s)} {s}" for s in rules.SEVERITIES)
    host = _dict(report.get("host"))
    elapsed = _num(report.get("elapsed_seconds")) or 0.0
    meta = [f"ferry {versions.get('library', '?')}", f"{report.get('mode', 'default')} run, {elapsed:.1f} s",
            f"generated {generated}"]
    if host.get("kernel"):
        meta.append(f"kernel {host['kernel']}")
    return "\n".join([
        f"<h1>{_e(TITLE)}</h1>",
        f'<p class="meta">{" &middot; ".join(_e(x) for x in meta)}</p>',
        f'<p><a href="#findings">{len(findings)} finding{"s" if len(findings) != 1 else ""}</a>: {_e(counts)}; '
        f'<a href="#skipped">{len(report.get("skipped") or [])} measurements skipped</a></p>',
        '<nav><a href="#facts">Facts</a><a href="#measurements">Measurements</a><a href="#skipped">Skipped</a>'
        '<a href="#plots">Plots</a><a href="#findings">Findings</a></nav>',
    ])


def build(report: dict, generated: str | None = None) -> str:
    """The whole page for a doctor report dict (doctor.run()'s result, or its --json)."""
    report = _dict(report)
    if generated is None:
        generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    sections = [
        _guarded(lambda r: _header(r, generated), TITLE, report),
        _guarded(_facts_section, "Facts", report),
        _guarded(_measurements_section, "Measurements", report),
        _guarded(_skipped_section, "Skipped measurements", report),
        _guarded(_plots_section, "Plots", report),
        _guarded(_findings_section, "Findings", report),
    ]
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(TITLE)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        *sections,
        "</body>",
        "</html>",
        "",
    ])


# ----------------------------------------------------------------------------- write


def unwritable(path: str | os.PathLike) -> str | None:
    """Why the page could not be written to path (checked before the doctor measures), or None."""
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        return f"{path} is a directory"
    if not os.path.isdir(directory):
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable"
    return None


def _mode_for(path: str) -> int:
    with contextlib.suppress(OSError):
        return os.stat(path).st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write(report: dict, path: str | os.PathLike) -> str:
    """Writes build(report) to path atomically (a temporary file in the same folder, then
    a rename: a reader never sees half a page); returns the absolute path."""
    page = build(report)
    path = os.path.abspath(os.fspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
