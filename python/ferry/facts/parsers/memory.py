"""Memory formats: transparent huge page settings, /proc/meminfo and node meminfo,
hugetlb directory names."""

from __future__ import annotations

import re

from ... import _ferry
from .integers import MAX_DIGITS

# --- transparent huge pages ----------------------------------------------------------


def thp_setting(text: str) -> str | None:
    """The selected value of a THP setting, strictly: "always [madvise] never" ->
    "madvise"; a file holding one bare word is that word; blank text is None
    (unknown). Raises ValueError quoting the text for anything else: several
    selections, several words with none selected, a stray bracket. The rule is
    the library's (src/os/sysfs.h: parse_thp_setting, bound as
    ferry._ferry.parse_thp_setting): one parser for the pools and the doctor."""
    words = text.split()  # white space as Python reads it; the words' grammar is the library's
    if not words:
        return None
    value = _ferry.parse_thp_setting(" ".join(words).encode("utf-8", "surrogatepass"))
    if not value:
        raise ValueError(f"THP setting {text!r}: expected one selected value such as 'always [madvise] never' "
                         f"or one bare word, without stray brackets")
    return value.decode("utf-8", "surrogatepass")


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
