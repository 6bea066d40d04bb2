"""Findings engine of `ferry doctor`: rules that turn facts and measurements into advice.

What this package holds:
  - `Finding`: one piece of advice (id, severity, title, evidence, fix) (model.py).
  - `Rule`: a check with a stable id, a default severity, a title and a one-line doc;
    its check returns a `Verdict` (evidence, fix, and a severity only where the
    evidence raises or lowers the rule's), and the Finding takes id, title and
    severity from the rule: RULES is the one place they are written. The checks
    read their input through inputs.py and sit in gpu_checks.py and host_checks.py;
    their thresholds in thresholds.py.
  - `RULES`: the table of every rule, in one place (here, in __init__.py).
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

from typing import Optional, Sequence

from .gpu_checks import (check_bar1_small, check_gdrdrv_absent, check_gpu_below_peers,
                         check_no_cuda_driver, check_no_gpu_visible, check_pageable_path_slow,
                         check_pcie_link_degraded, check_pinned_bandwidth_low)
from .host_checks import (check_gvisor_shmem_thp, check_hugetlb_not_reserved, check_iommu_translated,
                          check_memlock_low, check_memory_low_for_pool, check_nixl_ucx_slow_settings,
                          check_numa_mismatch, check_small_crew_uncalibrated, check_thp_defrag_never,
                          check_thp_disabled, check_torch_pinned_register, check_vm_first_touch_costly)
from ..errors import InvalidArgumentError
from .inputs import parse_cpulist
from .model import SEVERITIES, SEVERITY_RANK, Finding, Rule, Verdict

__all__ = [
    "SEVERITIES",
    "Finding",
    "Rule",
    "RULES",
    "Verdict",
    "evaluate",
    "parse_cpulist",
]


RULES: tuple[Rule, ...] = (
    Rule("pcie-link-degraded", "warning", "PCIe link runs below the speed the GPU and slot support",
         "a GPU's current PCIe generation or width is below the maximum it and its slot support",
         check_pcie_link_degraded),
    Rule("pinned-bandwidth-low", "warning", "Pinned copies run well below the PCIe link's limit",
         "measured pinned host->device or device->host bandwidth is below 85% of the GPU's link",
         check_pinned_bandwidth_low),
    Rule("gpu-below-peers", "warning", "One GPU's link or pinned bandwidth falls below the other GPUs'",
         "with several GPUs: a GPU's link speed or measured pinned bandwidth is below 85% of the best GPU's",
         check_gpu_below_peers),
    Rule("thp-disabled", "warning", "Transparent huge pages are disabled: pinning and first touch are slower",
         "transparent_hugepage/enabled is 'never', which slows pinning and first touch",
         check_thp_disabled),
    Rule("gvisor-shmem-thp", "warning", "gVisor with shmem THP: pageable device->host copies run at about half speed",
         "running under gVisor with shmem_enabled 'always' or 'force' (gVisor issue 12804)",
         check_gvisor_shmem_thp),
    Rule("memlock-low", "warning", "The locked-memory limit (ulimit -l) is below the planned pinned pool",
         "RLIMIT_MEMLOCK is finite and below the planned pinned pool (1 GiB when none is planned)",
         check_memlock_low),
    Rule("hugetlb-not-reserved", "info", "No hugetlb pages are reserved: the pinned pool cannot use them",
         "every hugetlb page size has zero pages reserved (warning when THP is disabled as well)",
         check_hugetlb_not_reserved),
    Rule("numa-mismatch", "warning", "The process runs or allocates on a NUMA node far from its GPU",
         "a GPU's NUMA node is outside the process's mems_allowed, or its local CPUs miss cpus_allowed",
         check_numa_mismatch),
    Rule("iommu-translated", "info", "IOMMU translates every DMA: registration costs more",
         "the IOMMU remaps every DMA (not passthrough), which makes registration cost more",
         check_iommu_translated),
    Rule("vm-first-touch-costly", "info", "First touch of memory is costly in this VM",
         "in a VM, quotes measured first-touch rates; warning when one thread touches 4 KiB pages below 4 GB/s",
         check_vm_first_touch_costly),
    Rule("bar1-small", "info", "BAR1 is smaller than device memory: limits GDRCopy and peer mappings",
         "a GPU's BAR1 aperture is smaller than its memory, limiting GDRCopy and peer mappings",
         check_bar1_small),
    Rule("gdrdrv-absent", "info", "GDRCopy is unavailable: ferry's channel serves small copies instead",
         "GDRCopy (gdrdrv module and libgdrapi) is not available; ferry's own channel needs neither",
         check_gdrdrv_absent),
    Rule("no-cuda-driver", "info", "No CUDA driver: GPU facts and measurements are skipped",
         "the CUDA driver could not be loaded, so GPU facts and measurements are skipped",
         check_no_cuda_driver),
    Rule("no-gpu-visible", "warning", "The CUDA driver is loaded but sees no GPU",
         "the CUDA driver is loaded but reports zero devices",
         check_no_gpu_visible),
    Rule("pageable-path-slow", "warning", "CUDA copies from pageable memory use a small share of the link",
         "measured CUDA pageable host->device or device->host bandwidth is below 25% of the link",
         check_pageable_path_slow),
    Rule("thp-defrag-never", "info", "THP defrag is off: huge pages only while free 2 MiB blocks last",
         "THP is enabled but defrag is 'never', so huge pages run out once memory fragments",
         check_thp_defrag_never),
    Rule("memory-low-for-pool", "warning", "The planned pinned pool is larger than the available memory",
         "the planned pinned pool (1 GiB when none is planned) exceeds the available host memory",
         check_memory_low_for_pool),
    Rule("nixl-ucx-slow-settings", "warning", "UCX settings in the environment force NIXL onto slow paths",
         "a UCX_TLS without a CUDA transport (or without cuda_ipc), UCX_RMA_PPLN_ENABLE=n or peer error "
         "handling on a GPU machine: NIXL transfers run at a few GB/s or less", check_nixl_ucx_slow_settings),
    Rule("small-crew-uncalibrated", "info",
         "Few copy threads and no machine profile: `auto` stages copies that other strategies move faster",
         "a GPU machine whose copy crew has at most 4 threads and no machine profile is in use (info: the "
         "figures are the H200's; warning at 1-2 threads, where both directions lost, by up to 4x)",
         check_small_crew_uncalibrated),
    Rule("torch-pinned-register-fork", "warning",
         "PyTorch pins by cudaHostRegister: every fork() copies its pinned memory into the child",
         "PYTORCH_CUDA_ALLOC_CONF (else PYTORCH_ALLOC_CONF) sets pinned_use_cuda_host_register:True, which "
         "makes PyTorch's pinned memory anonymous registered memory that the kernel copies at every fork",
         check_torch_pinned_register),
)


# ------------------------------------------------------------------------ evaluation


def _sort_key(f: Finding) -> tuple:
    return (SEVERITY_RANK.get(f.severity, len(SEVERITIES)), f.id, f.title)


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
                raise InvalidArgumentError(f"facts must be an object, got {type(facts).__name__}")
            if not isinstance(measurements, dict):
                raise InvalidArgumentError(f"measurements must be an object, got {type(measurements).__name__}")
            verdict = rule.check(facts, measurements)
            if verdict is None:
                continue
            if not isinstance(verdict, Verdict):
                raise InvalidArgumentError(f"check returned {type(verdict).__name__}, not a Verdict")
            severity = rule.severity if verdict.severity is None else verdict.severity
            if severity not in SEVERITY_RANK:
                raise InvalidArgumentError(f"check returned unknown severity {severity!r}")
            findings.append(Finding(rule.id, severity, rule.title, list(verdict.evidence), verdict.fix))
        except Exception as error:  # one bad rule must not kill the report
            findings.append(_error_finding(rule, error))
    findings.sort(key=_sort_key)
    return findings
