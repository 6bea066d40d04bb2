"""What each mode of `ferry doctor` measures, and its time budget.

Modes: default (<= 60 s on a 16-core GPU machine), `--quick` (<= 15 s, smaller
sizes), `--full` (more sizes and threads, no time promise). A measurement that
would start after BUDGET_SHARE of the mode's budget is skipped instead.
"""

from __future__ import annotations

import dataclasses

from ..units import GiB, MiB


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one mode measures, and its time budget (None: no promise)."""

    budget_seconds: float | None
    copy_bytes: int  # pinned and pageable bandwidth
    reps: int  # timed repeats of each copy
    alloc_bytes: int
    register_bytes: int
    memcpy_bytes: int
    touch_bytes: int
    latency_iterations: int
    most_threads: int | None = 16  # host memcpy thread counts stop here
    by_size: tuple[int, ...] = ()  # extra bandwidth sizes (--full)


_DEFAULT = Plan(budget_seconds=60, copy_bytes=GiB, reps=5, alloc_bytes=GiB, register_bytes=GiB,
                memcpy_bytes=256 * MiB, touch_bytes=GiB, latency_iterations=1000)
PLANS = {
    "quick": dataclasses.replace(_DEFAULT, budget_seconds=15, copy_bytes=256 * MiB, reps=3,
                                 alloc_bytes=256 * MiB, register_bytes=512 * MiB, memcpy_bytes=64 * MiB,
                                 touch_bytes=256 * MiB, latency_iterations=300),
    "default": _DEFAULT,
    "full": dataclasses.replace(_DEFAULT, budget_seconds=None, latency_iterations=5000, most_threads=None,
                                by_size=(4 * MiB, 64 * MiB, 256 * MiB, GiB, 4 * GiB)),
}
BUDGET_SHARE = 0.85  # no measurement starts after this share of the budget
