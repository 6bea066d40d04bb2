"""Pure parsers for the procfs, sysfs and driver formats that `ferry doctor` reads.

Every function here takes text (or bytes, or plain values) and returns a value; none
touches the file system. Bad or empty input gives None (or an empty container where
that is the natural answer), never an exception, so that readers in host.py and
gpu.py can pass whatever they read straight through. The strict forms that raise
ValueError quoting the text (cpulist_ids, thp_setting) are for callers that must
tell garbage from "unknown" (rules.py). Work is bounded for every input: no range is
expanded beyond MAX_CPU_ID, no number has more than MAX_DIGITS digits.
"""

from __future__ import annotations

import re
from typing import Iterable

# --- small helpers -----------------------------------------------------------------

# Longest number any of these files holds (2**64 has 20 digits); longer is garbage.
MAX_DIGITS = 40


def parse_int(text: str | None, base: int = 10) -> int | None:
    """An integer from a one-value file such as "16\\n"; None for empty or garbage."""
    if text is None:
        return None
    text = text.strip()
    if len(text) > MAX_DIGITS:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


# --- transparent huge pages ----------------------------------------------------------


def thp_setting(text: str) -> str | None:
    """The selected value of a THP setting, strictly: "always [madvise] never" ->
    "madvise"; a file holding one bare word is that word; blank text is None
    (unknown). Raises ValueError quoting the text for anything else: several
    selections, several words with none selected, a stray bracket. The same rule
    as the library's parse_thp_setting (src/os/sysfs.cpp)."""
    words = text.split()
    if not words:
        return None
    selected = []
    for word in words:
        inner = word[1:-1]
        if len(word) >= 2 and word[0] == "[" and word[-1] == "]" and inner and "[" not in inner and "]" not in inner:
            selected.append(inner)
        elif "[" in word or "]" in word:
            raise ValueError(f"THP setting {text!r}: stray bracket in {word!r}")
    if len(selected) == 1:
        return selected[0]
    if not selected and len(words) == 1:
        return words[0]
    raise ValueError(f"THP setting {text!r}: expected one selected value such as 'always [madvise] never'")


def parse_thp_setting(text: str | None) -> str | None:
    """thp_setting(), leniently: None for empty, missing or garbled text."""
    if not text:
        return None
    try:
        return thp_setting(text)
    except ValueError:
        return None


# --- /proc/meminfo, node meminfo ------------------------------------------------------

_MEMINFO_LINE = re.compile(r"^(?:Node\s+\d+\s+)?([A-Za-z0-9_()]+):\s+([0-9]{1,%d})(?:\s+(kB))?\s*$" % MAX_DIGITS)


def parse_meminfo(text: str | None) -> dict[str, int]:
    """/proc/meminfo or /sys/devices/system/node/nodeN/meminfo as {field: value}.

    Values given in kB are converted to bytes; unitless values (HugePages_Total) stay
    counts. The "Node N " prefix of per-node files is dropped.
    """
    fields: dict[str, int] = {}
    if not text:
        return fields
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if not match:
            continue
        name, value, unit = match.groups()
        fields[name] = int(value) * 1024 if unit == "kB" else int(value)
    return fields


# --- /proc/cpuinfo --------------------------------------------------------------------


def _cpuinfo_fields(text: str) -> Iterable[tuple[str, str]]:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip().lower(), value.strip()


def parse_cpuinfo_model(text: str | None) -> str | None:
    """The CPU model name from /proc/cpuinfo ("model name" on x86; fallbacks elsewhere)."""
    if not text:
        return None
    found: dict[str, str] = {}
    for key, value in _cpuinfo_fields(text):
        if value and key not in found:
            found[key] = value
    for key in ("model name", "cpu model", "processor model", "cpu"):
        if key in found:
            return re.sub(r"\s+", " ", found[key])
    return None


def parse_cpuinfo_flags(text: str | None) -> list[str] | None:
    """The first processor's feature flags ("flags" on x86, "features" on Arm)."""
    if not text:
        return None
    for key, value in _cpuinfo_fields(text):
        if key in ("flags", "features"):
            return value.split()
    return None


# --- cpulists ----------------------------------------------------------------------

# Largest CPU (or node) id a cpulist may name: the kernel's NR_CPUS is at most
# 8192 today; the bound keeps "0-20000000" from expanding 20 million ids.
MAX_CPU_ID = (1 << 16) - 1
# Most ids all ranges of one cpulist may expand to, counting repeats.
_MAX_CPULIST_IDS = 1 << 17

# "N", "N-M" or the kernel's stride form "N-M:used/group" (every group of
# `group` ids starting at N, the first `used` of them).
_CPULIST_ITEM = re.compile(r"^([0-9]{1,10})(?:-([0-9]{1,10})(?::([0-9]{1,10})/([0-9]{1,10}))?)?$")


def cpulist_ids(text: str) -> set[int]:
    """A Linux cpulist ("0-3,8,10-11", "0-31:2/4") as a set of ids, strictly.

    Blank text is the empty set (a node with no CPUs writes "\\n"). Raises
    ValueError quoting the text for anything else, for an id above MAX_CPU_ID and
    for ranges that add up to more than 2**17 ids; TypeError for a non-string."""
    if not isinstance(text, str):
        raise TypeError(f"cpulist must be a string, got {type(text).__name__} {text!r}")
    stripped = text.strip()
    if not stripped:
        return set()
    ids: set[int] = set()
    budget = _MAX_CPULIST_IDS
    for item in stripped.split(","):
        match = _CPULIST_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"bad cpulist {text!r} (at {item!r})")
        first, last, used, group = match.groups()
        lo = int(first)
        hi = int(last) if last is not None else lo
        used_n, group_n = (int(used), int(group)) if group is not None else (1, 1)
        if hi < lo or used_n < 1 or group_n < used_n:
            raise ValueError(f"bad cpulist {text!r} (at {item!r})")
        if hi > MAX_CPU_ID:
            raise ValueError(f"bad cpulist {text!r} (at {item!r}: ids are at most {MAX_CPU_ID})")
        budget -= hi - lo + 1
        if budget < 0:
            raise ValueError(f"bad cpulist {text!r}: its ranges name more than {_MAX_CPULIST_IDS} ids")
        for base in range(lo, hi + 1, group_n):
            ids.update(range(base, min(base + used_n, hi + 1)))
    return ids


def parse_cpulist(text: str | None) -> list[int] | None:
    """cpulist_ids() as a sorted list, leniently: None for a missing or bad cpulist."""
    if not isinstance(text, str):
        return None
    try:
        return sorted(cpulist_ids(text))
    except ValueError:
        return None


def format_cpulist(cpus: Iterable[int]) -> str:
    """The compact cpulist of a set of CPU numbers: [0, 1, 2, 3, 8] -> "0-3,8"."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = previous = None
    for cpu in ordered:
        if previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            ranges.append(_cpu_range(start, previous))
        start = previous = cpu
    if start is not None:
        ranges.append(_cpu_range(start, previous))
    return ",".join(ranges)


def _cpu_range(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def compact_cpulist(text: str | None) -> str | None:
    """A cpulist re-written in compact form; None when it cannot be parsed."""
    cpus = parse_cpulist(text)
    return None if cpus is None else format_cpulist(cpus)


# --- huge page directory names --------------------------------------------------------

_HUGEPAGES_DIR = re.compile(r"^hugepages-([0-9]{1,%d})kB$" % MAX_DIGITS)


def hugepages_dir_size(name: str | None) -> int | None:
    """The page size in bytes named by a directory: "hugepages-2048kB" -> 2097152."""
    if not name:
        return None
    match = _HUGEPAGES_DIR.match(name.strip())
    return int(match.group(1)) * 1024 if match else None


# --- /proc/self/status -------------------------------------------------------------


def parse_proc_status(text: str | None) -> dict[str, str]:
    """/proc/<pid>/status as {field: value string}."""
    fields: dict[str, str] = {}
    if not text:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def status_cpus_allowed(text: str | None) -> str | None:
    """Cpus_allowed_list of /proc/self/status, compacted."""
    return compact_cpulist(parse_proc_status(text).get("Cpus_allowed_list"))


def status_mems_allowed(text: str | None) -> str | None:
    """Mems_allowed_list of /proc/self/status, compacted."""
    return compact_cpulist(parse_proc_status(text).get("Mems_allowed_list"))


# --- PCIe -----------------------------------------------------------------------

# Transfer rate per lane in GT/s, by generation.
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# Share of the raw bit rate that carries data after line encoding, by generation.
PCIE_ENCODING = {
    1: 8 / 10,
    2: 8 / 10,
    3: 128 / 130,
    4: 128 / 130,
    5: 128 / 130,
    6: 242 / 256,
}


def pcie_speed_to_gen(text: str | None) -> int | None:
    """The PCIe generation of a sysfs link speed: "32.0 GT/s PCIe" -> 5, "Unknown" -> None."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    if not match:
        return None
    rate = float(match.group(1))
    for gen, gt_per_s in PCIE_GT_PER_S.items():
        if abs(rate - gt_per_s) < 0.01:
            return gen
    return None


def pcie_link_width(text: str | None) -> int | None:
    """A sysfs link width ("16"); 0 (link down) and 255 (unknown) give None."""
    width = parse_int(text)
    if width is None or width <= 0 or width >= 255:
        return None
    return width


def link_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical per-direction data rate of a PCIe link in GB/s: gen 5, x16 -> 63.0."""
    if gen not in PCIE_GT_PER_S or not isinstance(width, int) or width <= 0:
        return None
    bits_per_s = PCIE_GT_PER_S[gen] * 1e9 * width * PCIE_ENCODING[gen]
    return round(bits_per_s / 8 / 1e9, 1)


def parse_pci_resource(text: str | None) -> list[int] | None:
    """Sizes in bytes of the regions in a sysfs `resource` file; unused regions are 0.

    Each line is "start end flags" in hex; the size is end - start + 1.
    """
    if not text:
        return None
    sizes: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            return None
        try:
            start, end = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            return None
        sizes.append(end - start + 1 if end > start else 0)
    return sizes


def nvidia_bar1_region(sizes: list[int] | None) -> tuple[int | None, int | None]:
    """(resource index, size) of what NVIDIA calls BAR1: the second BAR in use.

    With a 32-bit BAR0 that is region 1; with a 64-bit BAR0 (Hopper, e.g. H100/H200)
    BAR0 fills regions 0-1 and BAR1 is region 2. Only the six standard BARs count
    (region 6 is the expansion ROM).
    """
    used = [index for index, size in enumerate((sizes or [])[:6]) if size > 0]
    if len(used) < 2:
        return None, None
    return used[1], sizes[used[1]]


def normalize_pci_bus_id(bus_id: str | None) -> str | None:
    """A PCI address as sysfs names it: "00000000:0A:00.0" -> "0000:0a:00.0"."""
    if not bus_id:
        return None
    match = re.match(
        r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*$",
        bus_id,
    )
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return (
        f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:"
        f"{int(device, 16):02x}.{int(function)}"
    )


def parse_numa_node(text: str | None) -> int | None:
    """A sysfs numa_node value; -1 (no affinity) gives None."""
    node = parse_int(text)
    return node if node is not None and node >= 0 else None


# --- resource limits --------------------------------------------------------------


def rlimit_bytes(value: int | None, infinity: int) -> int | None:
    """An RLIMIT value in bytes; RLIM_INFINITY (unlimited) gives None."""
    if value is None or value == infinity or value < 0:
        return None
    return value


def parse_limits(text: str | None) -> dict[str, dict[str, int | None]]:
    """/proc/<pid>/limits as {"Max locked memory": {"soft": n, "hard": n}}.

    "unlimited" gives None. Lines whose values are not numbers are skipped.
    """
    limits: dict[str, dict[str, int | None]] = {}
    if not text:
        return limits
    for line in text.splitlines()[1:]:
        match = re.match(r"^(Max [A-Za-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if not match:
            continue
        name, soft, hard = match.groups()
        values = [_limit_value(soft), _limit_value(hard)]
        if False in values:
            continue
        limits[name] = {"soft": values[0], "hard": values[1]}
    return limits


def _limit_value(text: str) -> int | None | bool:
    if text == "unlimited":
        return None
    number = parse_int(text)
    return False if number is None else number


def memlock_from_limits(text: str | None) -> tuple[bool, int | None]:
    """(found, soft memlock limit in bytes or None for unlimited) from /proc/self/limits."""
    entry = parse_limits(text).get("Max locked memory")
    if entry is None:
        return False, None
    return True, entry["soft"]


# --- /etc/os-release and the kernel command line ---------------------------------------


def parse_os_release(text: str | None) -> dict[str, str]:
    """/etc/os-release as {KEY: value} with quotes removed."""
    fields: dict[str, str] = {}
    if not text:
        return fields
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key] = value
    return fields


def os_pretty_name(text: str | None) -> str | None:
    """PRETTY_NAME of /etc/os-release, else NAME VERSION, else None."""
    fields = parse_os_release(text)
    if fields.get("PRETTY_NAME"):
        return fields["PRETTY_NAME"]
    if fields.get("NAME"):
        return " ".join(filter(None, [fields["NAME"], fields.get("VERSION")]))
    return None


def parse_cmdline(text: str | None) -> dict[str, str | None]:
    """Kernel parameters before any " -- " as {name: value or None for bare flags}."""
    params: dict[str, str | None] = {}
    if not text:
        return params
    for word in text.split():
        if word == "--":
            break
        name, sep, value = word.partition("=")
        params[name] = value if sep else None
    return params


IOMMU_CMDLINE_KEYS = (
    "iommu",
    "intel_iommu",
    "amd_iommu",
    "iommu.passthrough",
    "iommu.strict",
    "swiotlb",
)


def iommu_cmdline_options(text: str | None) -> dict[str, str | None]:
    """The IOMMU-related kernel parameters present on the command line."""
    params = parse_cmdline(text)
    return {key: params[key] for key in IOMMU_CMDLINE_KEYS if key in params}


def iommu_mode_from_cmdline(text: str | None) -> str | None:
    """"passthrough", "off" or "translated" as asked for on the kernel command line."""
    params = parse_cmdline(text)
    iommu = params.get("iommu") or ""
    intel = (params.get("intel_iommu") or "").split(",")
    amd = (params.get("amd_iommu") or "").split(",")
    if "pt" in iommu.split(",") or params.get("iommu.passthrough") in ("1", "on", "y"):
        return "passthrough"
    if iommu == "off" or "off" in intel or "off" in amd:
        return "off"
    if "on" in intel or "force" in iommu.split(",") or "on" in amd:
        return "translated"
    return None


_GROUP_TYPE_MODES = {
    "DMA": "translated",
    "DMA-FQ": "translated",
    "identity": "passthrough",
    "blocked": "blocked",
    "unmanaged": "unmanaged",
}


def iommu_mode_from_group_types(types: Iterable[str | None]) -> str | None:
    """The IOMMU mode from /sys/kernel/iommu_groups/*/type values; "mixed" if they differ."""
    modes = {_GROUP_TYPE_MODES.get(t.strip(), t.strip()) for t in types if t and t.strip()}
    if not modes:
        return None
    if len(modes) == 1:
        return modes.pop()
    return "mixed"


# --- CUDA ---------------------------------------------------------------------------


def cuda_version_string(version: int | None) -> str | None:
    """A CUDA version integer as text: 13000 -> "13.0", 12040 -> "12.4"."""
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


# --- virtualization -----------------------------------------------------------------

# Substrings of DMI sys_vendor / product_name / bios_vendor, and the hypervisor they name.
_DMI_HYPERVISORS = (
    ("firecracker", "Firecracker"),
    ("qemu", "QEMU"),
    ("kvm", "KVM"),
    ("amazon ec2", "Amazon EC2"),
    ("google compute engine", "Google Compute Engine"),
    ("vmware", "VMware"),
    ("virtualbox", "VirtualBox"),
    ("innotek", "VirtualBox"),
    ("xen", "Xen"),
    ("bochs", "Bochs"),
    ("parallels", "Parallels"),
    ("openstack", "OpenStack"),
    ("cloud hypervisor", "Cloud Hypervisor"),
    ("microsoft corporation", "Hyper-V"),
)

# Hypervisors built on KVM: a guest of theirs is reported as kind "kvm".
_KVM_BASED = {"KVM", "QEMU", "Amazon EC2", "Google Compute Engine", "OpenStack", "Cloud Hypervisor"}

_CLOCKSOURCE_HYPERVISORS = (
    ("kvm-clock", "KVM"),
    ("hyperv_clocksource", "Hyper-V"),
    ("xen", "Xen"),
)

# gVisor reports this fixed build string in /proc/version and uname -v.
GVISOR_VERSION_STAMP = "#1 SMP Sun Jan 10 15:06:54 PST 2016"


def dmi_hypervisor(dmi: dict[str, str | None] | None) -> tuple[str | None, list[str]]:
    """The hypervisor named by DMI strings, with evidence lines."""
    if not dmi:
        return None, []
    for field in ("sys_vendor", "product_name", "bios_vendor", "board_vendor"):
        value = dmi.get(field)
        if not value:
            continue
        for needle, name in _DMI_HYPERVISORS:
            if needle in value.lower():
                if name == "Hyper-V" and "virtual" not in " ".join(
                    v.lower() for v in dmi.values() if v
                ):
                    continue
                return name, [f"dmi {field}: {value.strip()}"]
    return None, []


def clocksource_hypervisor(clocksources: Iterable[str] | None) -> tuple[str | None, list[str]]:
    """The hypervisor named by an available clocksource (kvm-clock, hyperv, xen)."""
    for source in clocksources or ():
        for needle, name in _CLOCKSOURCE_HYPERVISORS:
            if source.startswith(needle):
                return name, [f"clocksource available: {source}"]
    return None, []


def gvisor_evidence(
    kernel_release: str | None, proc_version: str | None, mountinfo: str | None
) -> tuple[list[str], list[str]]:
    """(strong, weak) evidence lines that this is a gVisor sandbox."""
    strong: list[str] = []
    weak: list[str] = []
    if proc_version and ("gvisor" in proc_version.lower() or GVISOR_VERSION_STAMP in proc_version):
        strong.append("/proc/version mentions gVisor (or its fixed 2016 build stamp)")
    if kernel_release and "gvisor" in kernel_release.lower():
        strong.append(f"kernel release '{kernel_release}' names gVisor")
    elif kernel_release == "4.4.0":
        weak.append("kernel release is 4.4.0, the version gVisor reports")
    if mountinfo and re.search(r" / / .* - 9p \S+ .*trans=fd", mountinfo):
        weak.append("root file system is 9p over file descriptors (gVisor gofer)")
    return strong, weak


def firecracker_evidence(
    kernel_release: str | None,
    cmdline: str | None,
    acpi_oem_ids: Iterable[str],
    platform_devices: Iterable[str],
    dmi_present: bool | None,
) -> tuple[list[str], list[str]]:
    """(strong, weak) evidence lines that this is a Firecracker microVM."""
    strong: list[str] = []
    weak: list[str] = []
    oem_ids = {oem.strip() for oem in acpi_oem_ids if oem}
    if any(oem.upper().startswith("FIRECK") for oem in oem_ids):
        strong.append("ACPI table OEM id: FIRECK")
    cmdline = cmdline or ""
    if "firecracker" in cmdline.lower():
        strong.append("kernel cmdline mentions firecracker")
    if kernel_release and "-fc-" in kernel_release:
        weak.append(f"kernel release contains '-fc-' ({kernel_release})")
    params = parse_cmdline(cmdline)
    if params.get("reboot") == "k" and params.get("panic") == "1":
        weak.append("kernel cmdline has 'reboot=k panic=1' (Firecracker's default boot args)")
    if "virtio_mmio.device" in params:
        weak.append("kernel cmdline declares virtio_mmio devices")
    mmio = [d for d in platform_devices if "virtio_mmio" in d or d.startswith("LNRO0005")]
    if mmio:
        weak.append(f"virtio-mmio platform devices: {', '.join(sorted(mmio)[:3])}")
    if dmi_present is False:
        weak.append("no DMI/SMBIOS tables (microVMs such as Firecracker have none)")
    return strong, weak


def classify_virtualization(
    *,
    cpu_flags: list[str] | None,
    kernel_release: str | None = None,
    proc_version: str | None = None,
    cmdline: str | None = None,
    dmi: dict[str, str | None] | None = None,
    clocksources: Iterable[str] | None = None,
    xen_type: str | None = None,
    acpi_oem_ids: Iterable[str] = (),
    platform_devices: Iterable[str] = (),
    mountinfo: str | None = None,
) -> dict:
    """The virtualization kind from what the host readers found, with the evidence.

    `dmi` is None when /sys/class/dmi/id is absent. Kinds: "gvisor", "firecracker",
    "kvm", "vm" (another hypervisor, named in "hypervisor"), "bare-metal" (only when
    cpuinfo was read and has no "hypervisor" flag) and "unknown".
    """
    evidence: list[str] = []
    has_flag = None if cpu_flags is None else "hypervisor" in cpu_flags
    if has_flag:
        evidence.append("cpuinfo flags: hypervisor")
    elif has_flag is False:
        evidence.append("cpuinfo flags: no 'hypervisor' flag")
    else:
        evidence.append("cpuinfo flags: not readable")

    hypervisor, lines = dmi_hypervisor(dmi)
    evidence += lines
    clock_name, lines = clocksource_hypervisor(clocksources)
    evidence += lines
    if xen_type:
        evidence.append(f"/sys/hypervisor/type: {xen_type.strip()}")
        hypervisor = hypervisor or "Xen"
    hypervisor = hypervisor or clock_name

    gv_strong, gv_weak = gvisor_evidence(kernel_release, proc_version, mountinfo)
    fc_strong, fc_weak = firecracker_evidence(
        kernel_release,
        cmdline,
        acpi_oem_ids,
        platform_devices,
        dmi is not None,
    )
    if not has_flag:
        fc_weak = [line for line in fc_weak if not line.startswith("no DMI")]

    if gv_strong or len(gv_weak) >= 2:
        return _virt("gvisor", hypervisor, evidence + gv_strong + gv_weak)
    evidence += gv_strong + gv_weak
    if fc_strong or (len(fc_weak) >= 2 and has_flag):
        return _virt("firecracker", "Firecracker", evidence + fc_strong + fc_weak)
    evidence += fc_strong + fc_weak
    if hypervisor in _KVM_BASED or clock_name == "KVM":
        return _virt("kvm", hypervisor, evidence)
    if hypervisor or has_flag:
        return _virt("vm", hypervisor, evidence)
    if has_flag is False:
        return _virt("bare-metal", None, evidence)
    return _virt("unknown", None, evidence)


def _virt(kind: str, hypervisor: str | None, evidence: list[str]) -> dict:
    return {"kind": kind, "hypervisor": hypervisor, "evidence": evidence}


def acpi_oem_id(header: bytes | None) -> str | None:
    """The OEM id (bytes 10-15) of an ACPI table header, e.g. b"DSDT....FIRECK" -> "FIRECK"."""
    if not header or len(header) < 16:
        return None
    oem = header[10:16].rstrip(b"\x00 ").decode("ascii", "replace").strip()
    return oem or None


def container_evidence(
    cgroup: str | None, dockerenv: bool, containerenv: bool
) -> tuple[bool, list[str]]:
    """(in a container, evidence) from /proc/1/cgroup and marker files.

    /.dockerenv alone is not enough: root file systems built from Docker images carry
    it into VMs too.
    """
    evidence: list[str] = []
    strong = False
    if containerenv:
        evidence.append("/run/.containerenv exists")
        strong = True
    for line in (cgroup or "").splitlines():
        path = line.split(":", 2)[-1]
        if re.search(r"docker|kubepods|containerd|libpod|lxc|crio", path):
            evidence.append(f"/proc/1/cgroup path: {path}")
            strong = True
            break
    if dockerenv:
        evidence.append("/.dockerenv exists" + ("" if strong else " (weak: Docker-built images carry it)"))
    return strong, evidence
