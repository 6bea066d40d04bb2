"""Checked arguments of ferry's Python entry points: what a size, a count and a
flag and a timeout are, in one place.

A wrong type or an out-of-range value raises InvalidArgumentError naming the
argument and quoting its value (``nbytes=-1: expected a byte count, an integer
>= 0``), never nanobind's "incompatible function arguments". A bool is not a
number here (``alloc(True)`` is a mistake, not one byte), nor is a float
(1.5 bytes, or 2.0) or a string; objects with ``__index__`` (numpy integers)
are integers. The native module applies the same rules to the arguments it
converts itself (src/python/args.h); the library checks what values mean.
"""

from __future__ import annotations

import math
import numbers
import operator

from .errors import InvalidArgumentError

MAX_U64 = (1 << 64) - 1
MAX_U32 = (1 << 32) - 1


def quote(value) -> str:
    """repr(value), cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_quote = quote


def items(value, name: str, expected: str) -> list:
    """The items of any iterable (list, tuple, generator) as a list; a str, bytes or
    a non-iterable (None, an int) is refused."""
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"{name}={quote(value)}: expected {expected}")
    try:
        return list(value)
    except TypeError:
        raise InvalidArgumentError(f"{name}={quote(value)}: expected {expected}") from None


def integer(value, name: str, lo: int | None = None, hi: int | None = None, expected: str | None = None) -> int:
    """value as an int in [lo, hi] (either bound may be None)."""
    if expected is None:
        bounds = f" {lo} .. {hi}" if lo is not None and hi is not None else (f" >= {lo}" if lo is not None else "")
        expected = "an integer" + bounds
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        hint = " (a bool is not a number)" if isinstance(value, bool) else ""
        raise InvalidArgumentError(f"{name}={_quote(value)}: expected {expected}{hint}")
    v = operator.index(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InvalidArgumentError(f"{name}={_quote(value)}: out of range (expected {expected})")
    return v


def size(value, name: str = "nbytes") -> int:
    """A byte count: an integer 0 .. 2**64 - 1."""
    return integer(value, name, 0, MAX_U64, "a byte count, an integer >= 0")


def optional_size(value, name: str = "nbytes") -> int | None:
    """None (the size is taken from the object) or a byte count."""
    return None if value is None else size(value, name)


def sizes(values, name: str = "sizes") -> list[int]:
    """A sequence of byte counts; the message names the bad item's index."""
    try:
        items = list(values)
    except TypeError:
        raise InvalidArgumentError(f"{name}={_quote(values)}: expected a sequence of byte counts") from None
    return [size(v, f"{name}[{i}]") for i, v in enumerate(items)]


def shape(value, name: str = "shape") -> tuple[int, ...]:
    """A tensor shape: an int or a sequence of ints >= 0."""
    if hasattr(type(value), "__index__") and not isinstance(value, bool):
        value = (value,)
    try:
        dims = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"{name}={_quote(value)}: expected an int or a sequence of ints >= 0") from None
    return tuple(integer(d, f"{name}[{i}]", 0, MAX_U64, "a dimension, an integer >= 0") for i, d in enumerate(dims))


def u32(value, name: str, lo: int = 0, hi: int = MAX_U32) -> int:
    """A count or duration stored in 32 bits."""
    return integer(value, name, lo, hi)


def flag(value, name: str) -> bool:
    """True or False, nothing else ("yes", 1 and None are mistakes)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name}={_quote(value)}: expected True or False")
    return value


def timeout(value, name: str = "timeout", unit: str = "seconds") -> float | None:
    """A timeout in seconds, the one rule for every ``timeout=`` of ferry's Python API:
    an int or float >= 0 (numpy numbers too); ``None`` or ``math.inf``: no limit
    (returned as None); negative, NaN, a bool or anything else is refused. A caller
    that hands a long or unlimited wait to native code waits in bounded slices (a
    clock plus 1e300 s overflows). `unit` names what the number counts, in messages."""
    if value is None:
        return None
    expected = f"{unit} >= 0, or None (no limit)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (a bool is not a timeout)" if isinstance(value, bool) else ""
        raise InvalidArgumentError(f"{name}={_quote(value)}: expected {expected}{hint}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past a float's range: a limit nobody reaches, or a negative
        seconds = math.inf if value > 0 else -math.inf
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{name}={_quote(value)}: out of range (expected {expected}; "
                                   "None or math.inf waits without a limit)")
    return None if math.isinf(seconds) else seconds


# ---- renamed arguments (docs/api.md: one word per idea) --------------------------------

class _Unset:
    """The default of a deprecated argument: told apart from None, which may be a value."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET = _Unset()


def renamed(where: str, old: str, new: str, note: str = "", stacklevel: int = 3) -> None:
    """Warns (DeprecationWarning, pointing at the caller's caller: `stacklevel`) that
    `where`'s argument `old` is spelled `new` now; it keeps working for one release."""
    import warnings

    warnings.warn(f"{where}: {old}= is deprecated: use {new}=" + (f" ({note})" if note else ""),
                  DeprecationWarning, stacklevel=stacklevel)
