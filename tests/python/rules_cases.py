"""The machines on which tests/python/test_rules*.py evaluate ferry doctor's findings
engine (python/ferry/rules/), and the helpers those tests share.

A GOOD synthetic machine (H200, PCIe Gen5 x16, bare metal, everything tuned) must give no
finding at all; for every rule a BAD variant (in BAD) changes only what that rule reads and
must make it fire with evidence and a fix. A new rule adds its BAD variant here."""

from ferry.doctor import report, text_report


def format_findings(findings) -> str:
    """The Findings section of the doctor's text report."""
    return text_report.render([report.findings_section([f.to_dict() for f in findings])])


KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def good_facts():
    return {
        "host": {
            "kernel": "6.8.0-60-generic",
            "virtualization": {"kind": "bare-metal", "hypervisor": None, "evidence": ["no hypervisor cpuid bit"]},
            "cpu": {"model": "Intel Xeon Platinum 8480+", "logical_cpus": 32},
            "numa_nodes": [
                {"id": 0, "cpus": "0-15", "mem_total_bytes": 1 * TiB},
                {"id": 1, "cpus": "16-31", "mem_total_bytes": 1 * TiB},
            ],
            "memory": {"total_bytes": 2 * TiB, "available_bytes": 1900 * GiB},
            "thp": {"enabled": "madvise", "defrag": "madvise", "shmem_enabled": "never"},
            "hugetlb": [
                {"page_size_bytes": 2 * MiB, "total": 4096, "free": 4096},
                {"page_size_bytes": 1 * GiB, "total": 0, "free": 0},
            ],
            "memlock_bytes": None,  # unlimited
            "iommu": {"present": True, "groups": 120, "mode": "passthrough"},
            "process": {"cpus_allowed": "0-15", "mems_allowed": "0"},
            "gdrcopy": {"gdrdrv": True, "libgdrapi": True, "available": True, "reason": None},
            # The full crew of 16 stages fastest everywhere: no profile needed.
            "copy_engine": {"workers_option": 0, "crew_threads": 16, "crew_numa_node": 0,
                            "profile": {"path": "/home/u/.cache/ferry/profile.txt", "named": False,
                                        "present": False}},
            "torch_alloc_conf": {"variable": None, "value": None, "shadowed": [],
                                 "pinned_use_host_register": False, "error": None},
        },
        "cuda": {"driver_version": "13.0", "runtime_version": "13.0", "device_count": 1},
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "memory_bytes": 141 * GiB,
                "pci_bus_id": "00000000:17:00.0",
                "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
                "link_gbps": 63.0,
                "max_link_gbps": 63.0,
                "bar1_bytes": 256 * GiB,
                "numa_node": 0,
                "cpu_affinity": "0-15",
            }
        ],
    }


def good_measurements():
    return {
        "pinned_h2d_gbps": {"0": 55.4},
        "pinned_d2h_gbps": {"0": 55.1},
        "pageable_h2d_gbps_cuda": {"0": 22.0},
        "pageable_d2h_gbps_cuda": {"0": 20.5},
        "pageable_h2d_gbps_ferry": {"0": 48.0},
        "pageable_d2h_gbps_ferry": {"0": 46.0},
        "first_touch_4k_gbps": 30.0,
        "first_touch_thp_gbps": 40.0,
        "first_touch_4k_1thread_gbps": 6.0,
        "memcpy_gbps_by_threads": {"1": 9.2, "4": 32.0, "16": 37.5},
        "pool_bytes_planned": 8 * GiB,
    }


# Each BAD variant: rule id -> (expected severity, mutation of (facts, measurements)).
def _set(path, value):
    def mutate(f, m):
        root = m if path[0] == "m" else f
        *parents, leaf = path[1:]
        for key in parents:
            root = root[key]
        root[leaf] = value

    return mutate


def _all(*mutations):
    def mutate(f, m):
        for fn in mutations:
            fn(f, m)

    return mutate


BAD = {
    "pcie-link-degraded": (
        "warning",
        _all(
            _set(("f", "gpus", 0, "pcie", "width"), 8),
            _set(("f", "gpus", 0, "link_gbps"), 31.5),
            _set(("m", "pinned_h2d_gbps", "0"), 27.5),
            _set(("m", "pinned_d2h_gbps", "0"), 27.2),
        ),
    ),
    "pinned-bandwidth-low": ("warning", _set(("m", "pinned_h2d_gbps", "0"), 40.0)),
    "thp-disabled": ("warning", _set(("f", "host", "thp", "enabled"), "never")),
    "gvisor-shmem-thp": (
        "warning",
        _all(
            _set(("f", "host", "virtualization", "kind"), "gvisor"),
            _set(("f", "host", "thp", "shmem_enabled"), "always"),
        ),
    ),
    "memlock-low": ("warning", _set(("f", "host", "memlock_bytes"), 64 * MiB)),
    "hugetlb-not-reserved": ("info", _set(("f", "host", "hugetlb", 0, "total"), 0)),
    "numa-mismatch": ("warning", _set(("f", "host", "process", "mems_allowed"), "1")),
    "iommu-translated": ("info", _set(("f", "host", "iommu", "mode"), "translated")),
    "vm-first-touch-costly": (
        "warning",
        _all(
            _set(("f", "host", "virtualization", "kind"), "firecracker"),
            _set(("m", "first_touch_4k_1thread_gbps"), 2.08),
        ),
    ),
    "bar1-small": ("info", _set(("f", "gpus", 0, "bar1_bytes"), 256 * MiB)),
    "gdrdrv-absent": (
        "info",
        _set(
            ("f", "host", "gdrcopy"),
            {"gdrdrv": False, "libgdrapi": True, "available": False, "reason": "/dev/gdrdrv not found"},
        ),
    ),
    "no-cuda-driver": (
        "info",
        _all(_set(("f", "cuda"), None), _set(("f", "gpus"), [])),
    ),
    "no-gpu-visible": (
        "warning",
        _all(_set(("f", "cuda", "device_count"), 0), _set(("f", "gpus"), [])),
    ),
    "pageable-path-slow": ("warning", _set(("m", "pageable_h2d_gbps_cuda", "0"), 7.9)),
    "thp-defrag-never": ("info", _set(("f", "host", "thp", "defrag"), "never")),
    "memory-low-for-pool": ("warning", _set(("f", "host", "memory", "available_bytes"), 4 * GiB)),
    "gpu-below-peers": ("warning", lambda f, m: add_second_gpu(f, m, link=31.5, gen=4, pinned=27.5)),
    "small-crew-uncalibrated": (
        "warning",
        _all(
            _set(("f", "host", "copy_engine", "workers_option"), 2),
            _set(("f", "host", "copy_engine", "crew_threads"), 2),
        ),
    ),
    "nixl-ucx-slow-settings": ("warning", _set(("m", "nixl"), {"installed": True, "warnings": [
        {"setting": "UCX_TLS=sm,self", "problem": "no CUDA transport on a GPU machine",
         "fix": "unset UCX_TLS or add cuda_copy,cuda_ipc"}]})),
    "torch-pinned-register-fork": ("warning", _set(("f", "host", "torch_alloc_conf"), {
        "variable": "PYTORCH_CUDA_ALLOC_CONF", "value": "pinned_use_cuda_host_register:True",
        "shadowed": [], "pinned_use_host_register": True, "error": None})),
}


def add_second_gpu(f, m, link, gen, pinned):
    """A second GPU on its own (not degraded) link, with pinned copies at `pinned` GB/s."""
    gpu = dict(f["gpus"][0], index=1, pci_bus_id="00000000:65:00.0", link_gbps=link, max_link_gbps=link,
               pcie={"gen": gen, "width": 16, "max_gen": gen, "max_width": 16})
    f["gpus"].append(gpu)
    f["cuda"]["device_count"] = 2
    for d in ("h2d", "d2h"):
        m[f"pinned_{d}_gbps"]["1"] = pinned
        m[f"pageable_{d}_gbps_ferry"]["1"] = m[f"pageable_{d}_gbps_ferry"]["0"] / 2
        m[f"pageable_{d}_gbps_cuda"]["1"] = m[f"pageable_{d}_gbps_cuda"]["0"]


REQUIRED_IDS = {
    "pcie-link-degraded", "pinned-bandwidth-low", "thp-disabled", "gvisor-shmem-thp",
    "memlock-low", "hugetlb-not-reserved", "numa-mismatch", "iommu-translated",
    "vm-first-touch-costly", "bar1-small", "gdrdrv-absent", "no-cuda-driver",
    "pageable-path-slow", "small-crew-uncalibrated",
}


def bad(rule_id):
    f, m = good_facts(), good_measurements()
    BAD[rule_id][1](f, m)
    return f, m


def only(findings, rule_id):
    hits = [x for x in findings if x.id == rule_id]
    assert len(hits) == 1, f"{rule_id}: expected one finding, got {hits}"
    hit = hits[0]
    assert "could not be evaluated" not in hit.title, hit
    return hit


def errors(findings):
    return [x for x in findings if "could not be evaluated" in x.title]
