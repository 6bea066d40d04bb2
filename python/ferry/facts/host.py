"""Readers of the host's facts: kernel, OS, virtualization, CPUs, NUMA, memory, THP,
hugetlb pools, memlock limit, IOMMU, process affinity, GDRCopy availability and
PyTorch's allocator settings in the environment (torch_alloc.py).

Each reader looks at the real machine through the pure parsers in parsers.py. A file
that is missing or unreadable gives None for its fact (and, where it helps, a line
in the `notes` list passed in); no reader raises.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource

from . import parsers
from .torch_alloc import collect_torch_alloc_conf

SYS_THP = "/sys/kernel/mm/transparent_hugepage"
SYS_HUGEPAGES = "/sys/kernel/mm/hugepages"
SYS_NODES = "/sys/devices/system/node"
SYS_CPU_ONLINE = "/sys/devices/system/cpu/online"
SYS_DMI = "/sys/class/dmi/id"
SYS_ACPI_TABLES = "/sys/firmware/acpi/tables"
SYS_PLATFORM_DEVICES = "/sys/bus/platform/devices"
SYS_CLOCKSOURCES = "/sys/devices/system/clocksource/clocksource0/available_clocksource"
SYS_IOMMU_CLASS = "/sys/class/iommu"
SYS_IOMMU_GROUPS = "/sys/kernel/iommu_groups"
DEV_GDRDRV = "/dev/gdrdrv"
THP_KEYS = ("enabled", "defrag", "shmem_enabled", "pmd_size_bytes", "sizes")

# --- file access that never raises ------------------------------------------------------


def read_text(path: str) -> str | None:
    """The text of a file; None when it is missing, unreadable or not text."""
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def read_head(path: str, size: int) -> bytes | None:
    """The first `size` bytes of a file; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def _read_int(directory: str, name: str) -> int | None:
    return parsers.parse_int(read_text(os.path.join(directory, name)))


def list_dir(path: str) -> list[str] | None:
    """The sorted entries of a directory; None when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


# --- kernel, OS ---------------------------------------------------------------------


def kernel_release() -> str:
    """uname -r."""
    return os.uname().release


def os_name() -> str | None:
    """PRETTY_NAME of /etc/os-release (or /usr/lib/os-release)."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        name = parsers.os_pretty_name(read_text(path))
        if name:
            return name
    return None


def kernel_modules() -> dict:
    """Whether this kernel can load modules (gdrdrv needs it), with the evidence."""
    evidence: list[str] = []
    loadable: bool | None = None
    if os.path.exists("/proc/modules"):
        loadable = True
        evidence.append("/proc/modules exists")
    elif os.path.isdir("/proc"):
        loadable = False
        evidence.append("no /proc/modules: kernel built without module support")
    params = parsers.parse_cmdline(read_text("/proc/cmdline"))
    if "nomodule" in params:
        loadable = False
        evidence.append("kernel cmdline has 'nomodule'")
    disabled = parsers.parse_int(read_text("/proc/sys/kernel/modules_disabled"))
    if disabled == 1:
        loadable = False
        evidence.append("/proc/sys/kernel/modules_disabled = 1")
    return {"loadable": loadable, "evidence": evidence}


# --- virtualization -------------------------------------------------------------------


def dmi_strings() -> dict[str, str | None] | None:
    """DMI vendor/product strings; None when the machine has no DMI tables."""
    if not os.path.isdir(SYS_DMI):
        return None
    fields = ("sys_vendor", "product_name", "bios_vendor", "board_vendor")
    return {field: _stripped(read_text(os.path.join(SYS_DMI, field))) for field in fields}


def _stripped(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None


def acpi_oem_ids() -> list[str]:
    """OEM ids of the ACPI tables that can be read (reading them may need root)."""
    ids: set[str] = set()
    for name in list_dir(SYS_ACPI_TABLES) or []:
        path = os.path.join(SYS_ACPI_TABLES, name)
        if os.path.isfile(path):
            oem = parsers.acpi_oem_id(read_head(path, 36))
            if oem:
                ids.add(oem)
    return sorted(ids)


def virtualization() -> dict:
    """{"kind", "hypervisor", "evidence", "container"} for this machine."""
    facts = parsers.classify_virtualization(
        cpu_flags=parsers.parse_cpuinfo_flags(read_text("/proc/cpuinfo")),
        kernel_release=kernel_release(),
        proc_version=read_text("/proc/version"),
        cmdline=read_text("/proc/cmdline"),
        dmi=dmi_strings(),
        clocksources=(read_text(SYS_CLOCKSOURCES) or "").split(),
        xen_type=_stripped(read_text("/sys/hypervisor/type")),
        acpi_oem_ids=acpi_oem_ids(),
        platform_devices=list_dir(SYS_PLATFORM_DEVICES) or [],
        mountinfo=read_text("/proc/self/mountinfo"),
    )
    in_container, evidence = parsers.container_evidence(
        read_text("/proc/1/cgroup"),
        os.path.exists("/.dockerenv"),
        os.path.exists("/run/.containerenv"),
    )
    facts["container"] = in_container
    facts["evidence"] += evidence
    return facts


# --- CPUs, NUMA, memory -----------------------------------------------------------------


def cpu(notes: list[str]) -> dict:
    """{"model", "logical_cpus", "online"}."""
    online = parsers.parse_cpulist(read_text(SYS_CPU_ONLINE))
    if online is None:
        count = os.cpu_count() or 0
        online = list(range(count))
        notes.append(f"{SYS_CPU_ONLINE} unreadable: assuming CPUs 0-{count - 1} are online")
    return {
        "model": parsers.parse_cpuinfo_model(read_text("/proc/cpuinfo")),
        "logical_cpus": len(online),
        "online": parsers.format_cpulist(online),
    }


def numa_nodes(notes: list[str]) -> list[dict]:
    """[{"id", "cpus", "mem_total_bytes"}] from /sys/devices/system/node."""
    entries = list_dir(SYS_NODES)
    if entries is None:
        notes.append(f"no {SYS_NODES}: NUMA layout unknown")
        return []
    nodes = []
    for name in entries:
        node_id = parsers.parse_int(name[4:]) if name.startswith("node") else None
        if node_id is None:
            continue
        path = os.path.join(SYS_NODES, name)
        cpulist = read_text(os.path.join(path, "cpulist"))
        meminfo = parsers.parse_meminfo(read_text(os.path.join(path, "meminfo")))
        nodes.append(
            {
                "id": node_id,
                "cpus": parsers.compact_cpulist(cpulist) or (cpulist or "").strip(),
                "mem_total_bytes": meminfo.get("MemTotal"),
            }
        )
    return sorted(nodes, key=lambda node: node["id"])


def memory(notes: list[str]) -> dict:
    """{"total_bytes", "available_bytes"} from /proc/meminfo."""
    meminfo = parsers.parse_meminfo(read_text("/proc/meminfo"))
    if not meminfo:
        notes.append("/proc/meminfo unreadable")
    return {
        "total_bytes": meminfo.get("MemTotal"),
        "available_bytes": meminfo.get("MemAvailable"),
    }


def numa_memory_note(nodes: list[dict], mem: dict) -> str | None:
    """A note when the nodes' MemTotal sum is far from /proc/meminfo's MemTotal."""
    totals = [node.get("mem_total_bytes") for node in nodes]
    total = mem.get("total_bytes")
    if not totals or None in totals or not total:
        return None
    node_sum = sum(totals)
    if abs(node_sum - total) <= total // 10:
        return None
    return (
        f"NUMA nodes' MemTotal adds up to {node_sum} bytes but /proc/meminfo says {total}: "
        "per-node figures may miss hot-plugged or lazily initialized memory"
    )


# --- huge pages -------------------------------------------------------------------


def thp(notes: list[str]) -> dict:
    """Transparent huge page settings, plus the per-size (mTHP) settings if any."""
    if not os.path.isdir(SYS_THP):
        notes.append(f"no {SYS_THP}: kernel without THP, or hidden by the sandbox")
    return {
        "enabled": _thp_setting("enabled"),
        "defrag": _thp_setting("defrag"),
        "shmem_enabled": _thp_setting("shmem_enabled"),
        "pmd_size_bytes": parsers.parse_int(read_text(os.path.join(SYS_THP, "hpage_pmd_size"))),
        "sizes": thp_sizes(),
    }


def _thp_setting(name: str) -> str | None:
    return parsers.parse_thp_setting(read_text(os.path.join(SYS_THP, name)))


def thp_sizes() -> list[dict]:
    """[{"page_size_bytes", "enabled"}] for each mTHP size directory, sorted by size."""
    sizes = []
    for name in list_dir(SYS_THP) or []:
        size = parsers.hugepages_dir_size(name)
        if size is None:
            continue
        enabled = parsers.parse_thp_setting(read_text(os.path.join(SYS_THP, name, "enabled")))
        sizes.append({"page_size_bytes": size, "enabled": enabled})
    return sorted(sizes, key=lambda entry: entry["page_size_bytes"])


def hugetlb(notes: list[str]) -> list[dict]:
    """[{"page_size_bytes", "total", "free", "reserved", "surplus"}] sorted by size."""
    entries = list_dir(SYS_HUGEPAGES)
    if entries is None:
        notes.append(f"no {SYS_HUGEPAGES}: kernel without hugetlbfs, or hidden by the sandbox")
        return []
    pools = []
    for name in entries:
        size = parsers.hugepages_dir_size(name)
        if size is None:
            continue
        pool_dir = os.path.join(SYS_HUGEPAGES, name)
        pools.append(
            {
                "page_size_bytes": size,
                "total": _read_int(pool_dir, "nr_hugepages"),
                "free": _read_int(pool_dir, "free_hugepages"),
                "reserved": _read_int(pool_dir, "resv_hugepages"),
                "surplus": _read_int(pool_dir, "surplus_hugepages"),
            }
        )
    return sorted(pools, key=lambda pool: pool["page_size_bytes"])


# --- limits, IOMMU, process ---------------------------------------------------------


def memlock_bytes(notes: list[str]) -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes; None means unlimited."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return parsers.rlimit_bytes(soft, resource.RLIM_INFINITY)
    except (OSError, ValueError, AttributeError):
        pass
    found, soft = parsers.memlock_from_limits(read_text("/proc/self/limits"))
    if not found:
        notes.append("memlock limit unknown (getrlimit and /proc/self/limits failed): shown as unlimited")
    return soft


def iommu(virt_kind: str | None) -> dict:
    """{"present", "groups", "mode", "evidence", "cmdline"} for this kernel's IOMMU."""
    evidence: list[str] = []
    units = list_dir(SYS_IOMMU_CLASS)
    groups = list_dir(SYS_IOMMU_GROUPS)
    if units is not None:
        evidence.append(f"{SYS_IOMMU_CLASS}: {', '.join(units) if units else 'empty'}")
    group_types = [
        _stripped(read_text(os.path.join(SYS_IOMMU_GROUPS, group, "type"))) for group in groups or []
    ]
    if groups:
        kinds = sorted({t for t in group_types if t})
        evidence.append(f"{len(groups)} iommu groups, types: {', '.join(kinds) or 'unreadable'}")
    cmdline = read_text("/proc/cmdline")
    options = parsers.iommu_cmdline_options(cmdline)
    if options:
        evidence.append(
            "kernel cmdline: " + " ".join(k if v is None else f"{k}={v}" for k, v in options.items())
        )
    present = bool(units) or bool(groups)
    mode = parsers.iommu_mode_from_group_types(group_types)
    if mode is None:
        mode = parsers.iommu_mode_from_cmdline(cmdline)
    if mode is None and not present and (units is not None or groups is not None):
        mode = "off"
    if not present and virt_kind not in (None, "bare-metal", "unknown"):
        evidence.append("a guest without a virtual IOMMU sees none; the host's IOMMU still maps device DMA")
    return {
        "present": present,
        "groups": len(groups or []),
        "mode": mode,
        "evidence": evidence,
        "cmdline": options,
    }


def process(notes: list[str]) -> dict:
    """{"cpus_allowed", "mems_allowed"} of this process."""
    status = read_text("/proc/self/status")
    cpus = parsers.status_cpus_allowed(status)
    if cpus is None:
        try:
            cpus = parsers.format_cpulist(os.sched_getaffinity(0))
        except (OSError, AttributeError):
            cpus = ""
            notes.append("process CPU affinity unknown")
    return {"cpus_allowed": cpus, "mems_allowed": parsers.status_mems_allowed(status)}


# --- GDRCopy ----------------------------------------------------------------------


def libgdrapi_loadable() -> bool:
    """Whether the GDRCopy user library can be found or loaded."""
    try:
        ctypes.CDLL("libgdrapi.so.2")
        return True
    except OSError:
        pass
    try:
        return ctypes.util.find_library("gdrapi") is not None
    except Exception:  # find_library runs helper programs; any failure means "not found"
        return False


def gdrcopy(virt_kind: str | None, modules: dict) -> dict:
    """{"gdrdrv", "libgdrapi", "available", "reason"}."""
    has_driver = os.path.exists(DEV_GDRDRV)
    has_library = libgdrapi_loadable()
    reasons = []
    if not has_driver:
        why = "no /dev/gdrdrv: the gdrdrv kernel module is not loaded (needs root and kernel headers"
        if modules.get("loadable") is False:
            why += "; and this kernel cannot load modules, see kernel_modules"
        elif virt_kind in ("firecracker", "gvisor"):
            why += f"; usually impossible in a {virt_kind} VM without module support"
        reasons.append(why + ")")
    if not has_library:
        reasons.append("libgdrapi not found (libgdrapi.so.2)")
    return {
        "gdrdrv": has_driver,
        "libgdrapi": has_library,
        "available": has_driver and has_library,
        "reason": "; ".join(reasons) or None,
    }


# --- everything -------------------------------------------------------------------


def _safely(notes: list[str], what: str, default, reader, *args):
    """reader(*args), or `default` plus a note if it raised (a bug, not a machine fact)."""
    try:
        return reader(*args)
    except Exception as exc:  # `ferry doctor` must report, not crash
        notes.append(f"reading {what} failed: {type(exc).__name__}: {exc}")
        return default


def collect_host() -> dict:
    """All host facts as one JSON-ready dict (see facts/__init__.py for the schema)."""
    notes: list[str] = []
    unknown_virt = {"kind": "unknown", "hypervisor": None, "evidence": [], "container": False}
    virt = _safely(notes, "virtualization", unknown_virt, virtualization)
    modules = _safely(notes, "kernel modules", {"loadable": None, "evidence": []}, kernel_modules)
    nodes = _safely(notes, "NUMA nodes", [], numa_nodes, notes)
    mem = _safely(notes, "memory", {"total_bytes": None, "available_bytes": None}, memory, notes)
    mismatch = _safely(notes, "NUMA memory", None, numa_memory_note, nodes, mem)
    if mismatch:
        notes.append(mismatch)
    return {
        "kernel": _safely(notes, "kernel release", "", kernel_release),
        "os": _safely(notes, "os-release", None, os_name),
        "virtualization": virt,
        "cpu": _safely(notes, "cpu", {"model": None, "logical_cpus": 0, "online": ""}, cpu, notes),
        "numa_nodes": nodes,
        "memory": mem,
        "thp": _safely(notes, "THP", dict.fromkeys(THP_KEYS), thp, notes),
        "hugetlb": _safely(notes, "hugetlb", [], hugetlb, notes),
        "memlock_bytes": _safely(notes, "memlock limit", None, memlock_bytes, notes),
        "iommu": _safely(
            notes,
            "IOMMU",
            {"present": False, "groups": 0, "mode": None, "evidence": [], "cmdline": {}},
            iommu,
            virt["kind"],
        ),
        "process": _safely(
            notes, "process", {"cpus_allowed": "", "mems_allowed": None}, process, notes
        ),
        "kernel_modules": modules,
        "gdrcopy": _safely(
            notes,
            "GDRCopy",
            {"gdrdrv": False, "libgdrapi": False, "available": False, "reason": "check failed"},
            gdrcopy,
            virt["kind"],
            modules,
        ),
        "torch_alloc_conf": _safely(notes, "PyTorch's allocator settings", None, collect_torch_alloc_conf, os.environ),
        "notes": notes,
    }
