"""Memory formats: transparent huge page settings, /proc/meminfo and node meminfo,
hugetlb directory names."""

from __future__ import annotations

import re

from .integers import MAX_DIGITS

# --- transparent huge pages ----------------------------------------------------------


def thp_setting(text: str) -> str | None:
    """The selected value of a THP setting, strictly: "always [madvise] never" ->
    "madvise"; a file holding one bare word is that word; blank text is None
    (unknown). Raises ValueError quoting the text for anything else: several
    selections, several words with none selected, a stray bracket. The same rule
    as the library's parse_thp_setting (src/os/sysfs.cpp)."""
    words = text.split()
    if not words:
        return None
    selected = []
    for word in words:
        inner = word[1:-1]
        if len(word) >= 2 and word[0] == "[" and word[-1] == "]" and inner and "[" not in inner and "]" not in inner:
            selected.append(inner)
        elif "[" in word or "]" in word:
            raise ValueError(f"THP setting {text!r}: stray bracket in {word!r}")
    if len(selected) == 1:
        return selected[0]
    if not selected and len(words) == 1:
        return words[0]
    raise ValueError(f"THP setting {text!r}: expected one selected value such as 'always [madvise] never'")


def parse_thp_setting(text: str | None) -> str | None:
    """thp_setting(), leniently: None for empty, missing or garbled text."""
    if not text:
        return None
    try:
        return thp_setting(text)
    except ValueError:
        return None


# --- /proc/meminfo, node meminfo ------------------------------------------------------

_MEMINFO_LINE = re.compile(r"^(?:Node\s+\d+\s+)?([A-Za-z0-9_()]+):\s+([0-9]{1,%d})(?:\s+(kB))?\s*$" % MAX_DIGITS)


def parse_meminfo(text: str | None) -> dict[str, int]:
    """/proc/meminfo or /sys/devices/system/node/nodeN/meminfo as {field: value}.

    Values given in kB are converted to bytes; unitless values (HugePages_Total) stay
    counts. The "Node N " prefix of per-node files is dropped.
    """
    fields: dict[str, int] = {}
    if not text:
        return fields
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if not match:
            continue
        name, value, unit = match.groups()
        fields[name] = int(value) * 1024 if unit == "kB" else int(value)
    return fields


# --- huge page directory names --------------------------------------------------------

_HUGEPAGES_DIR = re.compile(r"^hugepages-([0-9]{1,%d})kB$" % MAX_DIGITS)


def hugepages_dir_size(name: str | None) -> int | None:
    """The page size in bytes named by a directory: "hugepages-2048kB" -> 2097152."""
    if not name:
        return None
    match = _HUGEPAGES_DIR.match(name.strip())
    return int(match.group(1)) * 1024 if match else None
