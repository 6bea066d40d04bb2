"""The rules' thresholds and fixed inputs, each with the reason beside it."""

from __future__ import annotations

from ..units import GiB

# Thresholds, each with the reason beside it.
PINNED_MIN_SHARE = 0.85  # pinned copies reach 85-90% of the link on a healthy PCIe path
PAGEABLE_MIN_SHARE = 0.25  # below a quarter of the link, staging through pinned memory wins 3x+
FIRST_TOUCH_1THREAD_MIN_GBPS = 4.0  # bare metal touches 4 KiB pages at 5-10 GB/s per thread
DEFAULT_POOL_BYTES = 1 * GiB  # pinned pool size assumed when the user plans none
# Copy crews (threads counting the caller). Staging is memcpy on the crew: on the H200
# with the crew limited by FERRY_COPY_WORKERS, a non-staged strategy beat it device->host
# at 1, 2 and 4 threads (by 1.4-4.0x; 2.6x at 4) while the full crew of 16 staged fastest
# everywhere; only a calibrated profile lets `auto` pick those strategies.
SMALL_CREW_MAX_THREADS = 4
# At 1-2 threads host->device lost too (by 1.25-2.2x); at 4 staging still won it.
SMALL_CREW_WARN_THREADS = 2

# Virtualization kinds that share the host kernel: page faults cost what they cost on
# bare metal, so they are not "VMs" for the first-touch rule.
_NOT_A_VM = frozenset({"bare-metal", "none", "container", "docker", "podman", "lxc", "wsl-container"})

_THP = "/sys/kernel/mm/transparent_hugepage"
