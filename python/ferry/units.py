"""Units: sizes, rates, times and ratios as ferry parses and prints them, and the
one rule for a GPU link's limit.

Sizes are binary (KiB = 2^10 bytes, MiB, GiB, TiB); rates are GB/s = 10^9 bytes
per second in one direction; times are seconds or microseconds (us). A ratio says
how many times better ours is than a baseline ("6.0x"). `link_limit` is the only
place that decides which PCIe figure a bandwidth is compared with: the doctor's
report, its findings (ferry.rules) and the bench suites all ask it.

The bottom layer of the package: standard library only, no I/O, nothing else of
ferry (every other module may import it).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
HUGE_PAGE = 2 * MiB  # the x86-64 PMD page: THP and the default hugetlb size

_SIZE_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


# ---- parsing ---------------------------------------------------------------------


def parse_size(text: str) -> int:
    """'64M' -> 67108864; '4096' -> 4096; units K, M, G, T (binary), optional 'iB'/'B'.

    Raises InvalidArgumentError, quoting the text, on anything else or a size <= 0."""
    from .errors import InvalidArgumentError  # errors.py imports nothing of ferry either

    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in _SIZE_UNITS else (t, "")
    try:
        value = int(num) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise InvalidArgumentError(f"'{text}' is not a size (expected e.g. 4096, 64M, 1G)") from None
    if value <= 0:
        raise InvalidArgumentError(f"'{text}': size must be positive")
    return value


def parse_size_list(text: str) -> list[int]:
    """'4K,64M, 1G' -> [4096, 67108864, 1073741824]; empty items are ignored."""
    return [parse_size(x) for x in text.split(",") if x.strip()]


# ---- numbers -----------------------------------------------------------------------


def number(value: object) -> float | None:
    """A finite number, or None: bools, strings, None, NaN and infinities are not figures."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def ratio(ours: float | None, theirs: float | None, lower_is_better: bool = False) -> float | None:
    """How many times better ours is than theirs (rates: ours/theirs; times:
    theirs/ours), or None when either is missing or zero."""
    if not ours or not theirs:
        return None
    return theirs / ours if lower_is_better else ours / theirs


# ---- formatting --------------------------------------------------------------------


def fmt_bytes(value: object) -> str:
    """A byte count in binary units, trimmed: 2097152 -> '2 MiB', 1.5 GiB -> '1.5 GiB',
    512 -> '512 B'; anything that is not a number -> 'unknown'."""
    amount = number(value)
    if amount is None:
        return "unknown"
    for unit in _BINARY_UNITS:
        if abs(amount) < 1024 or unit == _BINARY_UNITS[-1]:
            break
        amount /= 1024
    if unit == "B":
        return f"{int(amount)} B"
    return f"{amount:.1f}".removesuffix(".0") + f" {unit}"


def fmt_gbps(x: float) -> str:
    return f"{x:.1f} GB/s"


def fmt_seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def fmt_us(x: float) -> str:
    return f"{x:.1f} us" if x < 100 else f"{x:.0f} us"


def fmt_ratio(x: float) -> str:
    return f"{x:.1f}x"


def percent(part: float, whole: float) -> str:
    """'65%' of part in whole."""
    return f"{100.0 * part / whole:.0f}%"


def join(*parts: str) -> str:
    """The non-empty parts, comma-separated."""
    return ", ".join(p for p in parts if p)


def link_share(x: float, link: float | None) -> str:
    """'65% of the 63.0 GB/s link', or '' when the link is unknown."""
    return f"{percent(x, link)} of the {fmt_gbps(link)} link" if link else ""


def versus(ours: float | None, theirs: float | None, fmt: Callable[[float], str], ours_name: str = "ferry",
           theirs_name: str = "CUDA", lower_is_better: bool = False) -> str:
    """'ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x)': ours beside the baseline, with the
    ratio in ours' favour (see ratio()). A missing side is 'not measured'."""
    if ours is None and theirs is None:
        return "not measured"
    a = f"{ours_name} {fmt(ours) if ours is not None else 'not measured'}"
    b = f"{theirs_name} {fmt(theirs) if theirs is not None else 'not measured'}"
    r = ratio(ours, theirs, lower_is_better)
    return f"{a} vs {b}" + (f" ({fmt_ratio(r)})" if r is not None else "")


# ---- the link ----------------------------------------------------------------------


def link_limit(link_gbps: float | None, max_link_gbps: float | None,
               measured: Iterable[float] = ()) -> tuple[float | None, str]:
    """(GB/s, name) of a GPU link's per-direction limit that a bandwidth is compared with.

    The current link (link_gbps, "current link"), unless a measured copy beat it: an
    idle GPU trains its link down and back up under load, so then the maximum link
    (max_link_gbps, "maximum link") is the limit; the maximum also stands in when the
    current link is unknown. (None, "") when neither is known. Non-positive or
    non-numeric figures count as unknown."""
    current, top = number(link_gbps), number(max_link_gbps)
    current = current if current and current > 0 else None
    top = top if top and top > 0 else None
    fastest = max((v for v in (number(x) for x in measured) if v is not None), default=None)
    if current and top and fastest is not None and fastest > current:
        return top, "maximum link"
    if current:
        return current, "current link"
    if top:
        return top, "maximum link"
    return None, ""
