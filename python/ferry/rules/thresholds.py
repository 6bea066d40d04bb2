"""The rules' thresholds and fixed inputs, each with the reason beside it."""

from __future__ import annotations

from ..units import GiB

# Thresholds, each with the reason beside it.
PINNED_MIN_SHARE = 0.85  # pinned copies reach 85-90% of the link on a healthy PCIe path
PAGEABLE_MIN_SHARE = 0.25  # below a quarter of the link, staging through pinned memory wins 3x+
FIRST_TOUCH_1THREAD_MIN_GBPS = 4.0  # bare metal touches 4 KiB pages at 5-10 GB/s per thread
DEFAULT_POOL_BYTES = 1 * GiB  # pinned pool size assumed when the user plans none

# Virtualization kinds that share the host kernel: page faults cost what they cost on
# bare metal, so they are not "VMs" for the first-touch rule.
_NOT_A_VM = frozenset({"bare-metal", "none", "container", "docker", "podman", "lxc", "wsl-container"})

_THP = "/sys/kernel/mm/transparent_hugepage"
