"""CUDA version integers as text."""

from __future__ import annotations



# --- CUDA ---------------------------------------------------------------------------


def cuda_version_string(version: int | None) -> str | None:
    """A CUDA version integer as text: 13000 -> "13.0", 12040 -> "12.4"."""
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"
