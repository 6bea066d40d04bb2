"""The rules' checks of the host: THP, hugetlb, locked memory, NUMA, the IOMMU,
virtualization, the UCX settings in the environment, the copy engine's crew
and machine profile, and PyTorch's pinned memory settings."""

from __future__ import annotations

import shlex
from typing import Optional

from ..facts.parsers import alloc_conf_without
from ..units import KiB, MiB
from ..units import fmt_bytes as _fmt_bytes
from ..units import fmt_gbps as _gbps

from .inputs import (_bool, _cpus, _dict, _gpu_label, _gpus, _host, _list, _num, _numa_fix, _per_gpu, _pool_bytes,
                     _str, _sysfs_choice, _virt_kind)
from .model import Verdict
from .thresholds import (_NOT_A_VM, _THP, FIRST_TOUCH_1THREAD_MIN_GBPS, SMALL_CREW_MAX_THREADS,
                         SMALL_CREW_WARN_THREADS)


def check_thp_disabled(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_gvisor_shmem_thp(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_memlock_low(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_hugetlb_not_reserved(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_numa_mismatch(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_iommu_translated(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_vm_first_touch_costly(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_thp_defrag_never(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_memory_low_for_pool(facts: dict, m: dict) -> Optional[Verdict]:
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


def check_nixl_ucx_slow_settings(facts: dict, m: dict) -> Optional[Verdict]:
    """The doctor's NIXL check lists the user's UCX settings known to be slow on this
    machine (ferry.nixl.ucx.choose decides which: one place); this turns them into advice."""
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


# What staging loses with a small crew: measured on the H200 machine (PCIe Gen5, 16
# cores) with the crew limited by FERRY_COPY_WORKERS, fresh 4 KiB-page buffers, by
# crew threads; the finding quotes the row of the smallest crew measured that is
# at least the user's.
_SMALL_CREW_H200 = (
    (1, "1 thread: device->host 512 MiB staged 4.6 vs pin-in-place 18.5 GB/s (4.0x), 64 MiB staged 5.5 vs "
        "cuda 17.8 GB/s; host->device 512 MiB staged 8.4 vs pin-in-place 18.7 GB/s"),
    (2, "2 threads: device->host 512 MiB staged 6.3 vs hybrid 19.5 GB/s (3.1x), 64 MiB staged 11.4 vs "
        "hybrid 29.6 GB/s; host->device 512 MiB staged 16.9 vs hybrid 21.1 GB/s"),
    (4, "4 threads: device->host 64 MiB staged 15.5 vs hybrid 40.0 GB/s (2.6x), 512 MiB staged 21.3 vs "
        "hybrid 29.9 GB/s; host->device staging still wins (29.7 vs hybrid 26.8 GB/s at 512 MiB)"),
)


def check_small_crew_uncalibrated(facts: dict, m: dict) -> Optional[Verdict]:
    """A crew of at most SMALL_CREW_MAX_THREADS threads and no machine profile: `auto`
    stages every copy (the built-in defaults), which other strategies beat on such a
    crew. Info by default: the figures are the H200's, not this machine's, and one
    direction may still favour staging (host->device at 4 threads); warning at 1-2
    threads, where both directions lost on the H200 and device->host by 3-4x.
    Silent without a GPU (nothing to copy, nothing to calibrate on)."""
    engine = _dict(_host(facts).get("copy_engine"), "host.copy_engine")
    threads = _num(engine.get("crew_threads"), "host.copy_engine.crew_threads")
    profile = _dict(engine.get("profile"), "host.copy_engine.profile")
    named = _bool(profile.get("named"), "host.copy_engine.profile.named")
    present = _bool(profile.get("present"), "host.copy_engine.profile.present")
    path = _str(profile.get("path"), "host.copy_engine.profile.path")
    if threads is None or threads > SMALL_CREW_MAX_THREADS or named is not False or present is not False:
        return None
    if not _gpus(facts):
        return None
    n = max(1, int(threads))
    workers = _num(engine.get("workers_option"), "host.copy_engine.workers_option")
    node = _num(engine.get("crew_numa_node"), "host.copy_engine.crew_numa_node")
    if workers:
        why = f"FERRY_COPY_WORKERS={int(workers)}"
    else:
        why = "one per CPU this process may use" + (f" on NUMA node {int(node)}" if node is not None else "")
    evidence = [f"the copy engine's crew has {n} thread{'' if n == 1 else 's'} ({why}): staged copies are "
                "memcpys on these threads, so the crew, not the link, sets their speed"]
    memcpy = _num(_dict(m.get("memcpy_gbps_by_threads"), "memcpy_gbps_by_threads").get(str(n)),
                  f"memcpy_gbps_by_threads[{n}]")
    if memcpy is not None:
        evidence.append(f"host memcpy on {n} thread{'' if n == 1 else 's'} measured here: {_gbps(memcpy)}, "
                        "a ceiling for staged copies")
    where = f"{path} does not exist" if path else "XDG_CACHE_HOME and HOME are unset"
    evidence.append(f"no machine profile ({where}, FERRY_PROFILE unset): `auto` follows the built-in "
                    "defaults, which stage copies of every size")
    row = next(text for crew, text in _SMALL_CREW_H200 if crew >= n)
    evidence.append(f"measured on an H200 (PCIe Gen5) with the crew limited by FERRY_COPY_WORKERS to {row}")
    evidence.append("there, with the profile `ferry bench copy --calibrate` wrote (2 threads), `auto` took cuda "
                    "below 512 KiB and hybrid from 64 MiB: device->host 64 MiB 23.6 GB/s instead of staged 9.9 GB/s")
    fix = ("`ferry bench copy --calibrate`, once on this machine, under the FERRY_COPY_WORKERS and CPU limits "
           "the workload runs with: it measures each strategy on this crew and writes the profile the engine "
           f"reads ({path}), from which `auto` picks cuda, pin-in-place or hybrid where they win; calibrate "
           "again after changing the crew" if path else
           "set XDG_CACHE_HOME or HOME (or FERRY_PROFILE=<file>), then run `ferry bench copy --calibrate` "
           "once on this machine: it writes the profile the engine reads, from which `auto` picks cuda, "
           "pin-in-place or hybrid where they win")
    if workers:
        fix += "; or, where more cores are free, raise FERRY_COPY_WORKERS"
    return Verdict(evidence, fix, severity="warning" if n <= SMALL_CREW_WARN_THREADS else None)


def check_torch_pinned_register(facts: dict, m: dict) -> Optional[Verdict]:
    """PyTorch's allocator settings (read as PyTorch's CUDA allocator reads them:
    facts/parsers/torch_alloc.py) make its pinned memory malloc + cudaHostRegister:
    anonymous pinned pages, which the kernel copies into every child at fork().
    Silent when PyTorch pins by cudaHostAlloc, refuses the settings, or no GPU is known."""
    conf = _dict(_host(facts).get("torch_alloc_conf"), "host.torch_alloc_conf")
    if _bool(conf.get("pinned_use_host_register"), "host.torch_alloc_conf.pinned_use_host_register") is not True:
        return None
    if not _gpus(facts):
        return None
    variable = _str(conf.get("variable"), "host.torch_alloc_conf.variable") or "PYTORCH_CUDA_ALLOC_CONF"
    value = _str(conf.get("value"), "host.torch_alloc_conf.value")
    shadowed = [_str(v, "host.torch_alloc_conf.shadowed[]") for v in
                _list(conf.get("shadowed"), "host.torch_alloc_conf.shadowed")]
    evidence = [f"{variable}={value!r}: PyTorch's pinned memory (pin_memory=True, tensor.pin_memory(), "
                "DataLoader(pin_memory=True)) is malloc'd anonymous memory registered with cudaHostRegister, "
                "not cudaHostAlloc's"]
    if shadowed:
        evidence.append(f"{' and '.join(shadowed)} {'is' if len(shadowed) == 1 else 'are'} set too, but PyTorch's "
                        f"CUDA allocator reads its keys from {variable}")
    evidence.append("the kernel pins registered pages (FOLL_PIN) and, since Linux 5.9, copies every pinned "
                    "anonymous page into the child at fork() instead of sharing it copy-on-write: each fork "
                    "takes time in proportion to the pinned bytes, and each child (every DataLoader worker, "
                    "at every epoch unless persistent_workers) holds a private copy of them")
    evidence.append("measured on the H100 machine (PyTorch 2.11, a fresh process each): with 2 GiB pinned "
                    "held, os.fork() took 614 ms and the child had 2049 MiB private (Private_Dirty); with PyTorch's "
                    "default (cudaHostAlloc) 13 ms and 1 MiB. `ferry bench fork` measures it on this machine")
    rest = alloc_conf_without(value) if value is not None else ""
    drop = f"`export {variable}={shlex.quote(rest)}`" if rest else f"`unset {variable}`"
    fix = (f"drop pinned_use_cuda_host_register (and pinned_num_register_threads) from {variable}: {drop}; "
           "PyTorch then pins by cudaHostAlloc, which fork() does not copy. Where pinning speed is why it is set, "
           "take the pinned memory from ferry instead (ferry.torch.empty_pinned, ferry.PinnedPool, "
           "ferry.torch.DataLoader: hidden from fork or shared with the child, never copied), and keep "
           "DataLoader workers alive across epochs (persistent_workers=True) so that they fork once")
    return Verdict(evidence, fix)
