"""/etc/os-release, the kernel command line, and the IOMMU mode it and the IOMMU
groups give."""

from __future__ import annotations

from typing import Iterable

# --- /etc/os-release and the kernel command line ---------------------------------------


def parse_os_release(text: str | None) -> dict[str, str]:
    """/etc/os-release as {KEY: value} with quotes removed."""
    fields: dict[str, str] = {}
    if not text:
        return fields
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key] = value
    return fields


def os_pretty_name(text: str | None) -> str | None:
    """PRETTY_NAME of /etc/os-release, else NAME VERSION, else None."""
    fields = parse_os_release(text)
    if fields.get("PRETTY_NAME"):
        return fields["PRETTY_NAME"]
    if fields.get("NAME"):
        return " ".join(filter(None, [fields["NAME"], fields.get("VERSION")]))
    return None


def parse_cmdline(text: str | None) -> dict[str, str | None]:
    """Kernel parameters before any " -- " as {name: value or None for bare flags}."""
    params: dict[str, str | None] = {}
    if not text:
        return params
    for word in text.split():
        if word == "--":
            break
        name, sep, value = word.partition("=")
        params[name] = value if sep else None
    return params


IOMMU_CMDLINE_KEYS = (
    "iommu",
    "intel_iommu",
    "amd_iommu",
    "iommu.passthrough",
    "iommu.strict",
    "swiotlb",
)


def iommu_cmdline_options(text: str | None) -> dict[str, str | None]:
    """The IOMMU-related kernel parameters present on the command line."""
    params = parse_cmdline(text)
    return {key: params[key] for key in IOMMU_CMDLINE_KEYS if key in params}


def iommu_mode_from_cmdline(text: str | None) -> str | None:
    """"passthrough", "off" or "translated" as asked for on the kernel command line."""
    params = parse_cmdline(text)
    iommu = params.get("iommu") or ""
    intel = (params.get("intel_iommu") or "").split(",")
    amd = (params.get("amd_iommu") or "").split(",")
    if "pt" in iommu.split(",") or params.get("iommu.passthrough") in ("1", "on", "y"):
        return "passthrough"
    if iommu == "off" or "off" in intel or "off" in amd:
        return "off"
    if "on" in intel or "force" in iommu.split(",") or "on" in amd:
        return "translated"
    return None


_GROUP_TYPE_MODES = {
    "DMA": "translated",
    "DMA-FQ": "translated",
    "identity": "passthrough",
    "blocked": "blocked",
    "unmanaged": "unmanaged",
}


def iommu_mode_from_group_types(types: Iterable[str | None]) -> str | None:
    """The IOMMU mode from /sys/kernel/iommu_groups/*/type values; "mixed" if they differ."""
    modes = {_GROUP_TYPE_MODES.get(t.strip(), t.strip()) for t in types if t and t.strip()}
    if not modes:
        return None
    if len(modes) == 1:
        return modes.pop()
    return "mixed"
