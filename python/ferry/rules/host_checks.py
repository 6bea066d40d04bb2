"""The rules' checks of the host: THP, hugetlb, locked memory, NUMA, the IOMMU,
virtualization and the UCX settings in the environment."""

from __future__ import annotations

from typing import Optional

from ..units import KiB, MiB
from ..units import fmt_bytes as _fmt_bytes
from ..units import fmt_gbps as _gbps

from .inputs import _cpus, _dict, _gpu_label, _gpus, _host, _list, _num, _numa_fix, _per_gpu, _pool_bytes, _str, _sysfs_choice, _virt_kind
from .model import Verdict
from .thresholds import _NOT_A_VM, _THP, FIRST_TOUCH_1THREAD_MIN_GBPS


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
