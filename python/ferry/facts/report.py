"""Plain-text rendering of the facts dict from ferry.facts.collect().

format_facts() gives three sections (Host, CUDA, GPUs) of aligned "label  value"
lines, with units spelled out (GiB, GB/s) and unknown values written "unknown". It
accepts partial dicts: a missing key reads as unknown, never as an error.
"""

from __future__ import annotations

import textwrap

LABEL_WIDTH = 20
INDENT = "  "
LINE_WIDTH = 100

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: int | None) -> str:
    """A byte count in binary units: 2097152 -> "2 MiB", 25276063744 -> "23.5 GiB"."""
    if not isinstance(value, int) or isinstance(value, bool):
        return "unknown"
    amount = float(value)
    for unit in _BINARY_UNITS:
        if abs(amount) < 1024 or unit == _BINARY_UNITS[-1]:
            break
        amount /= 1024
    text = f"{amount:.1f}".removesuffix(".0")
    return f"{text} {unit}"


def _text(value: object) -> str:
    return "unknown" if value is None else str(value)


def _line(label: str, value: object, depth: int = 1) -> list[str]:
    """One aligned line, long values wrapped under the value column."""
    prefix = INDENT * depth + label.ljust(LABEL_WIDTH - len(INDENT) * (depth - 1))
    if len(prefix) > len(INDENT) + LABEL_WIDTH:
        prefix = prefix.rstrip() + " "
    return textwrap.wrap(
        _text(value),
        width=LINE_WIDTH,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_on_hyphens=False,
        break_long_words=False,
    ) or [prefix.rstrip()]


def _list_lines(label: str, items: list, depth: int = 1) -> list[str]:
    lines: list[str] = []
    for i, item in enumerate(items or []):
        lines += _line(label if i == 0 else "", item, depth)
    return lines


# --- Host --------------------------------------------------------------------------


def host_lines(host: dict) -> list[str]:
    virt = host.get("virtualization") or {}
    lines = ["Host"]
    lines += _line("kernel", host.get("kernel"))
    lines += _line("os", host.get("os"))
    lines += _line("virtualization", _virtualization_text(virt))
    lines += _list_lines("evidence", virt.get("evidence"), depth=2)
    lines += _cpu_lines(host.get("cpu") or {})
    memory = host.get("memory") or {}
    lines += _line(
        "memory",
        f"{format_bytes(memory.get('total_bytes'))} total, "
        f"{format_bytes(memory.get('available_bytes'))} available",
    )
    lines += _numa_lines(host.get("numa_nodes"))
    lines += _thp_lines(host.get("thp") or {})
    lines += _hugetlb_lines(host.get("hugetlb"))
    memlock = host.get("memlock_bytes")
    lines += _line("memlock limit", "unlimited" if memlock is None else format_bytes(memlock))
    lines += _iommu_lines(host.get("iommu") or {})
    process = host.get("process") or {}
    lines += _line("process CPUs", process.get("cpus_allowed") or "unknown")
    lines += _line("process NUMA mems", process.get("mems_allowed"))
    lines += _line("kernel modules", _modules_text(host.get("kernel_modules") or {}))
    lines += _line("GDRCopy", _gdrcopy_text(host.get("gdrcopy") or {}))
    lines += _list_lines("note", host.get("notes"))
    return lines


def _virtualization_text(virt: dict) -> str:
    kind = virt.get("kind") or "unknown"
    text = kind if not virt.get("hypervisor") else f"{kind} (hypervisor: {virt['hypervisor']})"
    return text + (", in a container" if virt.get("container") else "")


def _cpu_lines(cpu: dict) -> list[str]:
    lines = _line("cpu", cpu.get("model"))
    online = cpu.get("online")
    lines += _line("logical CPUs", f"{_text(cpu.get('logical_cpus'))} online ({online or 'unknown'})")
    return lines


def _numa_lines(nodes: list | None) -> list[str]:
    if not nodes:
        return _line("NUMA nodes", "unknown (no /sys/devices/system/node)")
    lines: list[str] = []
    for node in nodes:
        lines += _line(
            f"NUMA node {node.get('id')}",
            f"CPUs {node.get('cpus') or 'none'}, {format_bytes(node.get('mem_total_bytes'))}",
        )
    return lines


def _thp_lines(thp: dict) -> list[str]:
    lines = _line(
        "THP",
        f"enabled={_text(thp.get('enabled'))} defrag={_text(thp.get('defrag'))} "
        f"shmem_enabled={_text(thp.get('shmem_enabled'))}",
    )
    lines += _line("THP PMD size", format_bytes(thp.get("pmd_size_bytes")))
    sizes = [entry for entry in thp.get("sizes") or [] if entry.get("enabled") not in (None, "never")]
    if sizes:
        lines += _line(
            "mTHP sizes",
            ", ".join(f"{format_bytes(e['page_size_bytes'])}: {e['enabled']}" for e in sizes)
            + " (other sizes never)",
        )
    return lines


def _hugetlb_lines(pools: list | None) -> list[str]:
    if not pools:
        return _line("hugetlb", "no pools (no /sys/kernel/mm/hugepages)")
    lines: list[str] = []
    for pool in pools:
        lines += _line(
            f"hugetlb {format_bytes(pool.get('page_size_bytes'))}",
            f"{_text(pool.get('total'))} pages ({_text(pool.get('free'))} free, "
            f"{_text(pool.get('reserved'))} reserved, {_text(pool.get('surplus'))} surplus)",
        )
    return lines


def _iommu_lines(iommu: dict) -> list[str]:
    state = "present" if iommu.get("present") else "not present"
    lines = _line(
        "IOMMU", f"{state}, mode {_text(iommu.get('mode'))}, {_text(iommu.get('groups'))} groups"
    )
    return lines + _list_lines("evidence", iommu.get("evidence"), depth=2)


def _modules_text(modules: dict) -> str:
    loadable = modules.get("loadable")
    state = {True: "can be loaded", False: "cannot be loaded", None: "unknown"}[loadable]
    evidence = "; ".join(modules.get("evidence") or [])
    return f"{state} ({evidence})" if evidence else state


def _gdrcopy_text(gdrcopy: dict) -> str:
    if gdrcopy.get("available"):
        return "available (/dev/gdrdrv and libgdrapi present)"
    return f"not available: {gdrcopy.get('reason') or 'unknown reason'}"


# --- CUDA and GPUs ---------------------------------------------------------------


def cuda_lines(cuda: dict | None) -> list[str]:
    lines = ["CUDA"]
    if cuda is None:
        return lines + [INDENT + "no CUDA driver found: GPU facts skipped"]
    lines += _line("driver", cuda.get("driver_version"))
    lines += _line("runtime", cuda.get("runtime_version"))
    lines += _line("devices", cuda.get("device_count"))
    return lines


def gpu_lines(gpus: list, cuda: dict | None) -> list[str]:
    lines = ["GPUs"]
    if cuda is None:
        return lines + [INDENT + "skipped (no CUDA driver)"]
    if not gpus:
        return lines + [INDENT + "no CUDA device"]
    for gpu in gpus:
        lines += _one_gpu_lines(gpu)
    return lines


def _link_text(gen: object, width: object, gbps: object) -> str:
    if gen is None and width is None:
        return "unknown"
    rate = "unknown GB/s" if gbps is None else f"{gbps:.1f} GB/s"
    return f"gen {_text(gen)} x{_text(width)}, {rate} per direction"


def _one_gpu_lines(gpu: dict) -> list[str]:
    pcie = gpu.get("pcie") or {}
    capability = gpu.get("compute_capability")
    title = _text(gpu.get("name")) + (f", compute capability {capability}" if capability else "")
    lines = _line(f"GPU {_text(gpu.get('index'))}", title)
    lines += _line("memory", format_bytes(gpu.get("memory_bytes")), depth=2)
    lines += _line("PCI bus id", gpu.get("pci_bus_id"), depth=2)
    source = f" (source: {pcie['source']})" if pcie.get("source") else ""
    lines += _line(
        "PCIe link now",
        _link_text(pcie.get("gen"), pcie.get("width"), gpu.get("link_gbps")) + source,
        depth=2,
    )
    lines += _line(
        "PCIe link max",
        _link_text(pcie.get("max_gen"), pcie.get("max_width"), gpu.get("max_link_gbps")),
        depth=2,
    )
    bar1_source = f" (source: {gpu['bar1_source']})" if gpu.get("bar1_source") else ""
    lines += _line("BAR1", format_bytes(gpu.get("bar1_bytes")) + bar1_source, depth=2)
    numa = gpu.get("numa_node")
    lines += _line("NUMA node", "none reported" if numa is None else numa, depth=2)
    lines += _line("CPU affinity", gpu.get("cpu_affinity"), depth=2)
    lines += _list_lines("note", gpu.get("notes"), depth=2)
    return lines


# --- everything ------------------------------------------------------------------


def format_facts(facts: dict) -> str:
    """The facts dict as a readable plain-text report."""
    facts = facts if isinstance(facts, dict) else {}
    cuda = facts.get("cuda")
    sections = [
        host_lines(facts.get("host") or {}),
        cuda_lines(cuda),
        gpu_lines(facts.get("gpus") or [], cuda),
    ]
    if facts.get("notes"):
        sections.append(["Notes"] + _list_lines("note", facts["notes"]))
    return "\n\n".join("\n".join(section) for section in sections) + "\n"
