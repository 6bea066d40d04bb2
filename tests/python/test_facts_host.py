"""Tests of ferry.facts.collect() on this real machine (python/ferry/facts).

collect() runs twice: with no CUDA driver (cuda_info=None) and with a synthetic
cuda_info whose GPU sits at a PCI address that does not exist in sysfs. Both must
return every required key with the right type, survive json.dumps, and render as
the doctor report's Facts section. Nothing is faked: the host readers read this machine's /proc and /sys.
"""

import json
import os
import sys
from pathlib import Path

import pytest



from ferry import facts as facts_pkg  # noqa: E402
from ferry import units  # noqa: E402
from ferry.doctor import report, text_report  # noqa: E402


def format_facts(facts) -> str:
    """The Facts section of the doctor's text report."""
    return text_report.render([report.facts_section(facts if isinstance(facts, dict) else {})])

MISSING_BUS_ID = "0000:ff:1f.7"
SYNTHETIC_CUDA_INFO = {
    "driver_version": 13000,
    "runtime_version": 12080,
    "devices": [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "total_memory_bytes": 150_110_011_392,
            "pci_bus_id": "00000000:FF:1F.7",
            "compute_capability": "9.0",
            "multiprocessors": 132,
            "async_engine_count": 3,
            "host_native_atomic_supported": 0,
            "pageable_memory_access": 0,
            "concurrent_managed_access": 1,
            "can_map_host_memory": 1,
        }
    ],
}

VIRT_KINDS = {"bare-metal", "kvm", "firecracker", "gvisor", "vm", "unknown"}
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))


@pytest.fixture(scope="module")
def no_driver():
    return facts_pkg.collect(None)


@pytest.fixture(scope="module")
def with_gpu():
    assert not os.path.exists(f"/sys/bus/pci/devices/{MISSING_BUS_ID}")
    return facts_pkg.collect(SYNTHETIC_CUDA_INFO)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def check_host(host):
    assert isinstance(host["kernel"], str) and host["kernel"] == os.uname().release
    assert isinstance(host["os"], OPT_STR)

    virt = host["virtualization"]
    assert virt["kind"] in VIRT_KINDS
    assert isinstance(virt["hypervisor"], OPT_STR)
    assert isinstance(virt["evidence"], list) and virt["evidence"]
    assert all(isinstance(line, str) for line in virt["evidence"])

    cpu = host["cpu"]
    assert isinstance(cpu["model"], OPT_STR)
    assert _is_int(cpu["logical_cpus"]) and cpu["logical_cpus"] >= 1
    assert isinstance(cpu["online"], str) and cpu["online"]

    assert isinstance(host["numa_nodes"], list)
    for node in host["numa_nodes"]:
        assert _is_int(node["id"])
        assert isinstance(node["cpus"], str)
        assert isinstance(node["mem_total_bytes"], OPT_INT)

    memory = host["memory"]
    assert isinstance(memory["total_bytes"], OPT_INT)
    assert isinstance(memory["available_bytes"], OPT_INT)

    thp = host["thp"]
    for key in ("enabled", "defrag", "shmem_enabled"):
        assert isinstance(thp[key], OPT_STR)
    assert isinstance(thp["pmd_size_bytes"], OPT_INT)

    assert isinstance(host["hugetlb"], list)
    sizes = [pool["page_size_bytes"] for pool in host["hugetlb"]]
    assert sizes == sorted(sizes)
    for pool in host["hugetlb"]:
        assert _is_int(pool["page_size_bytes"])
        for key in ("total", "free", "reserved", "surplus"):
            assert isinstance(pool[key], OPT_INT)

    assert isinstance(host["memlock_bytes"], OPT_INT)

    iommu = host["iommu"]
    assert isinstance(iommu["present"], bool)
    assert _is_int(iommu["groups"])
    assert isinstance(iommu["mode"], OPT_STR)
    assert isinstance(iommu["evidence"], list)

    process = host["process"]
    assert isinstance(process["cpus_allowed"], str)
    assert isinstance(process["mems_allowed"], OPT_STR)

    gdr = host["gdrcopy"]
    for key in ("gdrdrv", "libgdrapi", "available"):
        assert isinstance(gdr[key], bool)
    assert isinstance(gdr["reason"], OPT_STR)
    assert gdr["available"] == (gdr["gdrdrv"] and gdr["libgdrapi"])
    assert (gdr["reason"] is None) == gdr["available"]


def test_no_driver_schema(no_driver):
    assert set(no_driver) >= {"host", "cuda", "gpus"}
    check_host(no_driver["host"])
    assert no_driver["cuda"] is None
    assert no_driver["gpus"] == []


def test_facts_match_this_machine(no_driver):
    host = no_driver["host"]
    assert host["cpu"]["logical_cpus"] == len(facts_pkg.parsers.parse_cpulist(host["cpu"]["online"]))
    affinity = facts_pkg.parsers.format_cpulist(os.sched_getaffinity(0))
    assert host["process"]["cpus_allowed"] == affinity
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert host["thp"]["enabled"] in ("always", "madvise", "never")
    if host["virtualization"]["kind"] == "bare-metal":
        assert "cpuinfo flags: no 'hypervisor' flag" in host["virtualization"]["evidence"]


def test_synthetic_gpu_schema(with_gpu):
    check_host(with_gpu["host"])
    cuda = with_gpu["cuda"]
    assert cuda == {"driver_version": "13.0", "runtime_version": "12.8", "device_count": 1}
    (gpu,) = with_gpu["gpus"]
    assert gpu["index"] == 0
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["memory_bytes"] == 150_110_011_392
    assert gpu["pci_bus_id"] == MISSING_BUS_ID
    assert gpu["compute_capability"] == "9.0"
    assert set(gpu["pcie"]) >= {"gen", "width", "max_gen", "max_width", "source"}
    for key in ("gen", "width", "max_gen", "max_width"):
        assert isinstance(gpu["pcie"][key], OPT_INT)
    for key in ("link_gbps", "max_link_gbps"):
        assert isinstance(gpu[key], (float, type(None)))
    assert isinstance(gpu["bar1_bytes"], OPT_INT)
    assert isinstance(gpu["bar1_source"], OPT_STR)
    assert isinstance(gpu["numa_node"], OPT_INT)
    assert isinstance(gpu["cpu_affinity"], OPT_STR)
    assert gpu["cuda_attributes"]["multiprocessors"] == 132


def test_synthetic_gpu_without_sysfs_or_nvml_is_unknown(with_gpu):
    (gpu,) = with_gpu["gpus"]
    assert gpu["sysfs"]["present"] is False
    assert any(MISSING_BUS_ID in note for note in gpu["notes"])
    if gpu["nvml"] is None:  # no NVML on this machine, or it does not know the address
        assert gpu["pcie"] == {"gen": None, "width": None, "max_gen": None, "max_width": None, "source": None}
        assert gpu["link_gbps"] is None and gpu["max_link_gbps"] is None
        assert gpu["bar1_bytes"] is None and gpu["bar1_source"] is None
    assert gpu["numa_node"] is None and gpu["cpu_affinity"] is None


def test_no_device(no_driver):
    facts = facts_pkg.collect({"driver_version": 13000, "runtime_version": 13000, "devices": []})
    assert facts["cuda"]["device_count"] == 0
    assert facts["gpus"] == []
    assert "no CUDA device" in format_facts(facts)


def test_malformed_cuda_info_does_not_raise():
    facts = facts_pkg.collect({"driver_version": "x", "devices": [None, {"pci_bus_id": 7}]})
    assert facts["cuda"]["driver_version"] is None
    assert [gpu["index"] for gpu in facts["gpus"]] == [0, 1]
    assert facts["gpus"][1]["pci_bus_id"] is None
    json.dumps(facts)
    format_facts(facts)


@pytest.mark.parametrize("which", ["no_driver", "with_gpu"])
def test_json_round_trip(which, request):
    facts = request.getfixturevalue(which)
    assert json.loads(json.dumps(facts)) == facts


def test_report_without_driver(no_driver):
    text = format_facts(no_driver)
    host = no_driver["host"]
    assert text.startswith("Facts\n  Host\n")
    assert "\n  CUDA\n" in text and "\n  GPUs\n" in text
    assert host["kernel"] in text
    assert f"enabled={host['thp']['enabled']}" in text
    assert f"defrag={host['thp']['defrag']}" in text
    assert f"shmem_enabled={host['thp']['shmem_enabled']}" in text
    assert "no CUDA driver found: GPU facts skipped" in text


def test_report_with_synthetic_gpu(with_gpu):
    text = format_facts(with_gpu)
    assert "NVIDIA H200" in text
    assert "139.8 GiB" in text
    assert MISSING_BUS_ID in text
    assert "driver              13.0" in text


def test_report_with_full_gpu_facts():
    facts = facts_pkg.collect(None)
    facts["cuda"] = {"driver_version": "13.0", "runtime_version": "13.0", "device_count": 1}
    facts["gpus"] = [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "memory_bytes": 150_110_011_392,
            "pci_bus_id": "0000:00:06.0",
            "compute_capability": "9.0",
            "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "source": "nvml"},
            "link_gbps": 63.0,
            "max_link_gbps": 63.0,
            "bar1_bytes": 256 << 30,
            "bar1_source": "nvml",
            "numa_node": None,
            "cpu_affinity": "0-15",
        }
    ]
    text = format_facts(facts)
    assert "gen 5 x16, 63.0 GB/s per direction (source: nvml)" in text
    assert "256 GiB (source: nvml)" in text


def test_report_of_empty_dict():
    text = format_facts({})
    assert "unknown" in text and "no CUDA driver found" in text


def test_format_bytes():
    fmt = units.fmt_bytes
    assert fmt(2 * 1024 * 1024) == "2 MiB"
    assert fmt(256 << 30) == "256 GiB"
    assert fmt(25_276_063_744) == "23.5 GiB"
    assert fmt(512) == "512 B"
    assert fmt(None) == "unknown"
