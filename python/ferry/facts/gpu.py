"""Per-GPU facts: what CUDA said (name, memory, PCI address), what sysfs says about the
device's PCIe link, NUMA node, CPU affinity and BAR1, and what NVML says when
libnvidia-ml.so.1 loads.

NVML values win over sysfs where both exist: inside a VM the sysfs link of a device
behind an emulated root port can be wrong, while NVML asks the GPU itself. Each
chosen value records its source. Nothing here raises; unknown facts are None.
"""

from __future__ import annotations

import ctypes
import os

from . import parsers
from .host import read_text

SYS_PCI_DEVICES = "/sys/bus/pci/devices"
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0

# Keys of a cuda_info device that gpu_facts maps to named facts; the rest are kept
# under "cuda_attributes".
_MAPPED_CUDA_KEYS = {"index", "name", "total_memory_bytes", "pci_bus_id", "compute_capability"}


# --- NVML through ctypes ---------------------------------------------------------------


class Bar1Memory(ctypes.Structure):
    """nvmlBAR1Memory_t."""

    _fields_ = [
        ("bar1Total", ctypes.c_ulonglong),
        ("bar1Free", ctypes.c_ulonglong),
        ("bar1Used", ctypes.c_ulonglong),
    ]


class Nvml:
    """An NVML session: open() loads the library and calls nvmlInit_v2; close() shuts it down.

    `error` says why the session could not be opened. Queries on a closed session,
    or that NVML refuses, give None.
    """

    def __init__(self) -> None:
        self.lib: ctypes.CDLL | None = None
        self.error: str | None = None

    def open(self) -> bool:
        try:
            lib = ctypes.CDLL(NVML_LIBRARY)
        except OSError as exc:
            self.error = f"{NVML_LIBRARY} not loadable ({exc})"
            return False
        try:
            lib.nvmlInit_v2.restype = ctypes.c_int
            status = lib.nvmlInit_v2()
        except AttributeError:
            self.error = "nvmlInit_v2 missing from the NVML library"
            return False
        if status != NVML_SUCCESS:
            self.error = f"nvmlInit_v2 failed with NVML error {status}"
            return False
        self.lib = lib
        return True

    def close(self) -> None:
        if self.lib is None:
            return
        try:
            self.lib.nvmlShutdown()
        except AttributeError:
            pass
        self.lib = None

    def device(self, bus_id: str) -> ctypes.c_void_p | None:
        """The NVML handle of the device at a PCI address, or None."""
        handle = ctypes.c_void_p()
        status = self._call(
            "nvmlDeviceGetHandleByPciBusId_v2",
            [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
            bus_id.encode("ascii", "replace"),
            ctypes.byref(handle),
        )
        return handle if status == NVML_SUCCESS and handle.value else None

    def unsigned(self, function: str, handle: ctypes.c_void_p) -> int | None:
        """The unsigned int that `function(device, unsigned int *)` writes, or None."""
        value = ctypes.c_uint()
        status = self._call(
            function, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)], handle, ctypes.byref(value)
        )
        return value.value if status == NVML_SUCCESS else None

    def bar1_total(self, handle: ctypes.c_void_p) -> int | None:
        """BAR1 size in bytes from nvmlDeviceGetBAR1MemoryInfo, or None."""
        info = Bar1Memory()
        status = self._call(
            "nvmlDeviceGetBAR1MemoryInfo",
            [ctypes.c_void_p, ctypes.POINTER(Bar1Memory)],
            handle,
            ctypes.byref(info),
        )
        return info.bar1Total if status == NVML_SUCCESS and info.bar1Total else None

    def _call(self, name: str, argtypes: list, *args) -> int | None:
        if self.lib is None:
            return None
        try:
            function = getattr(self.lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            return function(*args)
        except (AttributeError, ctypes.ArgumentError, OSError):
            return None


def nvml_device_facts(nvml: Nvml, bus_id: str | None) -> dict | None:
    """{"gen", "width", "max_gen", "max_width", "bar1_bytes"} from NVML, or None."""
    if nvml.lib is None or not bus_id:
        return None
    handle = nvml.device(bus_id)
    if handle is None:
        return None
    return {
        "gen": nvml.unsigned("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "width": nvml.unsigned("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "max_gen": nvml.unsigned("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "max_width": nvml.unsigned("nvmlDeviceGetMaxPcieLinkWidth", handle),
        "bar1_bytes": nvml.bar1_total(handle),
    }


# --- sysfs -------------------------------------------------------------------------


def sysfs_device_facts(bus_id: str | None) -> dict:
    """Link, NUMA, CPU affinity and BAR1 of the PCI device at `bus_id` from sysfs."""
    path = os.path.join(SYS_PCI_DEVICES, bus_id) if bus_id else None
    present = path is not None and os.path.isdir(path)
    read = _DeviceFiles(path if present else None).read
    bar1_region, bar1 = parsers.nvidia_bar1_region(parsers.parse_pci_resource(read("resource")))
    return {
        "path": path,
        "present": present,
        "gen": parsers.pcie_speed_to_gen(read("current_link_speed")),
        "width": parsers.pcie_link_width(read("current_link_width")),
        "max_gen": parsers.pcie_speed_to_gen(read("max_link_speed")),
        "max_width": parsers.pcie_link_width(read("max_link_width")),
        "bar1_bytes": bar1,
        "bar1_region": bar1_region,
        "numa_node": parsers.parse_numa_node(read("numa_node")),
        "local_cpulist": parsers.compact_cpulist(read("local_cpulist")),
    }


class _DeviceFiles:
    """Reads files of one sysfs device directory; every read gives None without one."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def read(self, name: str) -> str | None:
        return read_text(os.path.join(self.path, name)) if self.path else None


# --- choosing between sources ---------------------------------------------------------


def pcie_facts(nvml: dict | None, sysfs: dict) -> dict:
    """{"gen", "width", "max_gen", "max_width", "source"}: NVML first, then sysfs."""
    chosen: dict = {}
    sources: set[str] = set()
    for key in ("gen", "width", "max_gen", "max_width"):
        value, source = _prefer(nvml, sysfs, key)
        chosen[key] = value
        if source:
            sources.add(source)
    chosen["source"] = "+".join(sorted(sources)) or None
    return chosen


def _prefer(nvml: dict | None, sysfs: dict, key: str) -> tuple[object, str | None]:
    if nvml and nvml.get(key) is not None:
        return nvml[key], "nvml"
    if sysfs.get(key) is not None:
        return sysfs[key], "sysfs"
    return None, None


def link_notes(nvml: dict | None, sysfs: dict, pcie: dict) -> list[str]:
    """Notes about a link below its maximum and about sources that disagree."""
    notes: list[str] = []
    if None not in (pcie["gen"], pcie["max_gen"], pcie["width"], pcie["max_width"]) and (
        pcie["gen"] < pcie["max_gen"] or pcie["width"] < pcie["max_width"]
    ):
        notes.append(
            f"link at gen {pcie['gen']} x{pcie['width']}, below its maximum gen "
            f"{pcie['max_gen']} x{pcie['max_width']}: GPUs slow the link when idle, "
            "so read it again under load before blaming the slot"
        )
    if nvml and sysfs.get("gen") is not None and nvml.get("gen") is not None:
        nv = (nvml["gen"], nvml["width"])
        fs = (sysfs["gen"], sysfs["width"])
        if nv != fs:
            notes.append(
                f"sysfs reports gen {fs[0]} x{fs[1]} but NVML gen {nv[0]} x{nv[1]} "
                "(an emulated root port in a VM shows its own link): using NVML"
            )
    return notes


# --- one GPU, all GPUs -------------------------------------------------------------


def gpu_facts(index: int, device: dict, nvml: Nvml) -> dict:
    """The facts of one cuda_info device."""
    raw_bus_id = device.get("pci_bus_id")
    bus_id = parsers.normalize_pci_bus_id(raw_bus_id if isinstance(raw_bus_id, str) else None)
    sysfs = sysfs_device_facts(bus_id)
    nvml_facts = nvml_device_facts(nvml, bus_id)
    pcie = pcie_facts(nvml_facts, sysfs)
    bar1, bar1_source = _prefer(nvml_facts, sysfs, "bar1_bytes")
    notes = link_notes(nvml_facts, sysfs, pcie)
    if bus_id is None:
        notes.append(f"PCI bus id {raw_bus_id!r} not understood: sysfs and NVML facts skipped")
    elif not sysfs["present"]:
        notes.append(f"no {sysfs['path']}: link, NUMA and BAR1 facts from sysfs unavailable")
    return {
        "index": _int_or(device.get("index"), index),
        "name": _str_or_none(device.get("name")),
        "memory_bytes": _int_or(device.get("total_memory_bytes"), None),
        "pci_bus_id": bus_id or _str_or_none(raw_bus_id),
        "compute_capability": _str_or_none(device.get("compute_capability")),
        "pcie": pcie,
        "link_gbps": parsers.link_gbps(pcie["gen"], pcie["width"]),
        "max_link_gbps": parsers.link_gbps(pcie["max_gen"], pcie["max_width"]),
        "bar1_bytes": bar1,
        "bar1_source": bar1_source,
        "numa_node": sysfs["numa_node"],
        "cpu_affinity": sysfs["local_cpulist"],
        "sysfs": sysfs,
        "nvml": nvml_facts,
        "cuda_attributes": _scalar_attributes(device),
        "notes": notes,
    }


def collect_gpus(cuda_info: dict | None) -> tuple[list[dict], list[str]]:
    """(facts of every device in cuda_info, notes about NVML); ([], []) without a driver."""
    devices = cuda_info.get("devices") if isinstance(cuda_info, dict) else None
    if not isinstance(devices, list) or not devices:
        return [], []
    nvml = Nvml()
    notes = [] if nvml.open() else [f"NVML unavailable: {nvml.error}"]
    try:
        gpus = [
            gpu_facts(i, device if isinstance(device, dict) else {}, nvml)
            for i, device in enumerate(devices)
        ]
    finally:
        nvml.close()
    return gpus, notes


def _int_or(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _scalar_attributes(device: dict) -> dict:
    return {
        str(key): value
        for key, value in device.items()
        if key not in _MAPPED_CUDA_KEYS and isinstance(value, (int, float, str, bool, type(None)))
    }
