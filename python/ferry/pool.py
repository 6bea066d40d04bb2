"""Host memory pools: ``Pool`` (pageable, huge-page aware) and ``PinnedPool``.

Allocations are exact (rounded only to the alignment asked), recycled on free and
returned to the OS on ``trim()``. Python pools zero recycled memory by default so
that one user of a pool never sees another's data. ``pool.alloc(n)`` returns a
``Buffer``: usable through the buffer protocol (``memoryview``, ``numpy``) and
DLPack, freed by ``release()`` or when garbage collected.
"""

from __future__ import annotations

from . import _ferry

Buffer = _ferry.Buffer

_OPTION_NAMES = (
    "chunk_bytes",
    "memfd",
    "huge_pages",
    "limit_bytes",
    "zero_recycled",
    "touch_threads",
    "release_delay_ms",
    "release_batch_bytes",
    "numa_node",
    "target_bytes",
    "target_huge",
)


class Pool:
    """A host memory pool.

    Options (None = the FERRY_* default): chunk_bytes (multiple of 2 MiB, default
    64 MiB), huge_pages ("auto", "hugetlb", "thp", "off"), limit_bytes (hard
    limit, 0 = none), zero_recycled (default True here), touch_threads,
    release_delay_ms (background release; 0 = only trim), release_batch_bytes,
    numa_node, target_bytes (reserve this much in the background now), target_huge
    (kind of those chunks, default True), memfd.
    """

    _pinned = False

    def __init__(self, *, zero_recycled: bool = True, device: int = 0, **options):
        unknown = set(options) - set(_OPTION_NAMES)
        if unknown:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"unknown pool option(s) {sorted(unknown)}; known: {', '.join(_OPTION_NAMES)}"
            )
        options["zero_recycled"] = zero_recycled
        self._native = _ferry.Pool(options, self._pinned, device)

    def alloc(self, nbytes: int, alignment: int = 256, huge: bool | None = None) -> Buffer:
        """Allocate nbytes (>= 1). huge=None: huge pages for 2 MiB and more."""
        return self._native.alloc(nbytes, alignment, huge)

    def trim(self, keep_bytes: int = 0) -> int:
        """Return cached memory to the OS until at most keep_bytes stay; bytes released."""
        return self._native.trim(keep_bytes)

    def wait_ready(self) -> None:
        """Block until target_bytes given at creation are reserved (and pinned)."""
        self._native.wait_ready()

    def stats(self) -> dict:
        """Accounting per kind (small/huge): reserved, committed, in_use, cached,
        released as {current, peak, total}; counts; touch/register seconds; notes."""
        return self._native.stats()

    @property
    def pinned(self) -> bool:
        return self._native.pinned


class PinnedPool(Pool):
    """A pool whose chunks are pinned (cudaHostRegister) once, on ``device``.

    Raises NoDeviceError without a CUDA driver or device.
    """

    _pinned = True

    def __init__(self, device: int = 0, **options):
        super().__init__(device=device, **options)

    @property
    def device(self) -> int:
        return self._native.device
