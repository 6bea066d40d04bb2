"""Tests of ferry doctor's findings engine (python/ferry/rules.py).

A GOOD synthetic machine (H200, PCIe Gen5 x16, bare metal, everything tuned) must give no
finding at all; for every rule a BAD variant changes only what that rule reads and must
make it fire with evidence and a fix. """

import copy
import re
import sys
from pathlib import Path

import pytest

from ferry import rules
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
    "gpu-below-peers": ("warning", lambda f, m: _add_second_gpu(f, m, link=31.5, gen=4, pinned=27.5)),
    "nixl-ucx-slow-settings": ("warning", _set(("m", "nixl"), {"installed": True, "warnings": [
        {"setting": "UCX_TLS=sm,self", "problem": "no CUDA transport on a GPU machine",
         "fix": "unset UCX_TLS or add cuda_copy,cuda_ipc"}]})),
}


def _add_second_gpu(f, m, link, gen, pinned):
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
    "pageable-path-slow",
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


# ------------------------------------------------------------------------------ good


def test_good_machine_has_no_findings():
    findings = rules.evaluate(good_facts(), good_measurements())
    assert [x for x in findings if x.severity in ("critical", "warning")] == []
    assert findings == []


def test_good_machine_without_measurements_has_no_findings():
    assert rules.evaluate(good_facts()) == []


# ------------------------------------------------------------------------------- bad


def test_every_rule_has_a_bad_variant():
    assert {r.id for r in rules.RULES} == set(BAD)
    assert REQUIRED_IDS <= set(BAD)


@pytest.mark.parametrize("rule_id", sorted(BAD))
def test_rule_fires_on_bad_machine(rule_id):
    severity, _ = BAD[rule_id]
    findings = rules.evaluate(*bad(rule_id))
    hit = only(findings, rule_id)
    assert hit.severity == severity
    assert hit.evidence and all(isinstance(e, str) and e for e in hit.evidence)
    assert hit.fix.strip()
    assert hit.title.strip()
    assert errors(findings) == []


@pytest.mark.parametrize("rule_id", sorted(BAD))
def test_rule_silent_on_good_machine(rule_id):
    assert [x for x in rules.evaluate(good_facts(), good_measurements()) if x.id == rule_id] == []


def test_gpu_below_peers_quotes_the_slow_gpu_and_the_best():
    f, m = bad("gpu-below-peers")
    hit = only(rules.evaluate(f, m), "gpu-below-peers")
    text = " ".join(hit.evidence)
    assert "GPU 1" in text and "31.5 GB/s" in text and "63.0 GB/s" in text, text
    assert "27.5 GB/s" in text and "55.4 GB/s" in text, text


def test_two_equal_gpus_are_not_flagged():
    f, m = good_facts(), good_measurements()
    _add_second_gpu(f, m, link=63.0, gen=5, pinned=54.0)
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


# ------------------------------------------------------------------- unknown / errors


def test_empty_inputs_do_not_raise():
    assert rules.evaluate({}) == []
    assert rules.evaluate({}, {}) == []
    assert rules.evaluate(None, None) == []


def _leaf_paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _leaf_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaf_paths(v, prefix + (i,))


def _get_parent(root, path):
    for key in path[:-1]:
        root = root[key]
    return root


@pytest.mark.parametrize("path", [p for p in _leaf_paths(good_facts()) if p != ("cuda",)], ids=str)
def test_missing_or_none_fact_is_silent(path):
    for how in ("none", "delete"):
        f = good_facts()
        parent = _get_parent(f, path)
        if how == "none":
            parent[path[-1]] = None
        else:
            del parent[path[-1]]
        findings = rules.evaluate(f, good_measurements())
        assert errors(findings) == [], (how, path, findings)
        assert [x for x in findings if x.severity != "info"] == [], (how, path, findings)


@pytest.mark.parametrize("key", sorted(good_measurements()))
def test_missing_measurement_is_silent(key):
    m = good_measurements()
    del m[key]
    assert rules.evaluate(good_facts(), m) == []


def test_raising_rule_becomes_info_finding():
    def boom(facts, measurements):
        raise RuntimeError("kaboom")

    ok = rules.Rule("zz-ok", "warning", "ok", "always fires",
                    lambda f, m: rules.Verdict(["x"], "y"))
    bad_rule = rules.Rule("aa-boom", "critical", "boom", "raises", boom)
    findings = rules.evaluate({}, {}, rules=[bad_rule, ok])
    assert [x.id for x in findings] == ["zz-ok", "aa-boom"]
    err = findings[1]
    assert err.severity == "info"
    assert err.title == "rule aa-boom could not be evaluated: RuntimeError: kaboom"
    assert err.fix


def test_rule_returning_garbage_becomes_info_finding():
    rule = rules.Rule("garbage", "warning", "g", "returns a string", lambda f, m: "oops")
    weird = rules.Rule("weird", "warning", "w", "bad severity",
                       lambda f, m: rules.Verdict(["e"], "f", severity="fatal"))
    findings = rules.evaluate({}, {}, rules=[rule, weird])
    assert [(x.id, x.severity) for x in findings] == [("garbage", "info"), ("weird", "info")]
    assert all("could not be evaluated" in x.title for x in findings)


@pytest.mark.parametrize(
    "facts, measurements, rule_id",
    [
        ({"gpus": "not a list"}, {}, "bar1-small"),
        ({"host": {"thp": {"enabled": 7}}}, {}, "thp-disabled"),
        ({"host": {"process": {"mems_allowed": "zero"}}, "gpus": [{"numa_node": 0}]}, {}, "numa-mismatch"),
        (good_facts(), {"pinned_h2d_gbps": {"0": "55"}}, "pinned-bandwidth-low"),
        (good_facts(), {"pinned_h2d_gbps": 55.0}, "pinned-bandwidth-low"),
        ({"host": {"memlock_bytes": True}}, {}, "memlock-low"),
    ],
)
def test_malformed_input_is_reported_not_raised(facts, measurements, rule_id):
    findings = rules.evaluate(facts, measurements)
    hit = [x for x in findings if x.id == rule_id and "could not be evaluated" in x.title]
    assert hit and hit[0].severity == "info"
    assert format_findings(findings)


def test_non_dict_inputs_are_reported():
    findings = rules.evaluate(["not", "a", "dict"], {})
    assert len(findings) == len(rules.RULES)
    assert all(x.severity == "info" and "could not be evaluated" in x.title for x in findings)


# ---------------------------------------------------------------- order, table, format


def test_sorted_by_severity_then_id():
    def fires(rid, sev):
        return rules.Rule(rid, sev, rid, rid, lambda f, m: rules.Verdict(["e"], "f"))

    table = [fires("b-info", "info"), fires("z-crit", "critical"), fires("a-info", "info"),
             fires("m-warn", "warning"), fires("a-crit", "critical")]
    assert [x.id for x in rules.evaluate({}, {}, rules=table)] == [
        "a-crit", "z-crit", "m-warn", "a-info", "b-info"]


def test_real_rules_sorted_on_a_bad_machine():
    f, m = good_facts(), good_measurements()
    for rule_id in ("thp-disabled", "iommu-translated", "bar1-small", "memlock-low", "pageable-path-slow"):
        BAD[rule_id][1](f, m)
    findings = rules.evaluate(f, m)
    rank = {s: i for i, s in enumerate(rules.SEVERITIES)}
    keys = [(rank[x.severity], x.id) for x in findings]
    assert keys == sorted(keys)
    assert {"thp-disabled", "iommu-translated", "bar1-small", "memlock-low", "pageable-path-slow"} <= {
        x.id for x in findings}


def test_rule_table_is_well_formed():
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids))
    for r in rules.RULES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.id), r.id
        assert r.severity in rules.SEVERITIES
        assert r.title.strip()
        assert r.doc.strip() and "\n" not in r.doc
        assert callable(r.check)


def test_format_findings_contains_every_id():
    findings = []
    for rule_id in sorted(BAD):
        findings += [x for x in rules.evaluate(*bad(rule_id)) if x.id == rule_id]
    text = format_findings(findings)
    for rule_id in BAD:
        assert rule_id in text
    assert "severity" in text and "fix:" in text


def test_format_findings_empty():
    assert "No findings" in format_findings([])


def test_findings_take_id_title_and_default_severity_from_the_rule_table():
    table = {r.id: r for r in rules.RULES}
    for rule_id, (severity, _) in BAD.items():
        hit = only(rules.evaluate(*bad(rule_id)), rule_id)
        assert hit.title == table[rule_id].title
        assert hit.severity == severity


def test_finding_to_dict_has_fixed_keys():
    hit = only(rules.evaluate(*bad("bar1-small")), "bar1-small")
    assert set(hit.to_dict()) == {"id", "severity", "title", "evidence", "fix"}


@pytest.mark.parametrize(
    "text, expected",
    [("0-3", {0, 1, 2, 3}), ("0,2,4-5\n", {0, 2, 4, 5}), ("", set()), ("0-7:2/4", {0, 1, 4, 5})],
)
def test_parse_cpulist(text, expected):
    assert rules.parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1"])
def test_parse_cpulist_rejects_with_value_quoted(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        rules.parse_cpulist(text)
