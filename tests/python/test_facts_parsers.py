"""Unit tests of the pure procfs/sysfs parsers of `ferry doctor` (python/ferry/facts/parsers.py).

Inputs are real file contents copied from Linux machines (a Firecracker VM with an H200,
a bare-metal two-socket server, gVisor) plus the edge cases every parser must survive:
empty text, garbage, missing brackets. The facts package is loaded from its directory,
not through `ferry`, whose __init__ imports a native extension that may not be built.
"""

import resource
import sys
from pathlib import Path

import pytest



from ferry.facts import parsers as p  # noqa: E402

GARBAGE = ["", None, "\n", "\x00\x01garbage", "[[[", "]", "-1-2"]


# --- THP -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never", "always"),
        ("always defer defer+madvise [madvise] never\n", "madvise"),
        ("always defer [defer+madvise] madvise never", "defer+madvise"),
        ("always within_size advise [never] deny force\n", "never"),
        ("always [inherit] madvise never\n", "inherit"),
        ("never\n", "never"),  # one bare word: the value itself
        ("always madvise never", None),  # missing brackets: ambiguous
        ("[always] [never]", None),  # two selections: garbage
        ("always [madvise never", None),  # unclosed bracket
        ("", None),
        (None, None),
        ("   \n", None),
    ],
)
def test_parse_thp_setting(text, expected):
    assert p.parse_thp_setting(text) == expected


# --- meminfo -------------------------------------------------------------------------

MEMINFO = """\
MemTotal:       24683656 kB
MemFree:        24542468 kB
MemAvailable:   24459112 kB
Buffers:            2276 kB
Active(anon):      10240 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
"""

NODE_MEMINFO = """\
Node 0 MemTotal:        3761952 kB
Node 0 MemFree:         3347024 kB
Node 0 HugePages_Total:     0
"""


def test_parse_meminfo_converts_kb_to_bytes_and_keeps_counts():
    info = p.parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 24683656 * 1024
    assert info["MemAvailable"] == 24459112 * 1024
    assert info["Active(anon)"] == 10240 * 1024
    assert info["HugePages_Total"] == 0
    assert info["Hugepagesize"] == 2 * 1024 * 1024


def test_parse_meminfo_strips_node_prefix():
    info = p.parse_meminfo(NODE_MEMINFO)
    assert info == {"MemTotal": 3761952 * 1024, "MemFree": 3347024 * 1024, "HugePages_Total": 0}


@pytest.mark.parametrize("text", GARBAGE + ["MemTotal: lots kB", "MemTotal 12 kB"])
def test_parse_meminfo_garbage_gives_empty(text):
    assert p.parse_meminfo(text) == {}


# --- cpuinfo -------------------------------------------------------------------------

CPUINFO_X86 = """\
processor\t: 0
vendor_id\t: GenuineIntel
model\t\t: 167
model name\t: Intel(R) Xeon(R)   Processor
flags\t\t: fpu vme de pse tsc hypervisor lahf_lm

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme de pse tsc hypervisor lahf_lm
"""

CPUINFO_ARM = """\
processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


def test_parse_cpuinfo_model_x86_collapses_spaces():
    assert p.parse_cpuinfo_model(CPUINFO_X86) == "Intel(R) Xeon(R) Processor"


def test_parse_cpuinfo_model_without_model_name():
    assert p.parse_cpuinfo_model(CPUINFO_ARM) is None
    assert p.parse_cpuinfo_model("cpu\t\t: POWER10 (architected), altivec supported\n") == (
        "POWER10 (architected), altivec supported"
    )


def test_parse_cpuinfo_flags():
    assert "hypervisor" in p.parse_cpuinfo_flags(CPUINFO_X86)
    assert p.parse_cpuinfo_flags(CPUINFO_ARM)[:2] == ["fp", "asimd"]


@pytest.mark.parametrize("text", GARBAGE)
def test_cpuinfo_garbage(text):
    assert p.parse_cpuinfo_model(text) is None
    assert p.parse_cpuinfo_flags(text) is None


# --- cpulists ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
        ("0", [0]),
        ("0-1", [0, 1]),
        ("0-15", list(range(16))),
        ("5,1,3", [1, 3, 5]),
        ("0-3,2-5", [0, 1, 2, 3, 4, 5]),
        ("\n", []),  # a memory-only NUMA node
        ("", []),
        (None, None),
        ("0-", None),
        ("a-b", None),
        ("3-1", None),
        ("0,,1", None),
        ("0-7:2", None),
        ("garbage", None),
    ],
)
def test_parse_cpulist(text, expected):
    assert p.parse_cpulist(text) == expected


@pytest.mark.parametrize(
    "cpus, expected",
    [
        ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
        ([], ""),
        ([7], "7"),
        ([3, 1, 2, 2], "1-3"),
        (range(0, 16), "0-15"),
        ({0, 2, 4}, "0,2,4"),
    ],
)
def test_format_cpulist(cpus, expected):
    assert p.format_cpulist(cpus) == expected


@pytest.mark.parametrize("text", ["0-3,8,10-11", "0", "0-127", "1,3,5-9,64-71"])
def test_cpulist_round_trip(text):
    assert p.format_cpulist(p.parse_cpulist(text)) == text


def test_compact_cpulist():
    assert p.compact_cpulist("0,1,2,3,8\n") == "0-3,8"
    assert p.compact_cpulist("junk") is None


# --- hugetlb directory names ------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("hugepages-2048kB", 2 * 1024 * 1024),
        ("hugepages-1048576kB", 1024 * 1024 * 1024),
        ("hugepages-64kB", 64 * 1024),
        ("hugepages-2048", None),
        ("hugepages-2MB", None),
        ("khugepaged", None),
        ("", None),
        (None, None),
    ],
)
def test_hugepages_dir_size(name, expected):
    assert p.hugepages_dir_size(name) == expected


# --- /proc/self/status ------------------------------------------------------------------

STATUS = """\
Name:\tpython3
Umask:\t0022
State:\tR (running)
Cpus_allowed:\tffff
Cpus_allowed_list:\t0-3,8
Mems_allowed:\t00000000,00000003
Mems_allowed_list:\t0-1
voluntary_ctxt_switches:\t1
"""


def test_status_fields():
    assert p.status_cpus_allowed(STATUS) == "0-3,8"
    assert p.status_mems_allowed(STATUS) == "0-1"
    assert p.parse_proc_status(STATUS)["State"] == "R (running)"


def test_status_missing_fields():
    gvisor_like = "Name:\tpython3\nCpus_allowed_list:\t0-7\n"
    assert p.status_cpus_allowed(gvisor_like) == "0-7"
    assert p.status_mems_allowed(gvisor_like) is None


@pytest.mark.parametrize("text", GARBAGE + ["Cpus_allowed_list:\tnot-a-list"])
def test_status_garbage(text):
    assert p.status_cpus_allowed(text) is None
    assert p.status_mems_allowed(text) is None


# --- PCIe -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, gen",
    [
        ("32.0 GT/s PCIe\n", 5),
        ("16.0 GT/s PCIe", 4),
        ("16.0 GT/s", 4),
        ("8.0 GT/s PCIe", 3),
        ("8 GT/s", 3),
        ("5.0 GT/s PCIe", 2),
        ("2.5 GT/s", 1),
        ("2.5 GT/s PCIe", 1),
        ("64.0 GT/s PCIe", 6),
        ("Unknown\n", None),
        ("Unknown speed", None),
        ("3.0 GT/s", None),
        ("", None),
        (None, None),
        ("GT/s", None),
    ],
)
def test_pcie_speed_to_gen(text, gen):
    assert p.pcie_speed_to_gen(text) == gen


@pytest.mark.parametrize(
    "text, width", [("16\n", 16), ("8", 8), ("1", 1), ("0", None), ("255", None), ("x16", None), ("", None)]
)
def test_pcie_link_width(text, width):
    assert p.pcie_link_width(text) == width


@pytest.mark.parametrize(
    "gen, width, gbps",
    [
        (5, 16, 63.0),
        (4, 16, 31.5),
        (3, 16, 15.8),
        (2, 16, 8.0),
        (1, 16, 4.0),
        (1, 1, 0.2),
        (6, 16, 121.0),
        (5, 8, 31.5),
        (None, 16, None),
        (5, None, None),
        (7, 16, None),
        (5, 0, None),
    ],
)
def test_link_gbps(gen, width, gbps):
    assert p.link_gbps(gen, width) == gbps


# The resource file of an H200 in a Firecracker VM: BAR0 is 64-bit (regions 0-1),
# BAR1 (256 GiB) is region 2, BAR3 (32 MiB) region 4.
H200_RESOURCE = """\
0x0000104002000000 0x0000104002ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000100000000000 0x0000103fffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000104000000000 0x0000104001ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
"""

# An older GPU: BAR0 32-bit (16 MiB), BAR1 256 MiB at region 1, BAR3 32 MiB at region 3.
LEGACY_RESOURCE = """\
0x00000000de000000 0x00000000deffffff 0x0000000000040200
0x000000c000000000 0x000000c00fffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000c010000000 0x000000c011ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x000000000000e000 0x000000000000e07f 0x0000000000040101
0x00000000df000000 0x00000000df07ffff 0x0000000000046200
"""


def test_parse_pci_resource_sizes():
    sizes = p.parse_pci_resource(H200_RESOURCE)
    assert sizes == [16 << 20, 0, 256 << 30, 0, 32 << 20, 0, 0]


@pytest.mark.parametrize(
    "text, region, size",
    [(H200_RESOURCE, 2, 256 << 30), (LEGACY_RESOURCE, 1, 256 << 20)],
)
def test_nvidia_bar1_region(text, region, size):
    assert p.nvidia_bar1_region(p.parse_pci_resource(text)) == (region, size)


def test_nvidia_bar1_region_unknown():
    assert p.nvidia_bar1_region(None) == (None, None)
    assert p.nvidia_bar1_region([0] * 7) == (None, None)
    assert p.nvidia_bar1_region([16 << 20, 0, 0]) == (None, None)
    # Region 6 (expansion ROM) is not a BAR.
    assert p.nvidia_bar1_region([16 << 20, 0, 0, 0, 0, 0, 512 << 10]) == (None, None)


@pytest.mark.parametrize("text", ["", None, "0x0 0x1", "zz yy xx", "0x10 0x20 0x0 0x0"])
def test_parse_pci_resource_garbage(text):
    assert p.parse_pci_resource(text) is None


@pytest.mark.parametrize(
    "bus_id, expected",
    [
        ("0000:00:05.0", "0000:00:05.0"),
        ("00000000:00:06.0", "0000:00:06.0"),  # NVML's 8-digit domain
        ("00000000:C1:00.0", "0000:c1:00.0"),
        ("0000:4B:00.0", "0000:4b:00.0"),
        ("0001:00:00.1", "0001:00:00.1"),
        ("10000:01:00.0", "10000:01:00.0"),  # VMD domains have five digits
        ("3b:00.0", "0000:3b:00.0"),
        ("0000:00:05", None),
        ("0000:00:05.8", None),
        ("nonsense", None),
        ("", None),
        (None, None),
    ],
)
def test_normalize_pci_bus_id(bus_id, expected):
    assert p.normalize_pci_bus_id(bus_id) == expected


@pytest.mark.parametrize("text, node", [("0\n", 0), ("1", 1), ("-1\n", None), ("", None), ("x", None)])
def test_parse_numa_node(text, node):
    assert p.parse_numa_node(text) == node


# --- limits -----------------------------------------------------------------------

LIMITS = """\
Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max stack size            8388608              unlimited            bytes     
Max processes             96364                96364                processes 
Max locked memory         8388608              8388608              bytes     
Max realtime timeout      unlimited            unlimited            us        
"""


def test_parse_limits():
    limits = p.parse_limits(LIMITS)
    assert limits["Max locked memory"] == {"soft": 8388608, "hard": 8388608}
    assert limits["Max stack size"] == {"soft": 8388608, "hard": None}
    assert limits["Max cpu time"] == {"soft": None, "hard": None}


def test_memlock_from_limits():
    assert p.memlock_from_limits(LIMITS) == (True, 8388608)
    unlimited = LIMITS.replace("8388608              8388608", "unlimited            unlimited")
    assert p.memlock_from_limits(unlimited) == (True, None)
    assert p.memlock_from_limits("") == (False, None)
    assert p.memlock_from_limits("garbage\nMax locked memory  lots  lots  bytes") == (False, None)


def test_rlimit_bytes():
    assert p.rlimit_bytes(8388608, resource.RLIM_INFINITY) == 8388608
    assert p.rlimit_bytes(resource.RLIM_INFINITY, resource.RLIM_INFINITY) is None
    assert p.rlimit_bytes(0, resource.RLIM_INFINITY) == 0
    assert p.rlimit_bytes(None, resource.RLIM_INFINITY) is None


# --- os-release, cmdline, IOMMU ---------------------------------------------------------


def test_os_pretty_name():
    text = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
    assert p.os_pretty_name(text) == "Debian GNU/Linux 12 (bookworm)"
    assert p.os_pretty_name("NAME='Alpine Linux'\nVERSION=3.20\n") == "Alpine Linux 3.20"
    assert p.os_pretty_name("# comment only\n") is None
    assert p.os_pretty_name(None) is None


FC_CMDLINE = (
    "mitigations=auto,no_guest_host console=ttyS0 quiet reboot=k panic=1 nomodule "
    "swiotlb=noforce rdinit=/process_api -- --firecracker-init --addr 0.0.0.0:2024"
)


def test_parse_cmdline_stops_at_double_dash():
    params = p.parse_cmdline(FC_CMDLINE)
    assert params["reboot"] == "k"
    assert params["nomodule"] is None
    assert "--firecracker-init" not in params
    assert p.parse_cmdline("") == {}


@pytest.mark.parametrize(
    "cmdline, mode",
    [
        ("BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt", "passthrough"),
        ("amd_iommu=on iommu.passthrough=1", "passthrough"),
        ("intel_iommu=on", "translated"),
        ("intel_iommu=on,sm_on", "translated"),
        ("intel_iommu=off", "off"),
        ("iommu=off", "off"),
        ("quiet splash", None),
        ("", None),
        (None, None),
    ],
)
def test_iommu_mode_from_cmdline(cmdline, mode):
    assert p.iommu_mode_from_cmdline(cmdline) == mode


def test_iommu_cmdline_options():
    assert p.iommu_cmdline_options("intel_iommu=on iommu=pt swiotlb=noforce quiet") == {
        "iommu": "pt",
        "intel_iommu": "on",
        "swiotlb": "noforce",
    }


@pytest.mark.parametrize(
    "types, mode",
    [
        (["DMA-FQ\n", "DMA-FQ\n"], "translated"),
        (["DMA"], "translated"),
        (["identity", "identity"], "passthrough"),
        (["identity", "DMA"], "mixed"),
        (["blocked"], "blocked"),
        ([], None),
        ([None, ""], None),
    ],
)
def test_iommu_mode_from_group_types(types, mode):
    assert p.iommu_mode_from_group_types(types) == mode


# --- CUDA versions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "version, text",
    [(13000, "13.0"), (12040, "12.4"), (12080, "12.8"), (11080, "11.8"), (0, None), (None, None), ("13000", None), (True, None)],
)
def test_cuda_version_string(version, text):
    assert p.cuda_version_string(version) == text


# --- virtualization ----------------------------------------------------------------

HOST_FLAGS = ["fpu", "vme", "lahf_lm"]
GUEST_FLAGS = HOST_FLAGS + ["hypervisor"]


def test_classify_firecracker_from_this_kind_of_vm():
    facts = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS,
        kernel_release="6.18.44-fc-v657-gpu",
        proc_version="Linux version 6.18.44-fc-v657-gpu (builder@sandboxing) #1 SMP",
        cmdline=FC_CMDLINE,
        dmi=None,
        clocksources=["tsc", "kvm-clock"],
        acpi_oem_ids=["FIRECK"],
    )
    assert facts["kind"] == "firecracker"
    assert facts["hypervisor"] == "Firecracker"
    assert "cpuinfo flags: hypervisor" in facts["evidence"]
    assert "ACPI table OEM id: FIRECK" in facts["evidence"]
    assert any("-fc-" in line for line in facts["evidence"])


def test_classify_firecracker_from_weak_hints_only():
    facts = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS,
        kernel_release="6.1.0",
        cmdline="console=ttyS0 reboot=k panic=1 pci=off virtio_mmio.device=4K@0xd0000000:5",
        dmi=None,
    )
    assert facts["kind"] == "firecracker"


def test_classify_kvm_qemu():
    facts = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS,
        kernel_release="6.8.0-60-generic",
        cmdline="BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro",
        dmi={"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"},
        clocksources=["kvm-clock", "tsc", "acpi_pm"],
    )
    assert facts["kind"] == "kvm"
    assert facts["hypervisor"] == "QEMU"
    assert "dmi sys_vendor: QEMU" in facts["evidence"]


def test_classify_other_hypervisors():
    vmware = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS, dmi={"sys_vendor": "VMware, Inc.", "product_name": "VMware7,1"}
    )
    assert (vmware["kind"], vmware["hypervisor"]) == ("vm", "VMware")
    hyperv = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS,
        dmi={"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"},
        clocksources=["hyperv_clocksource_tsc_page", "acpi_pm"],
    )
    assert (hyperv["kind"], hyperv["hypervisor"]) == ("vm", "Hyper-V")
    xen = p.classify_virtualization(cpu_flags=GUEST_FLAGS, dmi={}, xen_type="xen\n")
    assert (xen["kind"], xen["hypervisor"]) == ("vm", "Xen")
    nameless = p.classify_virtualization(cpu_flags=GUEST_FLAGS, dmi={"sys_vendor": "Acme"})
    assert (nameless["kind"], nameless["hypervisor"]) == ("vm", None)


def test_classify_gvisor():
    facts = p.classify_virtualization(
        cpu_flags=GUEST_FLAGS,
        kernel_release="4.4.0",
        proc_version="Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n",
        dmi=None,
    )
    assert facts["kind"] == "gvisor"
    assert any("gVisor" in line for line in facts["evidence"])
    newer = p.classify_virtualization(cpu_flags=None, kernel_release="4.19.0-gvisor")
    assert newer["kind"] == "gvisor"


def test_classify_gvisor_from_weak_hints():
    mountinfo = "1 0 0:1 / / rw,relatime - 9p none rw,trans=fd,rfdno=4,wfdno=4\n"
    facts = p.classify_virtualization(cpu_flags=HOST_FLAGS, kernel_release="4.4.0", mountinfo=mountinfo)
    assert facts["kind"] == "gvisor"


def test_classify_bare_metal_only_without_hypervisor_flag():
    facts = p.classify_virtualization(
        cpu_flags=HOST_FLAGS,
        kernel_release="6.8.0-60-generic",
        cmdline="BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt",
        dmi={"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR"},
        clocksources=["tsc", "hpet", "acpi_pm"],
    )
    assert facts == {
        "kind": "bare-metal",
        "hypervisor": None,
        "evidence": ["cpuinfo flags: no 'hypervisor' flag"],
    }


def test_classify_unknown_without_cpuinfo():
    facts = p.classify_virtualization(cpu_flags=None)
    assert facts["kind"] == "unknown"
    assert facts["evidence"] == ["cpuinfo flags: not readable"]


def test_acpi_oem_id():
    header = b"DSDTS\x0f\x00\x00\x02wFIRECKFCVMDSDT\x00\x00\x00\x00"
    assert p.acpi_oem_id(header) == "FIRECK"
    assert p.acpi_oem_id(b"APIC\x00\x00\x00\x00\x01\x00BOCHS BXPC    ") == "BOCHS"
    assert p.acpi_oem_id(b"short") is None
    assert p.acpi_oem_id(None) is None
    assert p.acpi_oem_id(b"FACP\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00") is None


def test_container_evidence():
    in_docker = "0::/docker/4f3c2a\n"
    assert p.container_evidence(in_docker, False, False) == (True, ["/proc/1/cgroup path: /docker/4f3c2a"])
    assert p.container_evidence("0::/kubepods.slice/pod1/cri-containerd-ab\n", False, False)[0]
    assert p.container_evidence(None, False, True)[0]
    alone, evidence = p.container_evidence("0::/\n", True, False)
    assert alone is False and "weak" in evidence[0]
    assert p.container_evidence("", False, False) == (False, [])
