"""max_overhead's budget for ``offload_activations``: one step timed on the GPU, then a
plan of which saved tensors go out in every later step (``plan_copies``, pure).

``Calibration`` records an event at every pack of the timed step (its time into
forward, on the first device seen) and the first and latest unpack (backward's span);
``finish`` turns them, with ferry's pinned copy rates measured once per device, into
the plan. Why a schedule and not "the first N bytes": sending the earliest tensors
first made forward wait for the link (1.23x a step without offload on the H200);
copies spread over forward, each soon after its tensor, leave it alone (1.00x).
"""

from __future__ import annotations

from .pinned import default_pinned_pool, empty_pinned

OUT_BYTES = 512 << 20  # copies out on their way before forward waits for the oldest (offload.py)
# The share of forward (backward) compute a stream of copies overlaps; the rest of
# the step's copies must fit in the overhead allowed.
OVERLAP = 0.7


class Calibration:
    """The timed step's events (see the module's text). Forward's thread calls pack,
    autograd's thread of that device unpack; nothing else touches it until finish."""

    def __init__(self, torch):
        self._torch = torch
        self.device = None
        self.packs: list = []  # (event or None, eligible bytes) per pack, in order
        self.backward: list = []  # the first and the latest unpack's events

    def _event(self, device):
        e = self._torch.cuda.Event(enable_timing=True)
        e.record(self._torch.cuda.current_stream(device))
        return e

    def pack(self, device, eligible_bytes: int) -> None:
        """A pack: its time and the bytes it could offload (0: not eligible)."""
        if self.device is None:
            self.device = device
        if device == self.device:
            self.packs.append((self._event(device), eligible_bytes))
        else:
            self.packs.append((None, 0))  # another device's pack: kept, so positions stay aligned

    def unpack(self, device) -> None:
        if device != self.device:
            return
        e = self._event(device)
        if len(self.backward) < 2:
            self.backward.append(e)
        else:
            self.backward[1] = e

    def finish(self, max_overhead: float):
        """(plan: set of pack positions, bytes planned, the figures it came from), or
        None when the step saved nothing on a GPU or had no backward."""
        packs, b = self.packs, self.backward
        if not b or not any(e is not None for e, _ in packs):
            return None
        b[-1].synchronize()
        f0 = next(e for e, _ in packs if e is not None)
        forward_s = f0.elapsed_time(b[0]) / 1e3
        backward_s = b[0].elapsed_time(b[-1]) / 1e3
        d2h, h2d = pinned_rates(self._torch, self.device)
        overhead_s = max_overhead * (forward_s + backward_s)
        times = [(f0.elapsed_time(e) / 1e3 if e is not None else None, n) for e, n in packs]
        plan, planned = plan_copies(times, forward_s, backward_s, overhead_s, d2h, h2d)
        figures = {"forward_s": forward_s, "backward_s": backward_s, "eligible_bytes": sum(n for _, n in packs),
                   "d2h_gbps": d2h / 1e9, "h2d_gbps": h2d / 1e9, "planned_tensors": len(plan)}
        return plan, planned, figures


def plan_copies(packs, forward_s: float, backward_s: float, overhead_s: float, d2h: float, h2d: float):
    """max_overhead's plan, from one timed step: which pack positions to offload.

    packs: (seconds into forward, eligible bytes) per pack, in order (bytes 0 or time
    None: not a candidate). The link is one queue: a tensor goes out if its copy can
    start within OUT_LAG of its pack (so copies never pile up behind each other and
    forward never waits for the link: OUT_BYTES is not reached) and ends before forward
    does, plus half the overhead allowed; in total no more than backward can bring
    back while it computes, plus the other half. Earliest first: backward needs them
    last, so their return hides best. Returns (set of positions, bytes planned)."""
    out_end = forward_s + overhead_s / 2
    back_budget = h2d * (OVERLAP * backward_s + overhead_s / 2)
    lag = OUT_BYTES / 2 / d2h
    plan, link_free, total = set(), 0.0, 0
    for position, (at, n) in enumerate(packs):
        if not n or at is None:
            continue
        start = max(link_free, at)
        end = start + n / d2h
        if start - at > lag or end > out_end or total + n > back_budget:
            continue
        plan.add(position)
        link_free, total = end, total + n
    return plan, total


_rates: dict = {}


def measure_pinned_rates(torch, device, nbytes: int = 64 << 20, repeats: int = 3) -> tuple[float, float]:
    """Bytes/s of a ferry pinned buffer -> `device` (d2h) and back (h2d): torch
    non_blocking copies timed with CUDA events, the best of `repeats` after a warm-up.
    The one measurement of the link that max_overhead and `ferry bench offload` use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    host = empty_pinned((nbytes,), torch.uint8, default_pinned_pool(index))
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for dst, src in ((host, dev), (dev, host)):
        dst.copy_(src, non_blocking=True)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        rates.append(nbytes / best)
    return rates[0], rates[1]


def pinned_rates(torch, device) -> tuple[float, float]:
    """measure_pinned_rates, once per device for the process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _rates:
        _rates[index] = measure_pinned_rates(torch, device)
    return _rates[index]
