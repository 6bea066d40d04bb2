"""PCIe formats: link speed and width, a link's limit, BAR regions, bus ids, NUMA
nodes."""

from __future__ import annotations

import re

from .integers import parse_int

# --- PCIe -----------------------------------------------------------------------

# Transfer rate per lane in GT/s, by generation.
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# Share of the raw bit rate that carries data after line encoding, by generation.
PCIE_ENCODING = {
    1: 8 / 10,
    2: 8 / 10,
    3: 128 / 130,
    4: 128 / 130,
    5: 128 / 130,
    6: 242 / 256,
}


def pcie_speed_to_gen(text: str | None) -> int | None:
    """The PCIe generation of a sysfs link speed: "32.0 GT/s PCIe" -> 5, "Unknown" -> None."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", text)
    if not match:
        return None
    rate = float(match.group(1))
    for gen, gt_per_s in PCIE_GT_PER_S.items():
        if abs(rate - gt_per_s) < 0.01:
            return gen
    return None


def pcie_link_width(text: str | None) -> int | None:
    """A sysfs link width ("16"); 0 (link down) and 255 (unknown) give None."""
    width = parse_int(text)
    if width is None or width <= 0 or width >= 255:
        return None
    return width


def link_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical per-direction data rate of a PCIe link in GB/s: gen 5, x16 -> 63.0."""
    if gen not in PCIE_GT_PER_S or not isinstance(width, int) or width <= 0:
        return None
    bits_per_s = PCIE_GT_PER_S[gen] * 1e9 * width * PCIE_ENCODING[gen]
    return round(bits_per_s / 8 / 1e9, 1)


def parse_pci_resource(text: str | None) -> list[int] | None:
    """Sizes in bytes of the regions in a sysfs `resource` file; unused regions are 0.

    Each line is "start end flags" in hex; the size is end - start + 1.
    """
    if not text:
        return None
    sizes: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            return None
        try:
            start, end = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            return None
        sizes.append(end - start + 1 if end > start else 0)
    return sizes


def nvidia_bar1_region(sizes: list[int] | None) -> tuple[int | None, int | None]:
    """(resource index, size) of what NVIDIA calls BAR1: the second BAR in use.

    With a 32-bit BAR0 that is region 1; with a 64-bit BAR0 (Hopper, e.g. H100/H200)
    BAR0 fills regions 0-1 and BAR1 is region 2. Only the six standard BARs count
    (region 6 is the expansion ROM).
    """
    used = [index for index, size in enumerate((sizes or [])[:6]) if size > 0]
    if len(used) < 2:
        return None, None
    return used[1], sizes[used[1]]


def normalize_pci_bus_id(bus_id: str | None) -> str | None:
    """A PCI address as sysfs names it: "00000000:0A:00.0" -> "0000:0a:00.0"."""
    if not bus_id:
        return None
    match = re.match(
        r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*$",
        bus_id,
    )
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return (
        f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:"
        f"{int(device, 16):02x}.{int(function)}"
    )


def parse_numa_node(text: str | None) -> int | None:
    """A sysfs numa_node value; -1 (no affinity) gives None."""
    node = parse_int(text)
    return node if node is not None and node >= 0 else None
