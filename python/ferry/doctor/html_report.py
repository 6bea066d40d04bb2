"""`ferry doctor --html FILE`: the doctor's report as one self-contained HTML page.

build(report) gives the page; write(report, path) writes it atomically (a temporary
file beside it, then a rename) and returns the absolute path. The path follows ferry's
one rule for files it writes (ferry.atomic_file.writable_destination): a character
device or a FIFO at path is written into, never replaced; an empty path, a directory, a
block device or a socket is refused.

The page draws the sections of report.py as they are (findings first, then the
measurements, the skipped ones, the plots and the facts): each block a heading over
a table, each finding with its severity, evidence and fix. What is HTML's own: the
header, anchors and the plots.

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
import errno
import html
import io
import math
import os
from typing import Any, Callable

from .. import _ferry, rules, temp_names
from ..atomic_file import AtomicFile, Destination, writable_destination
from ..errors import InvalidArgumentError, OSLayerError
from ..units import fmt_bytes
from . import report as model_report
from . import steps
from .model import Block, Figures, FindingBlock, Row, Section, Table, as_dict

TITLE = "ferry doctor report"
NEED_MATPLOTLIB = "plots need matplotlib (pip install matplotlib)"

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


# ------------------------------------------------------------------------- sections


def _items(items: tuple[str, ...]) -> str:
    return "<ul>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>" if items else ""


def _rows(rows: tuple[Row, ...]) -> str:
    out = ['<table class="kv">']
    for r in rows:
        out.append(f"<tr><th>{_e(r.label)}</th><td>{_e(r.value) if r.value else ''}{_items(r.items)}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _sev_class(severity: str) -> str:
    return severity if severity in rules.SEVERITIES else "unknown"


def _cell(column: str, value: str, anchor: str | None) -> str:
    if column == "severity":
        return f'<span class="sev sev-{_sev_class(value)}">{_e(value)}</span>'
    if column == "id":
        return f'<a href="#{anchor}"><code>{_e(value)}</code></a>' if anchor else f"<code>{_e(value)}</code>"
    return _e(value)


def _table(table: Table, anchors: list[str] | None = None) -> str:
    """A grid; in the findings' summary each id links to its finding (anchors, by row)."""
    out = [f'<table class="grid{" num" if table.numeric else ""}">',
           "<tr>" + "".join(f"<th>{_e(c)}</th>" for c in table.columns) + "</tr>"]
    for i, row in enumerate(table.rows):
        anchor = anchors[i] if anchors and i < len(anchors) else None
        first, *rest = row
        first = f"<th>{_e(first)}</th>" if table.numeric else f"<td>{_cell(table.columns[0], first, anchor)}</td>"
        out.append("<tr>" + first + "".join(f"<td>{_cell(c, v, anchor)}</td>"
                                            for c, v in zip(table.columns[1:], rest)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _block(block: Block, anchors: list[str]) -> str:
    body = []
    if block.text:
        body.append(f"<p>{_e(block.text)}</p>")
    if block.rows:
        body.append(_rows(block.rows))
    if block.table is not None:
        body.append(_table(block.table, anchors))
    if block.detail:
        return f"<details><summary>{_e(block.heading)}</summary>" + "\n".join(body) + "</details>"
    return "\n".join(([f"<h3>{_e(block.heading)}</h3>"] if block.heading else []) + body)


def _finding(f: FindingBlock, anchor: str) -> str:
    sev = _sev_class(f.severity)
    out = [f'<div class="finding sev-border-{sev}" id="{anchor}">',
           f'<h3><span class="sev sev-{sev}">{_e(f.severity)}</span> <code>{_e(f.id)}</code> {_e(f.title)}</h3>',
           _items(f.evidence)]
    if f.fix:
        out.append(f'<p class="fix"><b>fix</b> <code>{_e(f.fix)}</code></p>')
    out.append("</div>")
    return "\n".join(x for x in out if x)


def _anchors(findings: list[FindingBlock]) -> list[str]:
    """An element id for each finding: 'finding-<id>', made safe and unique."""
    out: list[str] = []
    for f in findings:
        base = "finding-" + "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in f.id)
        anchor, n = base, 1
        while anchor in out:
            n += 1
            anchor = f"{base}-{n}"
        out.append(anchor)
    return out


def _section(section: Section) -> str:
    findings = [b for b in section.blocks if isinstance(b, FindingBlock)]
    anchors = _anchors(findings)
    out = [f'<h2 id="{_e(section.id)}">{_e(section.title)}</h2>']
    if section.intro:
        out.append(f"<p>{_e(section.intro)}</p>")
    next_anchor = iter(anchors)
    for block in section.blocks:
        if isinstance(block, FindingBlock):
            out.append(_finding(block, next(next_anchor)))
        else:
            out.append(_block(block, anchors))
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots


def _mpl(text: Any) -> str:
    """Text for a matplotlib label: '$' would start mathtext."""
    return str(text).replace("$", r"\$")


def _link_limits(f: Figures, keys: list[str]) -> dict[float, list[str]]:
    """{link limit GB/s: [gpu keys]} for the GPUs in keys whose limit is known."""
    limits: dict[float, list[str]] = {}
    for key in keys:
        link = f.link(key)
        if link:
            limits.setdefault(link, []).append(key)
    return limits


def _plot_by_path(f: Figures, Figure) -> Any:
    paths = [p for p in _PATHS if any(f.per_gpu(p[0], k) is not None for k in f.gpu_keys(p[0]))]
    keys = f.gpu_keys(*(p[0] for p in paths))
    fig = Figure(figsize=(8.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(keys)
    top = 0.0
    for g, key in enumerate(keys):
        values = [f.per_gpu(p[0], key) for p in paths]
        xs = [i - 0.4 + width * (g + 0.5) for i in range(len(paths))]
        heights = [v or 0.0 for v in values]
        top = max([top, *heights])
        if len(keys) == 1:
            bars = ax.bar(xs, heights, width * 0.9, color=[_KIND_COLOR[p[2]] for p in paths])
        else:
            bars = ax.bar(xs, heights, width * 0.9, label=_mpl(f.gpu_label(key)))
        if len(keys) <= 4:
            ax.bar_label(bars, labels=[f"{v:.1f}" if v is not None else "n/a" for v in values], fontsize=8,
                         padding=2)
    for link, gpu_keys in sorted(_link_limits(f, keys).items()):
        which = "" if len(keys) == 1 else f" (GPU {', '.join(gpu_keys)})"
        ax.axhline(link, color="#c44e52", linestyle="--", linewidth=1.2,
                   label=f"link limit {link:.1f} GB/s{which}")
        top = max(top, link)
    ax.set_xticks(range(len(paths)), [p[1] for p in paths])
    ax.set_ylabel("GB/s (10^9 bytes/s)")
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_title(f"Bandwidth by path ({_mpl(f.size('copy_bytes'))} copies)")
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not on them
    return fig


def _plot_by_size(f: Figures, Figure) -> Any:
    keys = [k for k in f.gpu_keys("bandwidth_by_size") if steps.by_size_rows(f, k)]
    ncols = 1 if len(keys) == 1 else 2
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(8.5 if ncols == 1 else 11, 3.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    limits = _link_limits(f, keys)
    for ax, key in zip(axes, keys):
        rows = [Figures({"measurements": r}) for r in steps.by_size_rows(f, key)]
        sizes = [r.m["nbytes"] for r in rows]
        for name, label, kind in _PATHS:
            points = [(s, v) for s, r in zip(sizes, rows) if (v := r.num(name)) is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=_KIND_COLOR[kind],
                        linestyle="-" if "h2d" in name else "--", label=label.replace("\n", " "))
        for link, gpu_keys in limits.items():
            if key in gpu_keys:
                ax.axhline(link, color="#c44e52", linestyle=":", linewidth=1.2, label=f"link limit {link:.1f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [fmt_bytes(s) for s in sizes])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("copy size")
        ax.set_ylabel("GB/s")
        ax.set_title(_mpl(f.gpu_label(key)))
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


def _plot_memcpy(f: Figures, Figure) -> Any:
    points = steps.memcpy_points(f)
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar([str(t) for t, _ in points], [v for _, v in points], color="#8172b3")
    ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    ax.set_xlabel("threads")
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, max(v for _, v in points) * 1.18)
    ax.set_title(f"Host memcpy bandwidth by thread count ({f.size('memcpy_bytes')})")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_first_touch(f: Figures, Figure) -> Any:
    points = steps.touch_points(f)
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh([p[0] for p in points][::-1], [p[1] for p in points][::-1], color="#937860")
    ax.bar_label(bars, fmt="%.2f GB/s", fontsize=8, padding=3)
    ax.set_xlabel("GB/s")
    ax.set_xlim(0, max(v for _, v in points) * 1.3)
    ax.set_title(f"First-touch rate ({f.size('first_touch_bytes')})")
    ax.grid(axis="x", alpha=0.3)
    return fig


def plans(report: dict) -> list[tuple[str, Callable]]:
    """(title, draw) for each plot whose measurements exist; draw(Figures, Figure) -> Figure."""
    f = Figures(as_dict(report))
    out: list[tuple[str, Callable]] = []
    if any(f.per_gpu(p[0], k) is not None for p in _PATHS for k in f.gpu_keys(p[0])):
        out.append(("Bandwidth by path", _plot_by_path))
    if any(steps.by_size_rows(f, k) for k in f.gpu_keys("bandwidth_by_size")):
        out.append(("Bandwidth by size", _plot_by_size))
    if steps.memcpy_points(f):
        out.append(("Host memcpy by threads", _plot_memcpy))
    if steps.touch_points(f):
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
    figures = Figures(report)
    out.append('<div class="plots">')
    for title, draw in todo:
        try:
            data = base64.b64encode(png(draw(figures, Figure), canvas_class)).decode("ascii")
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
    versions, host = as_dict(report.get("ferry")), as_dict(report.get("host"))
    meta = [f"ferry {versions.get('library', '?')}", model_report.run_summary(report),
            f"generated {generated}"]
    if host.get("kernel"):
        meta.append(f"kernel {host['kernel']}")
    skipped = report.get("skipped") if isinstance(report.get("skipped"), list) else []
    return "\n".join([
        f"<h1>{_e(TITLE)}</h1>",
        f'<p class="meta">{" &middot; ".join(_e(x) for x in meta)}</p>',
        f'<p><a href="#findings">{_e(model_report.findings_section(report.get("findings")).intro)}</a>; '
        f'<a href="#skipped">{len(skipped)} measurements skipped</a></p>',
        "<nav>" + "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t in _NAV) + "</nav>",
    ])


_NAV = (("findings", "Findings"), ("measurements", "Measurements"), ("skipped", "Skipped"), ("plots", "Plots"),
        ("facts", "Facts"))


def build(report: dict, generated: str | None = None) -> str:
    """The whole page for a doctor report dict (doctor.run()'s result, or its --json)."""
    report = as_dict(report)
    if generated is None:
        generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    sections = [_guarded(lambda r: _header(r, generated), TITLE, report)]
    for title, builder in model_report.BUILDERS:
        sections.append(_guarded(lambda r, builder=builder: _section(builder(r)), title, report))
        if title == "Skipped measurements":  # the plots follow the measurements
            sections.append(_guarded(_plots_section, "Plots", report))
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


def _target(path: str | os.PathLike) -> Destination:
    """Where the page goes: ferry's one path rule (ferry.atomic_file.writable_destination),
    with a character device or a FIFO written into."""
    return writable_destination(path, streams=True)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why the page could not be written to path (checked before the doctor measures), or None."""
    try:
        _target(path)
    except (InvalidArgumentError, OSLayerError) as e:
        return str(e)
    return None


def _mode_for(path: str) -> int:
    with contextlib.suppress(OSError):
        return os.stat(path).st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write(report: dict, path: str | os.PathLike) -> str:
    """Writes build(report) to path and returns its absolute path. A regular file (or a
    new one; through a symbolic link, the file it names) is written atomically: a
    temporary file in the same folder, then a rename (a reader never sees half a page),
    keeping the old file's mode. A character device or a FIFO is written into, never
    replaced (a FIFO without a reader is an error, not a hang). Anything else the path
    rule refuses (an empty path, a directory, a block device, a socket) raises OSError
    saying so."""
    return write_bytes(build(report).encode("utf-8"), path)


def write_bytes(page: bytes, path: str | os.PathLike) -> str:
    """write()'s rules for any bytes (the doctor's --json FILE too); the absolute path."""
    try:
        dest = _target(path)
    except InvalidArgumentError as e:
        raise OSLayerError(errno.EINVAL, str(e)) from None
    if dest.kind == "stream":
        _write_into(dest.path, page)
        return dest.path
    temp_names.remove_stale(os.path.dirname(dest.path))
    out = AtomicFile(dest.path, direct=False)
    try:
        os.fchmod(out.fd, _mode_for(dest.path))
        out.pwrite(page, 0)
    except BaseException:
        out.abort()
        raise
    try:
        out.commit(len(page))
    except InvalidArgumentError as e:  # replaced by something else while written: left as it is
        raise OSLayerError(errno.EINVAL, str(e)) from None
    return dest.path


def _write_into(path: str, data: bytes) -> None:
    """Writes data into a character device or a FIFO without replacing it, through
    src/os (``_ferry.write_stream``): a FIFO without a reader is an error at once
    (ENXIO: "PATH is a FIFO with no reader"), not a wait; the writes themselves block."""
    _ferry.write_stream(path, data)