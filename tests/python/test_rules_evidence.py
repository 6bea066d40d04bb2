"""ferry doctor's findings (python/ferry/rules/), rule by rule: the evidence each quotes
(rates, links, settings, GPUs), the fix it gives, the severity it picks, and the nearby
machines on which it stays silent."""

import copy

import pytest

from ferry import rules

from rules_cases import (  # tests/python, on sys.path under pytest
    GiB,
    MiB,
    add_second_gpu,
    bad,
    good_facts,
    good_measurements,
    only,
)


def test_gpu_below_peers_quotes_the_slow_gpu_and_the_best():
    f, m = bad("gpu-below-peers")
    hit = only(rules.evaluate(f, m), "gpu-below-peers")
    text = " ".join(hit.evidence)
    assert "GPU 1" in text and "31.5 GB/s" in text and "63.0 GB/s" in text, text
    assert "27.5 GB/s" in text and "55.4 GB/s" in text, text


def test_two_equal_gpus_are_not_flagged():
    f, m = good_facts(), good_measurements()
    add_second_gpu(f, m, link=63.0, gen=5, pinned=54.0)
    assert not [x for x in rules.evaluate(f, m) if x.id == "gpu-below-peers"]


def test_pinned_bandwidth_low_quotes_rate_link_and_share():
    hit = only(rules.evaluate(*bad("pinned-bandwidth-low")), "pinned-bandwidth-low")
    text = " ".join(hit.evidence)
    assert "40.0 GB/s" in text and "63.0 GB/s" in text and "63%" in text
    assert "host->device" in text and "device->host" not in text


def test_pinned_bandwidth_low_device_to_host():
    f, m = good_facts(), good_measurements()
    m["pinned_d2h_gbps"]["0"] = 30.0
    hit = only(rules.evaluate(f, m), "pinned-bandwidth-low")
    assert "device->host 30.0 GB/s" in " ".join(hit.evidence)


def test_pcie_generation_downgrade_fires():
    f, m = good_facts(), good_measurements()
    f["gpus"][0]["pcie"]["gen"] = 4
    f["gpus"][0]["link_gbps"] = 31.5
    m["pinned_h2d_gbps"]["0"] = m["pinned_d2h_gbps"]["0"] = 27.0
    hit = only(rules.evaluate(f, m), "pcie-link-degraded")
    assert "Gen4 x16" in hit.evidence[0] and "Gen5 x16" in hit.evidence[0]


def test_pcie_idle_generation_with_full_speed_copies_is_silent():
    # An idle GPU reports a lower generation; pinned copies at full speed prove the link.
    f, m = good_facts(), good_measurements()
    f["gpus"][0]["pcie"]["gen"] = 1
    f["gpus"][0]["link_gbps"] = 4.0
    assert [x for x in rules.evaluate(f, m) if x.id == "pcie-link-degraded"] == []


def test_pcie_generation_downgrade_without_measurement_fires_with_idle_note():
    f = good_facts()
    f["gpus"][0]["pcie"]["gen"] = 1
    hit = only(rules.evaluate(f), "pcie-link-degraded")
    assert any("idle" in e for e in hit.evidence)


def test_thp_disabled_fix_is_the_madvise_command():
    hit = only(rules.evaluate(*bad("thp-disabled")), "thp-disabled")
    assert "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled" in hit.fix


def test_thp_setting_in_raw_sysfs_form():
    f = good_facts()
    f["host"]["thp"]["enabled"] = "always madvise [never]"
    only(rules.evaluate(f), "thp-disabled")


def test_gvisor_shmem_thp_mentions_issue_and_ferry():
    f, m = bad("gvisor-shmem-thp")
    m["pageable_d2h_gbps_cuda"]["0"] = 5.1
    hit = only(rules.evaluate(f, m), "gvisor-shmem-thp")
    text = " ".join(hit.evidence) + hit.fix
    assert "12804" in text
    assert "ferry" in hit.fix and "advise" in hit.fix and "MADV_NOHUGEPAGE" in hit.fix
    assert "5.1 GB/s" in text and "ferry 46.0 GB/s" in text


@pytest.mark.parametrize("shmem", ["force", "[always] within_size advise never deny force"])
def test_gvisor_shmem_force_and_raw_form(shmem):
    f, m = bad("gvisor-shmem-thp")
    f["host"]["thp"]["shmem_enabled"] = shmem
    only(rules.evaluate(f, m), "gvisor-shmem-thp")


@pytest.mark.parametrize("kind, shmem", [("gvisor", "advise"), ("gvisor", "never"), ("kvm", "always")])
def test_gvisor_shmem_thp_needs_both(kind, shmem):
    f = good_facts()
    f["host"]["virtualization"]["kind"] = kind
    f["host"]["thp"]["shmem_enabled"] = shmem
    assert [x for x in rules.evaluate(f) if x.id == "gvisor-shmem-thp"] == []


def test_memlock_uses_planned_pool_and_default():
    f, m = good_facts(), good_measurements()
    f["host"]["memlock_bytes"] = 4 * GiB
    only(rules.evaluate(f, m), "memlock-low")  # 4 GiB < 8 GiB planned
    del m["pool_bytes_planned"]
    assert [x for x in rules.evaluate(f, m) if x.id == "memlock-low"] == []  # >= 1 GiB default
    f["host"]["memlock_bytes"] = 8 * MiB
    hit = only(rules.evaluate(f, m), "memlock-low")
    assert "8 MiB" in hit.evidence[0] and "1 GiB (assumed default)" in hit.evidence[0]
    assert "ulimit -l unlimited" in hit.fix and "LimitMEMLOCK=infinity" in hit.fix
    assert "--ulimit memlock=-1" in hit.fix


def test_memlock_absent_is_unknown():
    f = good_facts()
    del f["host"]["memlock_bytes"]
    assert [x for x in rules.evaluate(f) if x.id == "memlock-low"] == []


def test_hugetlb_count_follows_planned_pool():
    f, m = bad("hugetlb-not-reserved")
    hit = only(rules.evaluate(f, m), "hugetlb-not-reserved")
    assert "echo 4096 | sudo tee /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages" in hit.fix
    m["pool_bytes_planned"] = 1 * GiB + 1
    hit = only(rules.evaluate(f, m), "hugetlb-not-reserved")
    assert "echo 513 |" in hit.fix


def test_hugetlb_warning_when_thp_is_off_too():
    f, m = bad("hugetlb-not-reserved")
    f["host"]["thp"]["enabled"] = "never"
    assert only(rules.evaluate(f, m), "hugetlb-not-reserved").severity == "warning"


def test_hugetlb_empty_list_is_unknown():
    f = good_facts()
    f["host"]["hugetlb"] = []
    assert [x for x in rules.evaluate(f) if x.id == "hugetlb-not-reserved"] == []


def test_numa_mismatch_by_cpus():
    f = good_facts()
    f["host"]["process"]["cpus_allowed"] = "16-31"
    hit = only(rules.evaluate(f), "numa-mismatch")
    assert "numactl --cpunodebind=0 --membind=0" in hit.fix


def test_numa_node_minus_one_is_unknown():
    f = good_facts()
    f["gpus"][0]["numa_node"] = -1
    f["host"]["process"]["mems_allowed"] = "1"
    assert [x for x in rules.evaluate(f) if x.id == "numa-mismatch"] == []


def test_iommu_fix_is_iommu_pt():
    assert "iommu=pt" in only(rules.evaluate(*bad("iommu-translated")), "iommu-translated").fix


def test_vm_first_touch_quotes_rates():
    hit = only(rules.evaluate(*bad("vm-first-touch-costly")), "vm-first-touch-costly")
    text = " ".join(hit.evidence)
    assert "30.0 GB/s" in text and "40.0 GB/s" in text and "2.1 GB/s" in text
    assert "PinnedPool" in hit.fix


def test_vm_first_touch_is_info_when_single_thread_is_fast():
    f, m = bad("vm-first-touch-costly")
    m["first_touch_4k_1thread_gbps"] = 6.0
    assert only(rules.evaluate(f, m), "vm-first-touch-costly").severity == "info"


def test_vm_first_touch_needs_a_measurement():
    f, m = bad("vm-first-touch-costly")
    del m["first_touch_4k_gbps"]
    assert [x for x in rules.evaluate(f, m) if x.id == "vm-first-touch-costly"] == []


def test_gdrdrv_absent_quotes_reason_and_channel():
    hit = only(rules.evaluate(*bad("gdrdrv-absent")), "gdrdrv-absent")
    text = " ".join(hit.evidence)
    assert "/dev/gdrdrv not found" in text and "persistent GPU kernel" in text


def test_no_cuda_driver_only_when_cuda_is_none_not_absent():
    f = good_facts()
    del f["cuda"]
    assert [x for x in rules.evaluate(f) if x.id == "no-cuda-driver"] == []


def test_pageable_path_quotes_ferry_and_memcpy():
    hit = only(rules.evaluate(*bad("pageable-path-slow")), "pageable-path-slow")
    text = " ".join(hit.evidence)
    assert "7.9 GB/s" in text and "13%" in text and "48.0 GB/s" in text and "6.1x" in text
    assert "1 thread 9.2 GB/s, 4 threads 32.0 GB/s, 16 threads 37.5 GB/s" in text


def test_int_keys_in_per_gpu_measurements():
    f, m = good_facts(), good_measurements()
    m["pinned_h2d_gbps"] = {0: 40.0}
    only(rules.evaluate(f, m), "pinned-bandwidth-low")


def test_second_gpu_is_checked():
    f, m = good_facts(), good_measurements()
    gpu1 = copy.deepcopy(f["gpus"][0])
    gpu1.update(index=1, pci_bus_id="00000000:9A:00.0", numa_node=1, cpu_affinity="16-31")
    f["gpus"].append(gpu1)
    m["pinned_h2d_gbps"]["1"] = 30.0
    findings = rules.evaluate(f, m)
    assert "GPU 1" in " ".join(only(findings, "pinned-bandwidth-low").evidence)
    numa = only(findings, "numa-mismatch")
    assert "GPU 1" in " ".join(numa.evidence) and "GPU 0" not in " ".join(numa.evidence)
    assert "--cpunodebind=1 --membind=1" in numa.fix


def _crew(threads, workers=0, node=None, **profile):
    """The GOOD machine with a copy crew of `threads` and the profile fields given."""
    f, m = good_facts(), good_measurements()
    engine = f["host"]["copy_engine"]
    engine.update(crew_threads=threads, workers_option=workers, crew_numa_node=node)
    engine["profile"].update(profile)
    return f, m


@pytest.mark.parametrize("threads, severity, row", [
    (1, "warning", "to 1 thread: device->host 512 MiB staged 4.6 vs pin-in-place 18.5 GB/s (4.0x)"),
    (2, "warning", "to 2 threads: device->host 512 MiB staged 6.3 vs hybrid 19.5 GB/s (3.1x)"),
    (3, "info", "to 4 threads: device->host 64 MiB staged 15.5 vs hybrid 40.0 GB/s (2.6x)"),
    (4, "info", "to 4 threads: device->host 64 MiB staged 15.5 vs hybrid 40.0 GB/s (2.6x)"),
])
def test_small_crew_without_profile_fires_with_the_h200_figures(threads, severity, row):
    hit = only(rules.evaluate(*_crew(threads, workers=threads)), "small-crew-uncalibrated")
    assert hit.severity == severity
    text = " ".join(hit.evidence)
    assert f"crew has {threads} thread" in text and f"FERRY_COPY_WORKERS={threads}" in text
    assert "measured on an H200 (PCIe Gen5) with the crew limited by FERRY_COPY_WORKERS " + row in text
    assert "/home/u/.cache/ferry/profile.txt does not exist, FERRY_PROFILE unset" in text
    assert "device->host 64 MiB 23.6 GB/s instead of staged 9.9 GB/s" in text
    assert hit.fix.startswith("`ferry bench copy --calibrate`, once on this machine")
    assert "writes the profile the engine reads (/home/u/.cache/ferry/profile.txt)" in hit.fix
    assert "raise FERRY_COPY_WORKERS" in hit.fix


def test_small_crew_sized_by_cores_quotes_the_node_and_this_machines_memcpy():
    hit = only(rules.evaluate(*_crew(4, node=1)), "small-crew-uncalibrated")
    text = " ".join(hit.evidence)
    assert "crew has 4 threads (one per CPU this process may use on NUMA node 1)" in text
    assert "host memcpy on 4 threads measured here: 32.0 GB/s" in text
    assert "raise FERRY_COPY_WORKERS" not in hit.fix


def test_small_crew_without_a_cache_directory_says_where_to_write():
    hit = only(rules.evaluate(*_crew(2, path=None)), "small-crew-uncalibrated")
    assert "XDG_CACHE_HOME and HOME are unset" in " ".join(hit.evidence)
    assert hit.fix.startswith("set XDG_CACHE_HOME or HOME (or FERRY_PROFILE=<file>)")


@pytest.mark.parametrize("threads, profile", [
    (5, {}), (8, {}), (16, {}),  # a crew large enough: staging wins (or calibrating gains little)
    (2, {"present": True}),  # a profile is in use
    (2, {"named": True, "path": "/etc/ferry.txt"}),  # FERRY_PROFILE names one (missing: the engine says so)
    (None, {}), (2, {"present": None}), (2, {"named": None}),  # unknown
])
def test_small_crew_silent(threads, profile):
    assert [x for x in rules.evaluate(*_crew(threads, **profile)) if x.id == "small-crew-uncalibrated"] == []


def test_small_crew_silent_without_a_gpu_or_engine_facts():
    f, m = _crew(1)
    f["gpus"], f["cuda"]["device_count"] = [], 0
    assert [x for x in rules.evaluate(f, m) if x.id == "small-crew-uncalibrated"] == []
    f, m = _crew(1)
    del f["host"]["copy_engine"]
    assert [x for x in rules.evaluate(f, m) if x.id == "small-crew-uncalibrated"] == []
