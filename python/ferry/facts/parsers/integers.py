"""Numbers from one-value files, bounded: MAX_DIGITS and parse_int."""

from __future__ import annotations



# --- small helpers -----------------------------------------------------------------

# Longest number any of these files holds (2**64 has 20 digits); longer is garbage.
MAX_DIGITS = 40


def parse_int(text: str | None, base: int = 10) -> int | None:
    """An integer from a one-value file such as "16\\n"; None for empty or garbage."""
    if text is None:
        return None
    text = text.strip()
    if len(text) > MAX_DIGITS:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None
