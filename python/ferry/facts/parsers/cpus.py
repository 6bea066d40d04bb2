"""CPU formats: /proc/cpuinfo, cpulists (bounded by MAX_CPU_ID), and the allowed
CPUs and memory nodes of /proc/self/status."""

from __future__ import annotations

import re
from typing import Iterable

from ... import _ferry

# --- /proc/cpuinfo --------------------------------------------------------------------


def _cpuinfo_fields(text: str) -> Iterable[tuple[str, str]]:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip().lower(), value.strip()


def parse_cpuinfo_model(text: str | None) -> str | None:
    """The CPU model name from /proc/cpuinfo ("model name" on x86; fallbacks elsewhere)."""
    if not text:
        return None
    found: dict[str, str] = {}
    for key, value in _cpuinfo_fields(text):
        if value and key not in found:
            found[key] = value
    for key in ("model name", "cpu model", "processor model", "cpu"):
        if key in found:
            return re.sub(r"\s+", " ", found[key])
    return None


def parse_cpuinfo_flags(text: str | None) -> list[str] | None:
    """The first processor's feature flags ("flags" on x86, "features" on Arm)."""
    if not text:
        return None
    for key, value in _cpuinfo_fields(text):
        if key in ("flags", "features"):
            return value.split()
    return None


# --- cpulists ----------------------------------------------------------------------

# The grammar is the library's (src/os/sysfs.h: parse_cpulist, bound as
# ferry._ferry.parse_cpulist): one parser for ferry's threads and the doctor.
# Largest CPU (or node) id a cpulist may name: the kernel's NR_CPUS is at most
# 8192 today; the bound keeps "0-20000000" from expanding 20 million ids.
MAX_CPU_ID = _ferry.MAX_CPU_ID
# Most ids all ranges of one cpulist may expand to, counting repeats (sysfs.cpp's kMaxIds).
_MAX_CPULIST_IDS = 1 << 17


def cpulist_ids(text: str) -> set[int]:
    """A Linux cpulist ("0-3,8,10-11", "0-31:2/4": in each group of 4 ids
    from 0, the first 2) as a set of ids, strictly.

    Blank text is the empty set (a node with no CPUs writes "\\n"). Raises
    ValueError quoting the text for anything else, for an id above MAX_CPU_ID and
    for ranges that add up to more than 2**17 ids; TypeError for a non-string."""
    if not isinstance(text, str):
        raise TypeError(f"cpulist must be a string, got {type(text).__name__} {text!r}")
    # White space around the text and its items as Python reads it (str.strip), the rest by the library.
    items = ",".join(item.strip() for item in text.split(",")) if text.strip() else ""
    ids = _ferry.parse_cpulist(items.encode("utf-8", "surrogatepass"))
    if ids is None:
        raise ValueError(f"bad cpulist {text!r}: expected items N, N-M or N-M:used/group joined by commas, "
                         f"ids at most {MAX_CPU_ID}, ranges naming at most {_MAX_CPULIST_IDS} ids in all")
    return set(ids)


def parse_cpulist(text: str | None) -> list[int] | None:
    """cpulist_ids() as a sorted list, leniently: None for a missing or bad cpulist."""
    if not isinstance(text, str):
        return None
    try:
        return sorted(cpulist_ids(text))
    except ValueError:
        return None


def format_cpulist(cpus: Iterable[int]) -> str:
    """The compact cpulist of a set of CPU numbers: [0, 1, 2, 3, 8] -> "0-3,8"."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = previous = None
    for cpu in ordered:
        if previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            ranges.append(_cpu_range(start, previous))
        start = previous = cpu
    if start is not None:
        ranges.append(_cpu_range(start, previous))
    return ",".join(ranges)


def _cpu_range(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def compact_cpulist(text: str | None) -> str | None:
    """A cpulist re-written in compact form; None when it cannot be parsed."""
    cpus = parse_cpulist(text)
    return None if cpus is None else format_cpulist(cpus)


# --- /proc/self/status -------------------------------------------------------------


def parse_proc_status(text: str | None) -> dict[str, str]:
    """/proc/<pid>/status as {field: value string}."""
    fields: dict[str, str] = {}
    if not text:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def status_cpus_allowed(text: str | None) -> str | None:
    """Cpus_allowed_list of /proc/self/status, compacted."""
    return compact_cpulist(parse_proc_status(text).get("Cpus_allowed_list"))


def status_mems_allowed(text: str | None) -> str | None:
    """Mems_allowed_list of /proc/self/status, compacted."""
    return compact_cpulist(parse_proc_status(text).get("Mems_allowed_list"))
