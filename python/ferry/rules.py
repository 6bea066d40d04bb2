"""Findings engine of `ferry doctor`: rules that turn facts and measurements into advice.

What this file holds:
  - `Finding`: one piece of advice (id, severity, title, evidence, fix).
  - `Rule`: a check with a stable id, a default severity, a title and a one-line doc;
    its check returns a `Verdict` (evidence, fix, and a severity only where the
    evidence raises or lowers the rule's), and the Finding takes id, title and
    severity from the rule: RULES is the one place they are written.
  - `RULES`: the table of every rule, in one place (at the bottom of the file).
  - `evaluate(facts, measurements)`: runs every rule, returns findings sorted by
    severity (critical, warning, info) then id.
The doctor's report shows them (ferry/doctor/report.py).

Invariants:
  - Pure Python standard library; no CUDA, no I/O. Facts and measurements are plain
    dicts (the schemas are in `ferry doctor`'s collector); this module never reads the
    machine itself.
  - Missing input means "unknown": an absent key or a None value makes a rule stay
    silent rather than guess. Only a value of the wrong type or shape is an error.
  - A rule that raises never kills the report: `evaluate` turns the exception into an
    info finding "rule X could not be evaluated: <error>" under the rule's id.
  - Rule ids are lowercase-dashed and stable: scripts and docs refer to them.
  - Evidence quotes figures with units (GB/s are 10^9 bytes per second, one
    direction; sizes are binary: KiB, MiB, GiB). Every finding carries a concrete fix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from .units import GiB, KiB, MiB, link_limit
from .units import fmt_bytes as _fmt_bytes
from .units import fmt_gbps as _gbps
from .units import percent as _pct

from .facts.parsers import cpulist_ids, thp_setting

__all__ = [
    "SEVERITIES",
    "Finding",
    "Rule",
    "RULES",
    "Verdict",
    "evaluate",
    "parse_cpulist",
]

SEVERITIES = ("critical", "warning", "info")
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}

# Thresholds, each with the reason beside it.
PINNED_MIN_SHARE = 0.85  # pinned copies reach 85-90% of the link on a healthy PCIe path
PAGEABLE_MIN_SHARE = 0.25  # below a quarter of the link, staging through pinned memory wins 3x+
FIRST_TOUCH_1THREAD_MIN_GBPS = 4.0  # bare metal touches 4 KiB pages at 5-10 GB/s per thread
DEFAULT_POOL_BYTES = 1 * GiB  # pinned pool size assumed when the user plans none

# Virtualization kinds that share the host kernel: page faults cost what they cost on
# bare metal, so they are not "VMs" for the first-touch rule.
_NOT_A_VM = frozenset({"bare-metal", "none", "container", "docker", "podman", "lxc", "wsl-container"})

_THP = "/sys/kernel/mm/transparent_hugepage"


@dataclass(frozen=True)
class Finding:
    """One piece of advice. `evidence` quotes facts and figures with units; `fix` is a
    concrete command or option."""

    id: str
    severity: str
    title: str
    evidence: list[str] = field(default_factory=list, hash=False)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with fixed keys: id, severity, title, evidence, fix."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """What a rule's check found: the evidence (figures with units), the fix, and a
    severity only where the evidence changes the rule's default."""

    evidence: list[str]
    fix: str
    severity: Optional[str] = None


@dataclass(frozen=True)
class Rule:
    """A check. `check(facts, measurements)` returns a Verdict or None (nothing to say,
    or not enough known to say it); the Finding takes id, severity and title from here."""

    id: str
    severity: str  # default severity; a check may raise or lower it with the evidence
    title: str  # what the finding says, the same every time it fires
    doc: str  # one line: what the rule checks
    check: Callable[[dict, dict], Optional[Verdict]]


# --------------------------------------------------------------------------- helpers


def _dict(value: Any, what: str) -> dict:
    """`value` as a dict; None means unknown and gives {}. Anything else is an error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be an object, got {type(value).__name__} {value!r}")
    return value


def _list(value: Any, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list, got {type(value).__name__} {value!r}")
    return list(value)


def _num(value: Any, what: str) -> Optional[float]:
    """A number, or None when unknown. Booleans and strings are errors (quoted)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    if math.isnan(value):
        return None
    return value


def _str(value: Any, what: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__} {value!r}")
    return value


def _sysfs_choice(value: Any, what: str) -> Optional[str]:
    """A THP setting: "madvise" or the raw sysfs form "always [madvise] never"
    (facts.parsers.thp_setting: one parser for both). Garbage is a ValueError."""
    text = _str(value, what)
    if text is None:
        return None
    try:
        return thp_setting(text)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


# The cpulist parser of ferry (facts.parsers): "0-3,8,10-15", "0-31:2/4" -> a set of
# ids; ValueError quoting the text for anything else.
parse_cpulist = cpulist_ids


def _cpus(value: Any, what: str) -> Optional[set[int]]:
    text = _str(value, what)
    return None if text is None else parse_cpulist(text)


def _host(facts: dict) -> dict:
    return _dict(facts.get("host"), "host")


def _gpus(facts: dict) -> list[tuple[str, dict]]:
    """(index as a string, gpu dict) for every GPU; the index falls back to position."""
    out = []
    for pos, gpu in enumerate(_list(facts.get("gpus"), "gpus")):
        gpu = _dict(gpu, f"gpus[{pos}]")
        index = gpu.get("index")
        out.append((str(pos if index is None else index), gpu))
    return out


def _gpu_label(key: str, gpu: dict) -> str:
    extras = [x for x in (gpu.get("name"), gpu.get("pci_bus_id")) if x]
    return f"GPU {key}" + (f" ({', '.join(str(x) for x in extras)})" if extras else "")


def _per_gpu(measurements: dict, name: str, key: str) -> Optional[float]:
    """A per-GPU measurement {gpu_index(str): GB/s}; int keys are accepted too."""
    table = _dict(measurements.get(name), name)
    value = table.get(key)
    if value is None and key.isdigit():
        value = table.get(int(key))
    return _num(value, f"{name}[{key}]")


def _link(gpu: dict, key: str, m: dict) -> tuple[Optional[float], str]:
    """The link's per-direction limit for a GPU (units.link_limit, given its pinned
    copies) and how it is named in evidence ("current link", "maximum link")."""
    pinned = [_per_gpu(m, f"pinned_{d}_gbps", key) for d in ("h2d", "d2h")]
    return link_limit(_num(gpu.get("link_gbps"), f"gpus[{key}].link_gbps"),
                      _num(gpu.get("max_link_gbps"), f"gpus[{key}].max_link_gbps"),
                      [x for x in pinned if x is not None])


def _pool_bytes(measurements: dict) -> tuple[int, str]:
    """Planned pinned pool size and how to name it ("planned" or "assumed default")."""
    planned = _num(measurements.get("pool_bytes_planned"), "pool_bytes_planned")
    if planned is None or planned <= 0:
        return DEFAULT_POOL_BYTES, f"{_fmt_bytes(DEFAULT_POOL_BYTES)} (assumed default)"
    return int(planned), f"{_fmt_bytes(planned)} (planned)"


def _virt_kind(host: dict) -> Optional[str]:
    virt = _dict(host.get("virtualization"), "host.virtualization")
    kind = _str(virt.get("kind"), "host.virtualization.kind")
    if kind is None or kind.strip().lower() in ("", "unknown"):
        return None
    return kind.strip().lower()


def _numa_fix(node: Any) -> str:
    return (
        f"run the process on the GPU's node: `numactl --cpunodebind={node} --membind={node} "
        f"<command>` (docker: `--cpuset-cpus=<the GPU's cpus> --cpuset-mems={node}`); "
        "with GPUs on several nodes, run one process per GPU, each bound to its GPU's node"
    )


# ----------------------------------------------------------------------------- rules


def _check_pcie_link_degraded(facts: dict, m: dict) -> Optional[Verdict]:
    evidence, idle_gen_only = [], True
    for key, gpu in _gpus(facts):
        pcie = _dict(gpu.get("pcie"), f"gpus[{key}].pcie")
        gen = _num(pcie.get("gen"), f"gpus[{key}].pcie.gen")
        width = _num(pcie.get("width"), f"gpus[{key}].pcie.width")
        max_gen = _num(pcie.get("max_gen"), f"gpus[{key}].pcie.max_gen")
        max_width = _num(pcie.get("max_width"), f"gpus[{key}].pcie.max_width")
        gen_low = gen is not None and max_gen is not None and gen < max_gen
        width_low = width is not None and max_width is not None and width < max_width
        if not (gen_low or width_low):
            continue
        # An idle GPU lowers its link generation to save power. If a pinned copy
        # reached full speed, the link trains up under load: nothing to report.
        max_link = _num(gpu.get("max_link_gbps"), f"gpus[{key}].max_link_gbps")
        pinned = [
            x
            for x in (_per_gpu(m, "pinned_h2d_gbps", key), _per_gpu(m, "pinned_d2h_gbps", key))
            if x is not None
        ]
        if gen_low and not width_low and max_link and pinned:
            if max(pinned) >= PINNED_MIN_SHARE * max_link:
                continue
        idle_gen_only &= gen_low and not width_low
        cur = f"Gen{gen if gen is None else int(gen)} x{width if width is None else int(width)}"
        top = f"Gen{max_gen if max_gen is None else int(max_gen)} x{max_width if max_width is None else int(max_width)}"
        line = f"{_gpu_label(key, gpu)}: PCIe link runs at {cur}, the GPU and slot allow {top}"
        link = _num(gpu.get("link_gbps"), f"gpus[{key}].link_gbps")
        if link is not None and max_link and link < max_link:
            line += f" ({_gbps(link)} of {_gbps(max_link)} per direction)"
        evidence.append(line)
        if pinned and max_link:
            evidence.append(
                f"{_gpu_label(key, gpu)}: best pinned copy {_gbps(max(pinned))} = "
                f"{_pct(max(pinned), max_link)} of the full link's {_gbps(max_link)}"
            )
    if not evidence:
        return None
    if idle_gen_only:
        evidence.append(
            "only the generation is lower: an idle GPU drops its link generation to save "
            "power, so re-read it while a copy runs before touching hardware"
        )
    return Verdict(
        evidence,
        "read the link under load (`nvidia-smi -q -d PCIE` while `ferry bench` runs); if it "
        "stays low, check the slot's speed setting in the BIOS, reseat the card or its riser, "
        "and move the GPU to a CPU-attached x16 slot (`nvidia-smi topo -m`, `lspci -vv`: LnkSta vs LnkCap)",
    )


def _check_pinned_bandwidth_low(facts: dict, m: dict) -> Optional[Verdict]:
    evidence, nodes = [], set()
    for key, gpu in _gpus(facts):
        link, link_name = _link(gpu, key, m)
        if link is None:
            continue
        for name, direction in (("pinned_h2d_gbps", "host->device"), ("pinned_d2h_gbps", "device->host")):
            rate = _per_gpu(m, name, key)
            if rate is None or rate >= PINNED_MIN_SHARE * link:
                continue
            evidence.append(
                f"{_gpu_label(key, gpu)}: pinned {direction} {_gbps(rate)} = {_pct(rate, link)} "
                f"of the {link_name}'s {_gbps(link)} (expected at least {PINNED_MIN_SHARE:.0%})"
            )
            node = gpu.get("numa_node")
            if node is not None and not (isinstance(node, int) and node < 0):
                nodes.add(node)
    if not evidence:
        return None
    node = sorted(nodes)[0] if len(nodes) == 1 else "N"
    return Verdict(
        evidence,
        "find what shares the path: `nvidia-smi topo -m` (PCIe switch or another device on the "
        "root port), `nvidia-smi -q -d PCIE` (link under load), other copies running at the same "
        f"time; keep host memory on the GPU's NUMA node (`numactl --cpunodebind={node} "
        f"--membind={node} <command>`); in a VM pass the GPU through without an emulated bridge",
    )


GPU_PEER_MIN_SHARE = 0.85  # a GPU below this share of its best peer is flagged


def _check_gpu_below_peers(facts: dict, m: dict) -> Optional[Verdict]:
    gpus = list(_gpus(facts))
    if len(gpus) < 2:
        return None
    evidence = []
    links = {key: gpu.get("link_gbps") for key, gpu in gpus if isinstance(gpu.get("link_gbps"), (int, float))}
    if len(links) >= 2:
        best = max(links.values())
        for key, gpu in gpus:
            if key in links and links[key] < GPU_PEER_MIN_SHARE * best:
                evidence.append(f"{_gpu_label(key, gpu)}: link {_gbps(links[key])} per direction, "
                                f"the best GPU's {_gbps(best)}")
    for name, direction in (("pinned_h2d_gbps", "host->device"), ("pinned_d2h_gbps", "device->host")):
        rates = {key: _per_gpu(m, name, key) for key, _ in gpus}
        rates = {k: v for k, v in rates.items() if v is not None}
        if len(rates) < 2:
            continue
        best = max(rates.values())
        for key, gpu in gpus:
            if key in rates and rates[key] < GPU_PEER_MIN_SHARE * best:
                evidence.append(f"{_gpu_label(key, gpu)}: pinned {direction} {_gbps(rates[key])} = "
                                f"{_pct(rates[key], best)} of the best GPU's {_gbps(best)}")
    if not evidence:
        return None
    return Verdict(
        evidence,
        "compare the slots and links (`nvidia-smi topo -m`, `nvidia-smi -q -d PCIE`): a GPU behind a switch, "
        "on a narrower or slower link, or on the far NUMA node gets less; spread heavy transfers over the "
        "faster GPUs or move the slow one to a CPU-attached x16 slot",
    )


def _check_thp_disabled(facts: dict, m: dict) -> Optional[Verdict]:
    thp = _dict(_host(facts).get("thp"), "host.thp")
    enabled = _sysfs_choice(thp.get("enabled"), "host.thp.enabled")
    if enabled != "never":
        return None
    evidence = [f"{_THP}/enabled = never: no transparent huge pages, not even with MADV_HUGEPAGE"]
    ft4k = _num(m.get("first_touch_4k_gbps"), "first_touch_4k_gbps")
    if ft4k is not None:
        evidence.append(f"first touch with 4 KiB pages measured at {_gbps(ft4k)}")
    evidence.append(
        "every 4 KiB page is faulted, pinned and mapped for DMA one by one: pinning and first "
        "touch take 1.5-2.5x longer than with 2 MiB pages"
    )
    return Verdict(
        evidence,
        f"`echo madvise | sudo tee {_THP}/enabled` (ferry asks for huge pages only where it "
        "wants them); to keep it across boots add `transparent_hugepage=madvise` to the kernel command line",
    )


def _check_gvisor_shmem_thp(facts: dict, m: dict) -> Optional[Verdict]:
    host = _host(facts)
    if _virt_kind(host) != "gvisor":
        return None
    thp = _dict(host.get("thp"), "host.thp")
    shmem = _sysfs_choice(thp.get("shmem_enabled"), "host.thp.shmem_enabled")
    if shmem not in ("always", "force"):
        return None
    evidence = [
        "running under gVisor: application memory lives in the sandbox's shmem memfd",
        f"{_THP}/shmem_enabled = {shmem}: that memfd is backed by 2 MiB compound pages",
        "the driver pins pageable memory in ~4 MiB chunks (pin_user_pages) and must split "
        "each compound page it pins in part: pageable device->host copies lose about half "
        "their speed (gVisor issue 12804); pinned copies are unaffected",
    ]
    for gpu_key, gpu in _gpus(facts):
        cuda = _per_gpu(m, "pageable_d2h_gbps_cuda", gpu_key)
        ferry = _per_gpu(m, "pageable_d2h_gbps_ferry", gpu_key)
        if cuda is not None:
            line = f"{_gpu_label(gpu_key, gpu)}: CUDA pageable device->host {_gbps(cuda)}"
            if ferry is not None:
                line += f", ferry {_gbps(ferry)}"
            evidence.append(line)
    return Verdict(
        evidence,
        "copy pageable memory through ferry: its staging copies pin only ferry's own pool "
        "memory, and whole huge pages, so no compound page is split; or, on the host, "
        f"`echo advise | sudo tee {_THP}/shmem_enabled`; or use a runsc whose nvproxy "
        "applies MADV_NOHUGEPAGE to DMA-pinned regions (the fix for gVisor issue 12804)",
    )


def _check_memlock_low(facts: dict, m: dict) -> Optional[Verdict]:
    host = _host(facts)
    if "memlock_bytes" not in host:
        return None  # absent: unknown. None: unlimited.
    limit = _num(host.get("memlock_bytes"), "host.memlock_bytes")
    if limit is None:
        return None
    pool, pool_text = _pool_bytes(m)
    if limit >= pool:
        return None
    return Verdict(
        [
            f"RLIMIT_MEMLOCK = {_fmt_bytes(limit)}, pinned pool {pool_text}",
            "memory locked with mlock() and memory registered for RDMA (ibverbs, UCX, NIXL) "
            "counts against this limit; beyond it locking fails with ENOMEM or EPERM",
        ],
        "`ulimit -l unlimited` in the shell that starts the process; systemd: "
        "`LimitMEMLOCK=infinity` in the unit; docker: `--ulimit memlock=-1`; "
        "kubernetes: raise the container runtime's default memlock limit",
    )


def _check_hugetlb_not_reserved(facts: dict, m: dict) -> Optional[Verdict]:
    host = _host(facts)
    sizes = []
    for i, entry in enumerate(_list(host.get("hugetlb"), "host.hugetlb")):
        entry = _dict(entry, f"host.hugetlb[{i}]")
        size = _num(entry.get("page_size_bytes"), f"host.hugetlb[{i}].page_size_bytes")
        total = _num(entry.get("total"), f"host.hugetlb[{i}].total")
        if size is None or total is None:
            return None  # one size unknown: cannot say "none reserved"
        sizes.append((int(size), int(total)))
    if not sizes or any(total > 0 for _, total in sizes):
        return None
    pool, pool_text = _pool_bytes(m)
    two_mib = [s for s, _ in sizes if s == 2 * MiB]
    page = two_mib[0] if two_mib else min(s for s, _ in sizes)
    count = -(-pool // page)
    kib = page // KiB
    thp = _dict(host.get("thp"), "host.thp")
    thp_off = _sysfs_choice(thp.get("enabled"), "host.thp.enabled") == "never"
    evidence = [
        "hugetlb sizes: " + ", ".join(f"{_fmt_bytes(s)} pages: 0 reserved" for s, _ in sizes),
        f"pinned pool {pool_text} needs {count} pages of {_fmt_bytes(page)}",
    ]
    if thp_off:
        evidence.append("THP is disabled too: the pool gets no huge pages at all")
    return Verdict(
        evidence,
        f"`echo {count} | sudo tee /sys/kernel/mm/hugepages/hugepages-{kib}kB/nr_hugepages` "
        f"(persist: `vm.nr_hugepages={count}` in /etc/sysctl.d/); reserve early, before memory "
        "fragments; ferry's pool takes reserved hugetlb pages when there are enough, else THP",
        severity="warning" if thp_off else "info",
    )


def _check_numa_mismatch(facts: dict, m: dict) -> Optional[Verdict]:
    process = _dict(_host(facts).get("process"), "host.process")
    cpus_allowed = _cpus(process.get("cpus_allowed"), "host.process.cpus_allowed")
    mems_allowed = _cpus(process.get("mems_allowed"), "host.process.mems_allowed")
    evidence, nodes = [], []
    for key, gpu in _gpus(facts):
        node = gpu.get("numa_node")
        if node is not None:
            node = int(_num(node, f"gpus[{key}].numa_node"))
            if node < 0:
                node = None  # sysfs says -1: no NUMA affinity
        affinity = _cpus(gpu.get("cpu_affinity"), f"gpus[{key}].cpu_affinity")
        label = _gpu_label(key, gpu)
        before = len(evidence)
        if node is not None and mems_allowed is not None and node not in mems_allowed:
            evidence.append(
                f"{label} sits on NUMA node {node}; the process may allocate only on nodes "
                f"{process.get('mems_allowed')}: every copy crosses the socket interconnect"
            )
        if cpus_allowed is not None and affinity and not (cpus_allowed & affinity):
            evidence.append(
                f"{label} is local to CPUs {gpu.get('cpu_affinity')}; the process may run only "
                f"on CPUs {process.get('cpus_allowed')}"
            )
        if len(evidence) > before and node is not None:
            nodes.append(node)
    if not evidence:
        return None
    return Verdict(
        evidence,
        _numa_fix(nodes[0] if len(set(nodes)) == 1 else "N"),
    )


def _check_iommu_translated(facts: dict, m: dict) -> Optional[Verdict]:
    iommu = _dict(_host(facts).get("iommu"), "host.iommu")
    mode = _str(iommu.get("mode"), "host.iommu.mode")
    if mode is None or mode.strip().lower() != "translated":
        return None
    evidence = ["IOMMU in translated mode: every DMA address is remapped through IOMMU page tables"]
    groups = _num(iommu.get("groups"), "host.iommu.groups")
    if groups is not None:
        evidence.append(f"{int(groups)} IOMMU groups")
    evidence.append(
        "pinning maps every page into the IOMMU (longer registration), and IOTLB misses "
        "can slow DMA to memory backed by 4 KiB pages"
    )
    return Verdict(
        evidence,
        "if isolation of devices is not needed, add `iommu=pt` (Intel also `intel_iommu=on "
        "iommu=pt`) to the kernel command line in /etc/default/grub, `sudo update-grub`, reboot; "
        "otherwise pin once at start (one ferry.PinnedPool) and back it with huge pages",
    )


def _check_vm_first_touch_costly(facts: dict, m: dict) -> Optional[Verdict]:
    kind = _virt_kind(_host(facts))
    if kind is None or kind in _NOT_A_VM:
        return None
    ft4k = _num(m.get("first_touch_4k_gbps"), "first_touch_4k_gbps")
    if ft4k is None:
        return None
    ft_thp = _num(m.get("first_touch_thp_gbps"), "first_touch_thp_gbps")
    one = _num(m.get("first_touch_4k_1thread_gbps"), "first_touch_4k_1thread_gbps")
    pool, pool_text = _pool_bytes(m)
    evidence = [f"virtualization: {kind}; the first touch of each page also goes through the "
                "hypervisor or sandbox when guest memory is populated on demand"]
    line = f"first touch, all threads: 4 KiB pages {_gbps(ft4k)}"
    if ft_thp is not None:
        line += f", THP {_gbps(ft_thp)}"
    evidence.append(line)
    if one is not None:
        evidence.append(f"first touch, 1 thread, 4 KiB pages: {_gbps(one)}")
        if one > 0:
            evidence.append(
                f"touching the pinned pool {pool_text} on one thread takes "
                f"{pool / (one * 1e9):.2f} s before any pinning"
            )
    warn = one is not None and one < FIRST_TOUCH_1THREAD_MIN_GBPS
    return Verdict(
        evidence,
        "create one ferry.PinnedPool at start-up with its target size, so pages are touched "
        "in parallel and pinned once, then reused; "
        f"`echo madvise | sudo tee {_THP}/enabled` for THP; reserve hugetlb pages "
        "(`echo N | sudo tee /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`)",
        severity="warning" if warn else "info",
    )


def _check_bar1_small(facts: dict, m: dict) -> Optional[Verdict]:
    evidence = []
    for key, gpu in _gpus(facts):
        bar1 = _num(gpu.get("bar1_bytes"), f"gpus[{key}].bar1_bytes")
        mem = _num(gpu.get("memory_bytes"), f"gpus[{key}].memory_bytes")
        if bar1 is None or mem is None or bar1 >= mem:
            continue
        evidence.append(
            f"{_gpu_label(key, gpu)}: BAR1 {_fmt_bytes(bar1)} < {_fmt_bytes(mem)} of device "
            "memory: at most that much can be mapped for the CPU (GDRCopy) or for peers (RDMA)"
        )
    if not evidence:
        return None
    return Verdict(
        evidence,
        "enable 'Above 4G Decoding' and 'Resizable BAR' in the BIOS; in a VM give the guest a "
        "64-bit MMIO window as large as the BAR (QEMU: `-global q35-pcihost.pci-hole64-size=512G`); "
        "check with `nvidia-smi -q -d MEMORY` (BAR1 Memory Usage)",
    )


def _check_gdrdrv_absent(facts: dict, m: dict) -> Optional[Verdict]:
    gdr = _dict(_host(facts).get("gdrcopy"), "host.gdrcopy")
    if gdr.get("available") is not False:
        return None
    evidence = []
    reason = _str(gdr.get("reason"), "host.gdrcopy.reason")
    if reason:
        evidence.append(f"GDRCopy unavailable: {reason}")
    for key, what in (("gdrdrv", "gdrdrv kernel module (/dev/gdrdrv)"), ("libgdrapi", "libgdrapi.so")):
        if gdr.get(key) is not None:
            evidence.append(f"{what}: {'present' if gdr.get(key) else 'absent'}")
    if not evidence:
        evidence.append("GDRCopy unavailable (no reason recorded)")
    evidence.append(
        "ferry does not need it: its low-latency channel is a persistent GPU kernel polling "
        "mapped pinned memory, with no kernel module"
    )
    return Verdict(
        evidence,
        "nothing to do for ferry; to use GDRCopy as a backend, install the gdrcopy packages "
        "and load the module (`sudo modprobe gdrdrv`), and in containers pass `--device /dev/gdrdrv`",
    )


def _check_no_cuda_driver(facts: dict, m: dict) -> Optional[Verdict]:
    if "cuda" not in facts or facts["cuda"] is not None:
        return None
    return Verdict(
        ["the CUDA driver could not be loaded or initialized (libcuda.so missing, or cuInit failed)"],
        "install the NVIDIA driver and check that `nvidia-smi` lists the GPU; in docker run with "
        "`--gpus all` (NVIDIA Container Toolkit); under gVisor run `runsc --nvproxy`",
    )


def _check_no_gpu_visible(facts: dict, m: dict) -> Optional[Verdict]:
    cuda = _dict(facts.get("cuda"), "cuda")
    count = _num(cuda.get("device_count"), "cuda.device_count")
    if count is None or count > 0:
        return None
    driver = cuda.get("driver_version")
    return Verdict(
        [f"CUDA driver {driver or '(version unknown)'}: device_count = 0"],
        "check `nvidia-smi -L` and that CUDA_VISIBLE_DEVICES is unset or names a GPU "
        "(`env | grep CUDA_VISIBLE_DEVICES`); in docker pass `--gpus all`",
    )


def _thread_order(item: tuple) -> tuple:
    key = str(item[0])
    return (not key.isdigit(), int(key) if key.isdigit() else 0, key)


def _check_pageable_path_slow(facts: dict, m: dict) -> Optional[Verdict]:
    evidence = []
    for key, gpu in _gpus(facts):
        link, link_name = _link(gpu, key, m)
        if link is None:
            continue
        for d, direction in (("h2d", "host->device"), ("d2h", "device->host")):
            cuda = _per_gpu(m, f"pageable_{d}_gbps_cuda", key)
            if cuda is None or cuda >= PAGEABLE_MIN_SHARE * link:
                continue
            line = (
                f"{_gpu_label(key, gpu)}: CUDA pageable {direction} {_gbps(cuda)} = "
                f"{_pct(cuda, link)} of the {link_name}'s {_gbps(link)}"
            )
            ferry = _per_gpu(m, f"pageable_{d}_gbps_ferry", key)
            if ferry is not None and cuda > 0:
                line += f"; ferry staged copy {_gbps(ferry)} ({ferry / cuda:.1f}x)"
            evidence.append(line)
    if not evidence:
        return None
    by_threads = _dict(m.get("memcpy_gbps_by_threads"), "memcpy_gbps_by_threads")
    rates = []
    for threads, rate in sorted(by_threads.items(), key=_thread_order):
        rate = _num(rate, f"memcpy_gbps_by_threads[{threads}]")
        if rate is not None:
            rates.append(f"{threads} thread{'' if str(threads) == '1' else 's'} {_gbps(rate)}")
    if rates:
        evidence.append("host memcpy (bounds a staged copy): " + ", ".join(rates))
    return Verdict(
        evidence,
        "copy pageable buffers with ferry (ferry.copy, or ferry.torch's tensor copies), which "
        "stage through pinned pool chunks on several threads; better, allocate the buffers "
        "that move often from a ferry.PinnedPool (pinned memory goes straight to the DMA engine)",
    )


def _check_thp_defrag_never(facts: dict, m: dict) -> Optional[Verdict]:
    thp = _dict(_host(facts).get("thp"), "host.thp")
    enabled = _sysfs_choice(thp.get("enabled"), "host.thp.enabled")
    defrag = _sysfs_choice(thp.get("defrag"), "host.thp.defrag")
    if enabled not in ("always", "madvise") or defrag != "never":
        return None
    return Verdict(
        [
            f"{_THP}/enabled = {enabled}, defrag = never",
            "with fragmented memory, MADV_HUGEPAGE regions silently get 4 KiB pages: slower "
            "first touch and pinning",
        ],
        f"`echo defer+madvise | sudo tee {_THP}/defrag` (regions that ask for huge pages "
        "compact directly; the rest in the background)",
    )


def _check_memory_low_for_pool(facts: dict, m: dict) -> Optional[Verdict]:
    mem = _dict(_host(facts).get("memory"), "host.memory")
    available = _num(mem.get("available_bytes"), "host.memory.available_bytes")
    if available is None:
        return None
    pool, pool_text = _pool_bytes(m)
    if pool <= available:
        return None
    total = _num(mem.get("total_bytes"), "host.memory.total_bytes")
    evidence = [f"available memory {_fmt_bytes(available)}"
                + (f" of {_fmt_bytes(total)}" if total is not None else "")
                + f", pinned pool {pool_text}",
                "pinned memory cannot be swapped or reclaimed: a pool this large pushes the "
                "rest of the machine into reclaim or the OOM killer"]
    return Verdict(
        evidence,
        "size the pool below the available memory (check `free -g`), or free memory first; "
        "in a VM or container raise its memory limit",
    )


def _check_nixl_ucx_slow_settings(facts: dict, m: dict) -> Optional[Verdict]:
    """The doctor's NIXL check lists the user's UCX settings known to be slow on this
    machine (ferry.ucx.choose decides which: one place); this turns them into advice."""
    nixl = m.get("nixl")
    if nixl is None:
        return None
    nixl = _dict(nixl, "nixl")
    warnings = _list(nixl.get("warnings") or [], "nixl.warnings")
    if not warnings:
        return None
    evidence, fixes = [], []
    for i, w in enumerate(warnings):
        w = _dict(w, f"nixl.warnings[{i}]")
        evidence.append(f"{_str(w.get('setting'), 'setting')}: {_str(w.get('problem'), 'problem')}")
        fixes.append(_str(w.get("fix"), "fix") or "")
    return Verdict(evidence, "; ".join(f for f in fixes if f) + " (`ferry.nixl.agent(name)` chooses UCX settings "
                   "for this machine when none are forced; its settings(agent).describe() says which)")


RULES: tuple[Rule, ...] = (
    Rule("pcie-link-degraded", "warning", "PCIe link runs below the speed the GPU and slot support",
         "a GPU's current PCIe generation or width is below the maximum it and its slot support",
         _check_pcie_link_degraded),
    Rule("pinned-bandwidth-low", "warning", "Pinned copies run well below the PCIe link's limit",
         "measured pinned host->device or device->host bandwidth is below 85% of the GPU's link",
         _check_pinned_bandwidth_low),
    Rule("gpu-below-peers", "warning", "One GPU's link or pinned bandwidth falls below the other GPUs'",
         "with several GPUs: a GPU's link speed or measured pinned bandwidth is below 85% of the best GPU's",
         _check_gpu_below_peers),
    Rule("thp-disabled", "warning", "Transparent huge pages are disabled: pinning and first touch are slower",
         "transparent_hugepage/enabled is 'never', which slows pinning and first touch",
         _check_thp_disabled),
    Rule("gvisor-shmem-thp", "warning", "gVisor with shmem THP: pageable device->host copies run at about half speed",
         "running under gVisor with shmem_enabled 'always' or 'force' (gVisor issue 12804)",
         _check_gvisor_shmem_thp),
    Rule("memlock-low", "warning", "The locked-memory limit (ulimit -l) is below the planned pinned pool",
         "RLIMIT_MEMLOCK is finite and below the planned pinned pool (1 GiB when none is planned)",
         _check_memlock_low),
    Rule("hugetlb-not-reserved", "info", "No hugetlb pages are reserved: the pinned pool cannot use them",
         "every hugetlb page size has zero pages reserved (warning when THP is disabled as well)",
         _check_hugetlb_not_reserved),
    Rule("numa-mismatch", "warning", "The process runs or allocates on a NUMA node far from its GPU",
         "a GPU's NUMA node is outside the process's mems_allowed, or its local CPUs miss cpus_allowed",
         _check_numa_mismatch),
    Rule("iommu-translated", "info", "IOMMU translates every DMA: registration costs more",
         "the IOMMU remaps every DMA (not passthrough), which makes registration cost more",
         _check_iommu_translated),
    Rule("vm-first-touch-costly", "info", "First touch of memory is costly in this VM",
         "in a VM, quotes measured first-touch rates; warning when one thread touches 4 KiB pages below 4 GB/s",
         _check_vm_first_touch_costly),
    Rule("bar1-small", "info", "BAR1 is smaller than device memory: limits GDRCopy and peer mappings",
         "a GPU's BAR1 aperture is smaller than its memory, limiting GDRCopy and peer mappings",
         _check_bar1_small),
    Rule("gdrdrv-absent", "info", "GDRCopy is unavailable: ferry's channel serves small copies instead",
         "GDRCopy (gdrdrv module and libgdrapi) is not available; ferry's own channel needs neither",
         _check_gdrdrv_absent),
    Rule("no-cuda-driver", "info", "No CUDA driver: GPU facts and measurements are skipped",
         "the CUDA driver could not be loaded, so GPU facts and measurements are skipped",
         _check_no_cuda_driver),
    Rule("no-gpu-visible", "warning", "The CUDA driver is loaded but sees no GPU",
         "the CUDA driver is loaded but reports zero devices",
         _check_no_gpu_visible),
    Rule("pageable-path-slow", "warning", "CUDA copies from pageable memory use a small share of the link",
         "measured CUDA pageable host->device or device->host bandwidth is below 25% of the link",
         _check_pageable_path_slow),
    Rule("thp-defrag-never", "info", "THP defrag is off: huge pages only while free 2 MiB blocks last",
         "THP is enabled but defrag is 'never', so huge pages run out once memory fragments",
         _check_thp_defrag_never),
    Rule("memory-low-for-pool", "warning", "The planned pinned pool is larger than the available memory",
         "the planned pinned pool (1 GiB when none is planned) exceeds the available host memory",
         _check_memory_low_for_pool),
    Rule("nixl-ucx-slow-settings", "warning", "UCX settings in the environment force NIXL onto slow paths",
         "a UCX_TLS without a CUDA transport (or without cuda_ipc), UCX_RMA_PPLN_ENABLE=n or peer error "
         "handling on a GPU machine: NIXL transfers run at a few GB/s or less", _check_nixl_ucx_slow_settings),
)


# ------------------------------------------------------------------------ evaluation


def _sort_key(f: Finding) -> tuple:
    return (_SEVERITY_RANK.get(f.severity, len(SEVERITIES)), f.id, f.title)


def _error_finding(rule: Rule, error: BaseException) -> Finding:
    message = f"{type(error).__name__}: {error}"
    return Finding(
        rule.id,
        "info",
        f"rule {rule.id} could not be evaluated: {message}",
        [f"the rule checks: {rule.doc}", f"error: {message}"],
        "the input this rule reads is malformed: check the facts and measurements recorded "
        "by `ferry doctor` (its JSON output) and report it; the other findings are unaffected",
    )


def evaluate(
    facts: Optional[dict],
    measurements: Optional[dict] = None,
    rules: Optional[Sequence[Rule]] = None,
) -> list[Finding]:
    """Runs every rule (default: RULES) and returns their findings, sorted by severity
    (critical, warning, info) then id.

    Preconditions: none; None stands for "nothing known". A rule that raises, or returns
    something that is not a Verdict with a known severity, gives an info finding
    "rule X could not be evaluated: <error>" in its place."""
    facts = {} if facts is None else facts
    measurements = {} if measurements is None else measurements
    findings = []
    for rule in RULES if rules is None else rules:
        try:
            if not isinstance(facts, dict):
                raise TypeError(f"facts must be an object, got {type(facts).__name__}")
            if not isinstance(measurements, dict):
                raise TypeError(f"measurements must be an object, got {type(measurements).__name__}")
            verdict = rule.check(facts, measurements)
            if verdict is None:
                continue
            if not isinstance(verdict, Verdict):
                raise TypeError(f"check returned {type(verdict).__name__}, not a Verdict")
            severity = rule.severity if verdict.severity is None else verdict.severity
            if severity not in _SEVERITY_RANK:
                raise ValueError(f"check returned unknown severity {severity!r}")
            findings.append(Finding(rule.id, severity, rule.title, list(verdict.evidence), verdict.fix))
        except Exception as error:  # one bad rule must not kill the report
            findings.append(_error_finding(rule, error))
    findings.sort(key=_sort_key)
    return findings
