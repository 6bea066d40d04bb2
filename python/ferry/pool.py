"""Host memory pools: ``Pool`` (pageable, huge-page aware) and ``PinnedPool``.

Allocations are exact (rounded only to the alignment asked), recycled on free and
returned to the OS on ``trim()``. ``pool.alloc(n)`` returns a ``Buffer``: usable
through the buffer protocol (``memoryview``, ``numpy``) and DLPack, freed by
``release()`` or when garbage collected.

Zeroing: memory fresh from the OS reads as zero; RECYCLED memory is handed out
as it is, like ``torch.empty``, ``numpy.empty`` and PyTorch's pinned cache (it
may hold bytes that an earlier allocation of the same pool wrote). Ask for zeros
per allocation with ``alloc(n, zero=True)``, or for every allocation with
``Pool(zero_recycled=True)``: then only the recycled bytes are cleared, on the
allocating thread (a memset: about 20 us per MiB on one core; 64 MiB and more
with several threads). ``stats()`` says which policy a pool has
(``zero_recycled``) and what clearing cost so far (``zeroed_bytes``,
``zero_seconds``).

The target: ``Pool(target_bytes=N)`` reserves (and, for ``PinnedPool``, pins)
one chunk of N bytes (rounded up to 2 MiB) in the background, as ONE mapping
with ONE registration; it serves one allocation of up to N bytes, or many
smaller ones, with nothing new reserved or pinned. The registration starts while
the chunk is still being touched (``register_lead_bytes``).
"""

from __future__ import annotations

from . import _device, _ferry

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
    "register_lead_bytes",
)


class Pool:
    """A host memory pool.

    Options (None = the FERRY_* default): chunk_bytes (multiple of 2 MiB, default
    64 MiB), huge_pages ("auto", "hugetlb", "thp", "off"), limit_bytes (hard
    limit, 0 = none), zero_recycled (clear recycled memory on every allocation;
    default FERRY_ZERO_RECYCLED, off), touch_threads, release_delay_ms
    (background release; 0 = only trim), release_batch_bytes, numa_node,
    target_bytes (one chunk of this size reserved, touched and pinned in the
    background now; it serves any allocation up to its size), target_huge (its
    kind, default True; allocations below 2 MiB take the target's kind),
    register_lead_bytes (a new chunk's registration starts once this much of it
    is touched, default 64 MiB; >= the chunk's size: after the whole touch),
    memfd.
    """

    _pinned = False

    def __init__(self, *, zero_recycled: bool | None = None, device: int | None = None, **options):
        unknown = set(options) - set(_OPTION_NAMES)
        if unknown:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"unknown pool option(s) {sorted(unknown)}; known: {', '.join(_OPTION_NAMES)}"
            )
        options["zero_recycled"] = zero_recycled
        self._native = _ferry.Pool(options, self._pinned, _device.index(device))
        # The native method itself, not the wrapper below: one Python call
        # frame less per allocation (~0.2 us of a ~0.5 us alloc+free).
        self.alloc = self._native.alloc

    def alloc(self, nbytes: int, alignment: int = 256, huge: bool | None = None, zero: bool = False) -> Buffer:
        """Allocate nbytes (>= 1). huge=None: huge pages for 2 MiB and more (and
        below 2 MiB in a pool with a huge target). Recycled memory is
        uninitialized unless zero=True (or the pool's zero_recycled)."""
        return self._native.alloc(nbytes, alignment, huge, zero)

    def trim(self, keep_bytes: int = 0) -> int:
        """Return cached memory to the OS until at most keep_bytes stay; bytes released."""
        return self._native.trim(keep_bytes)

    def wait_ready(self) -> None:
        """Block until the target_bytes given at creation are reserved (and pinned)."""
        self._native.wait_ready()

    def stats(self) -> dict:
        """Accounting per kind (small/huge): reserved, committed, in_use, cached,
        released as {current, peak, total}; counts; touch/register seconds (the
        two overlap), target_seconds (creation until the target was in);
        zero_recycled (the pool's policy), zeroed_bytes and zero_seconds (what
        clearing recycled memory cost); notes."""
        return self._native.stats()

    def chunks(self) -> list:
        """[(base, nbytes, generation)] of the pool's live chunks, by address: the
        ranges a transfer library registers (``ferry.nixl``). Every allocation lies
        inside one chunk. ``generation`` is the ``chunk_generation`` at which the
        chunk came in, or at which ``trim()`` last returned part of it to the OS
        (new pages back that part: register the chunk again)."""
        return self._native.chunks()

    def shared_location(self, buf) -> tuple[int, int] | None:
        """Where ``buf`` (a Buffer of this pool, or an address in one) lies in a
        memfd-backed chunk (``Pool(memfd=True)``): ``(fd, offset)``, the chunk's
        descriptor (owned by the pool, open while the chunk lives) and the
        offset of the memory in it. Another process maps the same memory with
        ``mmap(fd, ...)`` (passing the fd, or opening ``/proc/<pid>/fd/<fd>``).
        None where the memory is not in a memfd chunk of this pool."""
        address = buf.ptr if isinstance(buf, Buffer) else buf
        return self._native.shared_location(address)

    @property
    def chunk_generation(self) -> int:
        """A number that grows whenever ``chunks()`` would change (a chunk added,
        released, or partly returned to the OS). Cheap (no lock): poll it."""
        return self._native.chunk_generation

    @property
    def pinned(self) -> bool:
        return self._native.pinned


class PinnedPool(Pool):
    """A pool whose chunks are pinned (cudaHostRegister) once, on ``device``:
    one registration per chunk, so any allocation lies inside one registration.

    Raises NoDeviceError without a CUDA driver or device.
    """

    _pinned = True

    def __init__(self, device: int | None = None, **options):
        super().__init__(device=device, **options)

    @property
    def device(self) -> int:
        return self._native.device
