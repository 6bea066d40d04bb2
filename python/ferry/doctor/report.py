"""The doctor's report as sections (model.py), built once from a report dict
(run()'s result or its --json) for every renderer.

sections(report): Findings (the verdict: severity, title, evidence, fix), then
Measurements (each step's rows, steps.py), Skipped measurements, then the Facts
(host, CUDA, GPUs). Accepts partial or malformed dicts: a missing or odd value
reads as unknown, never as an error.
"""

from __future__ import annotations

from typing import Any

from .. import rules
from ..units import fmt_bytes, number
from . import steps
from .model import Block, Figures, FindingBlock, Row, Section, Table, as_dict, text

GB_PER_S = "GB/s = 10^9 bytes/s per direction"


def sections(report: Any) -> list[Section]:
    report = as_dict(report)
    return [build(report) for _, build in BUILDERS]


# ---- findings ----------------------------------------------------------------------


def sorted_findings(findings: Any) -> list[dict]:
    """Findings as dicts, sorted by severity (critical, warning, info), then id and title."""
    rank = {name: i for i, name in enumerate(rules.SEVERITIES)}
    items = [as_dict(f) for f in findings] if isinstance(findings, list) else []
    return sorted(items, key=lambda f: (rank.get(f.get("severity"), len(rank)), str(f.get("id")),
                                        str(f.get("title"))))


def findings_section(findings: Any) -> Section:
    items = sorted_findings(findings)
    if not items:
        return Section("findings", "Findings", "No findings: nothing in the facts or measurements needs fixing.")
    counts = {s: sum(1 for f in items if f.get("severity") == s) for s in rules.SEVERITIES}
    intro = (f"{len(items)} finding{'s' if len(items) != 1 else ''}: "
             + ", ".join(f"{counts[s]} {s}" for s in rules.SEVERITIES))
    blocks = [FindingBlock(text(f.get("severity")), text(f.get("id")), text(f.get("title")),
                           tuple(str(e) for e in (f.get("evidence") or [])), str(f.get("fix") or ""))
              for f in items]
    summary = Table(("severity", "id", "title"), tuple((b.severity, b.id, b.title) for b in blocks))
    return Section("findings", "Findings", intro, (Block(table=summary), *blocks))


# ---- measurements ------------------------------------------------------------------


def run_summary(report: dict) -> str:
    """'default run, 21.5 s'."""
    return f"{report.get('mode', 'default')} run, {number(report.get('elapsed_seconds')) or 0.0:.1f} s"


def measurements_section(report: dict) -> Section:
    f = Figures(report)
    intro = f"{run_summary(report)}; {GB_PER_S}"
    blocks: list[Block] = []
    gpu_steps = [s for s in steps.STEPS if s.scope == "gpu"]
    for gpu in f.gpu_keys(*(k for s in gpu_steps for k in s.keys)):
        rows, extra = _split([item for s in gpu_steps for item in s.report(f, gpu)])
        if rows:
            link = f.link(gpu)
            heading = f.gpu_label(gpu) + (f", link {link:.1f} GB/s per direction" if link else ", link limit unknown")
            blocks.append(Block(heading, tuple(rows)))
        blocks += extra
    for scope, heading in (("first-gpu", "Pinned allocation, small copies and registration (first GPU)"),
                           ("host", "Host")):
        rows, extra = _split([item for s in steps.STEPS if s.scope == scope for item in s.report(f, None)])
        if rows:
            blocks.append(Block(heading, tuple(rows)))
        blocks += extra
    if not blocks:
        blocks.append(Block(text="(none)"))
    pool = _flatten(as_dict(report.get("pool")))
    if pool:
        blocks.append(Block("Statistics of the pool the doctor used", tuple(Row(k, str(v)) for k, v in pool),
                            detail=True))
    return Section("measurements", "Measurements", intro, tuple(blocks))


def _split(items: list) -> tuple[list[Row], list[Block]]:
    return [i for i in items if isinstance(i, Row)], [i for i in items if isinstance(i, Block)]


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """{"a": {"b": 1}} -> [("a.b", 1)]."""
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix, value)]


def skipped_section(report: dict) -> Section:
    skipped = report.get("skipped")
    skipped = [as_dict(s) for s in skipped] if isinstance(skipped, list) else []
    if not skipped:
        block = Block(text="none: every measurement of this mode ran")
    else:
        block = Block(rows=tuple(Row(text(s.get("what")), text(s.get("why"))) for s in skipped))
    return Section("skipped", "Skipped measurements", blocks=(block,))


# ---- facts -------------------------------------------------------------------------


def facts_section(report: dict) -> Section:
    blocks = [Block("Host", tuple(host_rows(as_dict(report.get("host")))))]
    cuda = report.get("cuda")
    if not isinstance(cuda, dict):
        blocks.append(Block("CUDA", text="no CUDA driver found: GPU facts skipped"))
    else:
        blocks.append(Block("CUDA", (Row("driver", text(cuda.get("driver_version"))),
                                     Row("runtime", text(cuda.get("runtime_version"))),
                                     Row("devices", text(cuda.get("device_count"))))))
    gpus = report.get("gpus")
    gpus = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
    if not isinstance(cuda, dict):
        blocks.append(Block("GPUs", text="skipped (no CUDA driver)"))
    elif not gpus:
        blocks.append(Block("GPUs", text="no CUDA device"))
    for i, gpu in enumerate(gpus):
        blocks.append(Block(f"GPU {text(gpu.get('index', i))}", tuple(gpu_rows(gpu))))
    notes = report.get("notes")
    if notes:
        blocks.append(Block("Notes", (Row("notes", items=tuple(str(n) for n in notes)),)))
    return Section("facts", "Facts", blocks=tuple(blocks))


def host_rows(host: dict) -> list[Row]:
    virt, cpu, memory = as_dict(host.get("virtualization")), as_dict(host.get("cpu")), as_dict(host.get("memory"))
    thp, iommu, process = as_dict(host.get("thp")), as_dict(host.get("iommu")), as_dict(host.get("process"))
    rows = [
        Row("kernel", text(host.get("kernel"))),
        Row("os", text(host.get("os"))),
        Row("virtualization", _virtualization_text(virt), tuple(str(e) for e in virt.get("evidence") or [])),
        Row("cpu", text(cpu.get("model"))),
        Row("logical CPUs", f"{text(cpu.get('logical_cpus'))} online ({cpu.get('online') or 'unknown'})"),
        Row("memory", f"{fmt_bytes(memory.get('total_bytes'))} total, "
                      f"{fmt_bytes(memory.get('available_bytes'))} available"),
    ]
    nodes = host.get("numa_nodes")
    if not nodes:
        rows.append(Row("NUMA nodes", "unknown (no /sys/devices/system/node)"))
    for node in nodes or []:
        node = as_dict(node)
        rows.append(Row(f"NUMA node {node.get('id')}",
                        f"CPUs {node.get('cpus') or 'none'}, {fmt_bytes(node.get('mem_total_bytes'))}"))
    rows.append(Row("THP", f"enabled={text(thp.get('enabled'))} defrag={text(thp.get('defrag'))} "
                           f"shmem_enabled={text(thp.get('shmem_enabled'))}"))
    rows.append(Row("THP PMD size", fmt_bytes(thp.get("pmd_size_bytes"))))
    sizes = [as_dict(s) for s in thp.get("sizes") or [] if as_dict(s).get("enabled") not in (None, "never")]
    if sizes:
        rows.append(Row("mTHP sizes", ", ".join(f"{fmt_bytes(s.get('page_size_bytes'))}: {s.get('enabled')}"
                                                for s in sizes) + " (other sizes never)"))
    pools = host.get("hugetlb")
    if not pools:
        rows.append(Row("hugetlb", "no pools (no /sys/kernel/mm/hugepages)"))
    for pool in pools or []:
        pool = as_dict(pool)
        rows.append(Row(f"hugetlb {fmt_bytes(pool.get('page_size_bytes'))}",
                        f"{text(pool.get('total'))} pages ({text(pool.get('free'))} free, "
                        f"{text(pool.get('reserved'))} reserved, {text(pool.get('surplus'))} surplus)"))
    memlock = host.get("memlock_bytes")
    rows.append(Row("memlock limit", "unlimited" if memlock is None else fmt_bytes(memlock)))
    rows.append(Row("IOMMU", f"{'present' if iommu.get('present') else 'not present'}, mode "
                             f"{text(iommu.get('mode'))}, {text(iommu.get('groups'))} groups",
                    tuple(str(e) for e in iommu.get("evidence") or [])))
    rows.append(Row("process CPUs", process.get("cpus_allowed") or "unknown"))
    rows.append(Row("process NUMA mems", text(process.get("mems_allowed"))))
    rows.append(Row("kernel modules", _modules_text(as_dict(host.get("kernel_modules")))))
    rows.append(Row("GDRCopy", _gdrcopy_text(as_dict(host.get("gdrcopy")))))
    rows.append(Row("copy engine", _copy_engine_text(as_dict(host.get("copy_engine")))))
    if host.get("notes"):
        rows.append(Row("notes", items=tuple(str(n) for n in host["notes"])))
    return rows


def _virtualization_text(virt: dict) -> str:
    kind = virt.get("kind") or "unknown"
    value = kind if not virt.get("hypervisor") else f"{kind} (hypervisor: {virt['hypervisor']})"
    return value + (", in a container" if virt.get("container") else "")


def _modules_text(modules: dict) -> str:
    state = {True: "can be loaded", False: "cannot be loaded"}.get(modules.get("loadable"), "unknown")
    evidence = "; ".join(str(e) for e in modules.get("evidence") or [])
    return f"{state} ({evidence})" if evidence else state


def _gdrcopy_text(gdrcopy: dict) -> str:
    if gdrcopy.get("available"):
        return "available (/dev/gdrdrv and libgdrapi present)"
    return f"not available: {gdrcopy.get('reason') or 'unknown reason'}"


def _copy_engine_text(engine: dict) -> str:
    """'crew of 2 threads (one per usable CPU); machine profile /x/profile.txt (absent: built-in defaults)'."""
    threads, workers, node = engine.get("crew_threads"), engine.get("workers_option"), engine.get("crew_numa_node")
    if not isinstance(threads, int):
        crew = "crew size unknown"
    else:
        why = f"FERRY_COPY_WORKERS={workers}" if isinstance(workers, int) and workers > 0 else "one per usable CPU"
        bound = f", bound to NUMA node {node}" if node is not None else ""
        crew = f"crew of {threads} thread{'' if threads == 1 else 's'} ({why}{bound})"
    profile = as_dict(engine.get("profile"))
    state = {True: "present", False: "missing: the engine refuses to copy" if profile.get("named")
             else "absent: built-in defaults"}.get(profile.get("present"), "unknown")
    if profile.get("present") is None and profile.get("problem"):
        state = f"unusable: {profile['problem']}; the engine refuses to copy"
    if not profile:
        where = "unknown"
    elif profile.get("path") is None:
        where = "none (FERRY_PROFILE, XDG_CACHE_HOME and HOME unset): built-in defaults"
    else:
        where = f"{profile['path']} ({'FERRY_PROFILE, ' if profile.get('named') else ''}{state})"
    return f"{crew}; machine profile {where}"


def _link_text(gen: Any, width: Any, gbps: Any) -> str:
    if gen is None and width is None:
        return "unknown"
    rate = "unknown GB/s" if number(gbps) is None else f"{gbps:.1f} GB/s"
    return f"gen {text(gen)} x{text(width)}, {rate} per direction"


def gpu_rows(gpu: dict) -> list[Row]:
    pcie = as_dict(gpu.get("pcie"))
    source = f" (source: {pcie['source']})" if pcie.get("source") else ""
    bar1_source = f" (source: {gpu['bar1_source']})" if gpu.get("bar1_source") else ""
    numa = gpu.get("numa_node")
    return [
        Row("name", text(gpu.get("name"))),
        Row("compute capability", text(gpu.get("compute_capability"))),
        Row("memory", fmt_bytes(gpu.get("memory_bytes"))),
        Row("PCI bus id", text(gpu.get("pci_bus_id"))),
        Row("PCIe link now", _link_text(pcie.get("gen"), pcie.get("width"), gpu.get("link_gbps")) + source),
        Row("PCIe link max", _link_text(pcie.get("max_gen"), pcie.get("max_width"), gpu.get("max_link_gbps"))),
        Row("BAR1", fmt_bytes(gpu.get("bar1_bytes")) + bar1_source),
        Row("NUMA node", "none reported" if numa is None else str(numa)),
        Row("CPU affinity", text(gpu.get("cpu_affinity"))),
        *([Row("notes", items=tuple(str(n) for n in gpu["notes"]))] if gpu.get("notes") else []),
    ]


BUILDERS = (  # (title, builder): the sections in report order
    ("Findings", lambda report: findings_section(report.get("findings"))),
    ("Measurements", measurements_section),
    ("Skipped measurements", skipped_section),
    ("Facts", facts_section),
)
