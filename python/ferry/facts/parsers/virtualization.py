"""Virtualization and container evidence: DMI, clocksource, gVisor, Firecracker,
ACPI and cgroup signs, and the kind they add up to."""

from __future__ import annotations

import re
from typing import Iterable

from .kernel import parse_cmdline

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
