"""Pure parsers for the procfs, sysfs and driver formats that `ferry doctor` reads.

Every function here takes text (or bytes, or plain values) and returns a value; none
touches the file system. Bad or empty input gives None (or an empty container where
that is the natural answer), never an exception, so that readers in host.py and
gpu.py can pass whatever they read straight through. The strict forms that raise
ValueError quoting the text (cpulist_ids, thp_setting) are for callers that must
tell garbage from "unknown" (ferry.rules). Work is bounded for every input: no range is
expanded beyond MAX_CPU_ID, no number has more than MAX_DIGITS digits.

One file per format family: integers.py, memory.py (THP, meminfo, hugetlb), cpus.py
(cpuinfo, cpulists, /proc/self/status), pcie.py, limits.py, kernel.py (os-release,
the command line, the IOMMU), cuda.py, virtualization.py, torch_alloc.py (PyTorch's
allocator settings, strict: it raises where PyTorch does); this package names them all.
"""

from __future__ import annotations

from .cpus import (MAX_CPU_ID, compact_cpulist, cpulist_ids, format_cpulist, parse_cpuinfo_flags,
                   parse_cpuinfo_model, parse_cpulist, parse_proc_status, status_cpus_allowed,
                   status_mems_allowed)
from .cuda import cuda_version_string
from .integers import MAX_DIGITS, parse_int
from .kernel import (IOMMU_CMDLINE_KEYS, iommu_cmdline_options, iommu_mode_from_cmdline,
                     iommu_mode_from_group_types, os_pretty_name, parse_cmdline, parse_os_release)
from .limits import memlock_from_limits, parse_limits, rlimit_bytes
from .memory import hugepages_dir_size, parse_meminfo, parse_thp_setting, thp_setting
from .pcie import (PCIE_ENCODING, PCIE_GT_PER_S, link_gbps, normalize_pci_bus_id, nvidia_bar1_region,
                   parse_numa_node, parse_pci_resource, pcie_link_width, pcie_speed_to_gen)
from .torch_alloc import (ALLOC_CONF_VARIABLES, PINNED_REGISTER_KEYS, alloc_conf_entries, alloc_conf_tokens,
                          alloc_conf_variable, alloc_conf_without, pinned_use_host_register)
from .virtualization import (GVISOR_VERSION_STAMP, acpi_oem_id, classify_virtualization,
                             clocksource_hypervisor, container_evidence, dmi_hypervisor, firecracker_evidence,
                             gvisor_evidence)

__all__ = [
    "ALLOC_CONF_VARIABLES",
    "GVISOR_VERSION_STAMP",
    "IOMMU_CMDLINE_KEYS",
    "MAX_CPU_ID",
    "MAX_DIGITS",
    "PCIE_ENCODING",
    "PCIE_GT_PER_S",
    "PINNED_REGISTER_KEYS",
    "acpi_oem_id",
    "alloc_conf_entries",
    "alloc_conf_tokens",
    "alloc_conf_variable",
    "alloc_conf_without",
    "classify_virtualization",
    "clocksource_hypervisor",
    "compact_cpulist",
    "container_evidence",
    "cpulist_ids",
    "cuda_version_string",
    "dmi_hypervisor",
    "firecracker_evidence",
    "format_cpulist",
    "gvisor_evidence",
    "hugepages_dir_size",
    "iommu_cmdline_options",
    "iommu_mode_from_cmdline",
    "iommu_mode_from_group_types",
    "link_gbps",
    "memlock_from_limits",
    "normalize_pci_bus_id",
    "nvidia_bar1_region",
    "os_pretty_name",
    "parse_cmdline",
    "parse_cpuinfo_flags",
    "parse_cpuinfo_model",
    "parse_cpulist",
    "parse_int",
    "parse_limits",
    "parse_meminfo",
    "parse_numa_node",
    "parse_os_release",
    "parse_pci_resource",
    "parse_proc_status",
    "parse_thp_setting",
    "pcie_link_width",
    "pcie_speed_to_gen",
    "pinned_use_host_register",
    "rlimit_bytes",
    "status_cpus_allowed",
    "status_mems_allowed",
    "thp_setting",
]
