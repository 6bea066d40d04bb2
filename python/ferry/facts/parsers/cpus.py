"""CPU formats: /proc/cpuinfo, cpulists (bounded by MAX_CPU_ID), and the allowed
CPUs and memory nodes of /proc/self/status."""

from __future__ import annotations

import re
from typing import Iterable

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

# Largest CPU (or node) id a cpulist may name: the kernel's NR_CPUS is at most
# 8192 today; the bound keeps "0-20000000" from expanding 20 million ids.
MAX_CPU_ID = (1 << 16) - 1
# Most ids all ranges of one cpulist may expand to, counting repeats.
_MAX_CPULIST_IDS = 1 << 17

# "N", "N-M" or the kernel's stride form "N-M:used/group" (every group of
# `group` ids starting at N, the first `used` of them).
_CPULIST_ITEM = re.compile(r"^([0-9]{1,10})(?:-([0-9]{1,10})(?::([0-9]{1,10})/([0-9]{1,10}))?)?$")


def cpulist_ids(text: str) -> set[int]:
    """A Linux cpulist ("0-3,8,10-11", "0-31:2/4") as a set of ids, strictly.

    Blank text is the empty set (a node with no CPUs writes "\\n"). Raises
    ValueError quoting the text for anything else, for an id above MAX_CPU_ID and
    for ranges that add up to more than 2**17 ids; TypeError for a non-string."""
    if not isinstance(text, str):
        raise TypeError(f"cpulist must be a string, got {type(text).__name__} {text!r}")
    stripped = text.strip()
    if not stripped:
        return set()
    ids: set[int] = set()
    budget = _MAX_CPULIST_IDS
    for item in stripped.split(","):
        match = _CPULIST_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"bad cpulist {text!r} (at {item!r})")
        first, last, used, group = match.groups()
        lo = int(first)
        hi = int(last) if last is not None else lo
        used_n, group_n = (int(used), int(group)) if group is not None else (1, 1)
        if hi < lo or used_n < 1 or group_n < used_n:
            raise ValueError(f"bad cpulist {text!r} (at {item!r})")
        if hi > MAX_CPU_ID:
            raise ValueError(f"bad cpulist {text!r} (at {item!r}: ids are at most {MAX_CPU_ID})")
        budget -= hi - lo + 1
        if budget < 0:
            raise ValueError(f"bad cpulist {text!r}: its ranges name more than {_MAX_CPULIST_IDS} ids")
        for base in range(lo, hi + 1, group_n):
            ids.update(range(base, min(base + used_n, hi + 1)))
    return ids


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
