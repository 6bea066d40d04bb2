"""The facts part of `ferry doctor`: what this host and its GPUs are, as one dict.

collect(cuda_info) returns

    {"host": {...}, "cuda": {...} or None, "gpus": [...], "notes": [...]}

host: kernel, os, virtualization {kind, hypervisor, evidence, container}, cpu {model,
  logical_cpus, online}, numa_nodes [{id, cpus, mem_total_bytes}], memory
  {total_bytes, available_bytes}, thp {enabled, defrag, shmem_enabled,
  pmd_size_bytes, sizes}, hugetlb [{page_size_bytes, total, free, reserved,
  surplus}], memlock_bytes (None = unlimited), iommu {present, groups, mode,
  evidence, cmdline}, process {cpus_allowed, mems_allowed}, kernel_modules
  {loadable, evidence}, gdrcopy {gdrdrv, libgdrapi, available, reason},
  copy_engine {workers_option, crew_threads, crew_numa_node, profile {path, named,
  present, problem}}, torch_alloc_conf {variable, value, shadowed, pinned_use_host_register,
  error}, notes.
copy_engine: what ferry's copy engine would use in this process, as the engine
  decides it (copy_engine.py; no CUDA needed). workers_option: FERRY_COPY_WORKERS
  as the engine parsed it (0 when unset: one thread per CPU). crew_threads:
  threads of the smallest crew serving this host's GPUs (the default crew without
  GPU facts), counting the calling thread, as engine.stats()["crew_threads"];
  crew_numa_node: the node that crew is bound to (None: not bound). profile: the
  machine profile file (path: None when FERRY_PROFILE, XDG_CACHE_HOME and HOME
  are all unset; named: FERRY_PROFILE named it; present: True for a file the
  engine reads as a profile, False for nothing there, so the built-in defaults,
  None for a file the engine refuses, with `problem` saying why). All four
  are None, with a note, when the engine refuses the FERRY_* variables; copy_engine
  is None when collect() is not given the native module.
torch_alloc_conf: PyTorch's allocator settings in this process's environment, read
  as PyTorch's CUDA allocator reads them (torch_alloc.py): variable
  (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF, else None) and its value;
  shadowed: the other one when both are set; pinned_use_host_register: whether
  PyTorch's pinned memory is malloc + cudaHostRegister (memory that every fork()
  copies) rather than cudaHostAlloc, None with `error` when PyTorch refuses the text.
cuda: None without a driver, else {driver_version, runtime_version, device_count}.
gpus: one entry per device of cuda_info, see gpu.gpu_facts.

cuda_info comes from the native module, and so does `engine`, the module itself
(the caller passes both in: this package imports nothing of ferry): None when
there is no CUDA driver, else {"driver_version": 13000, "runtime_version": 13000,
"devices": [{"index", "name", "total_memory_bytes", "pci_bus_id",
"compute_capability", ...}]}. Everything in the result is JSON-ready, and collect()
never raises: a fact that cannot be read is None, with a note where it helps.

This package reads the machine with the standard library; of the native module
it calls, through `engine`, only the no-CUDA functions that give the copy engine's
own decisions (copy_engine.py: one place for each, in C++). The doctor's report
(ferry/doctor/report.py) renders the facts.
"""

from __future__ import annotations

from . import parsers
from .copy_engine import collect_copy_engine
from .gpu import collect_gpus
from .host import collect_host

__all__ = ["collect", "cuda_facts"]

FACTS_VERSION = 1


def cuda_facts(cuda_info: dict | None) -> dict | None:
    """{"driver_version", "runtime_version", "device_count"} from cuda_info, or None."""
    if not isinstance(cuda_info, dict):
        return None
    devices = cuda_info.get("devices")
    return {
        "driver_version": parsers.cuda_version_string(cuda_info.get("driver_version")),
        "runtime_version": parsers.cuda_version_string(cuda_info.get("runtime_version")),
        "device_count": len(devices) if isinstance(devices, list) else 0,
    }


def collect(cuda_info: dict | None = None, engine=None) -> dict:
    """All facts about this machine; `cuda_info` is what the native module reported,
    `engine` the native module itself (ferry._ferry: the copy engine's settings,
    host.copy_engine; None when not given)."""
    notes: list[str] = []
    try:
        gpus, gpu_notes = collect_gpus(cuda_info)
    except Exception as exc:  # a bug here must not take `ferry doctor` down
        gpus, gpu_notes = [], [f"GPU facts failed: {type(exc).__name__}: {exc}"]
    notes += gpu_notes
    host = collect_host()
    try:
        host["copy_engine"] = None if engine is None else collect_copy_engine(gpus, host["notes"], engine)
    except Exception as exc:  # as above
        host["copy_engine"] = None
        host["notes"].append(f"reading the copy engine's settings failed: {type(exc).__name__}: {exc}")
    return {
        "facts_version": FACTS_VERSION,
        "host": host,
        "cuda": cuda_facts(cuda_info),
        "gpus": gpus,
        "notes": notes,
    }
