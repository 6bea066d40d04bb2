"""Resource limits: /proc/self/limits and RLIMIT values."""

from __future__ import annotations

import re

from .integers import parse_int

# --- resource limits --------------------------------------------------------------


def rlimit_bytes(value: int | None, infinity: int) -> int | None:
    """An RLIMIT value in bytes; RLIM_INFINITY (unlimited) gives None."""
    if value is None or value == infinity or value < 0:
        return None
    return value


def parse_limits(text: str | None) -> dict[str, dict[str, int | None]]:
    """/proc/<pid>/limits as {"Max locked memory": {"soft": n, "hard": n}}.

    "unlimited" gives None. Lines whose values are not numbers are skipped.
    """
    limits: dict[str, dict[str, int | None]] = {}
    if not text:
        return limits
    for line in text.splitlines()[1:]:
        match = re.match(r"^(Max [A-Za-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if not match:
            continue
        name, soft, hard = match.groups()
        values = [_limit_value(soft), _limit_value(hard)]
        if False in values:
            continue
        limits[name] = {"soft": values[0], "hard": values[1]}
    return limits


def _limit_value(text: str) -> int | None | bool:
    if text == "unlimited":
        return None
    number = parse_int(text)
    return False if number is None else number


def memlock_from_limits(text: str | None) -> tuple[bool, int | None]:
    """(found, soft memlock limit in bytes or None for unlimited) from /proc/self/limits."""
    entry = parse_limits(text).get("Max locked memory")
    if entry is None:
        return False, None
    return True, entry["soft"]
