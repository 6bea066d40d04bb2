"""max_overhead's budget for ``offload_activations``: one step timed on the GPU, then a
plan of which saved tensors go out in every later step (``plan_copies``, pure).

``Calibration`` records, at every pack of the timed step, its time into forward (a
CUDA event on the first device seen), the GPU storage it lives in (its block), the
bytes a copy would move and the memory allocated; the first and latest unpack give
backward's span, and the largest allocation seen gives the peak's time. ``finish``
turns them, with ferry's pinned copy rates measured once per device, into a Plan.

Why blocks (issue 42): autograd saves one storage many times (a norm's output by
three projections, a linear's input as a 3-D and a 2-D view, rotary's strided slice
beside q itself). Offloading some of those saves while another keeps the tensor frees
nothing and costs the link its bytes: the plan of positions alone freed 0-6% of the
activations where the link allowed 16-28%. A block goes whole or not at all, and one
with a save ferry cannot offload stays.

Why a schedule and not "the first N bytes": sending the earliest tensors first made
forward wait for the link (1.23x a step without offload on the H200); copies spread
over forward, each soon after its tensor, leave it alone (1.00x). What can have left
by the peak is bounded by the link (``copy_bound``); the schedule fills it.

A step whose packs differ from the timed one (another sequence length, MoE routing)
is decided pack by pack by ``Adaptive`` from the timed step's rates: no new timing.
"""

from __future__ import annotations

from .pinned import default_pinned_pool, empty_pinned

OUT_BYTES = 512 << 20  # copies out on their way before forward waits for the oldest (offload.py)
# The share of forward (backward) compute a stream of copies overlaps; the rest of
# the step's copies must fit in the overhead allowed.
OVERLAP = 0.7


class Pack(tuple):
    """One pack of the timed step: (at: seconds into forward or None for another
    device, nbytes: bytes a copy of it would move, 0 where an earlier pack of this
    step already moves the same bytes, block: the GPU storage it lives in (an int; one
    storage saved through several views or by several ops is one block), eligible:
    whether ferry could offload it at all (a block with any pack not eligible stays:
    that pack holds the storage on the GPU, so copying the others frees nothing))."""

    __slots__ = ()

    def __new__(cls, at, nbytes, block=None, eligible=True):
        return tuple.__new__(cls, (at, nbytes, block, eligible))


class Plan:
    """plan_copies' answer: the pack positions to offload, the bytes they move, the
    bound the same facts allow (bound_bytes), the pack position before the peak
    where forward waits for the copies out (drain: their GPU memory is reusable
    before the peak's allocations), and the facts an unplanned shape is judged by
    (rate: link bytes per eligible byte forward makes; before_peak: eligible bytes
    made before the peak)."""

    __slots__ = ("positions", "bytes", "bound_bytes", "drain", "rate", "before_peak", "first_bytes")

    def __init__(self, positions, nbytes, bound_bytes, drain, rate, before_peak, first_bytes):
        self.positions, self.bytes, self.bound_bytes, self.drain = positions, nbytes, bound_bytes, drain
        self.rate, self.before_peak, self.first_bytes = rate, before_peak, first_bytes


def stretch(times, forward_s: float, backward_s: float, spans) -> list:
    """Times into a step timed as (forward_s, backward_s), put onto the same step's
    true spans (forward, backward): forward's times scaled by forward's ratio,
    backward's (past forward_s) by backward's. None stays None."""
    fs = spans[0] / forward_s
    bs = spans[1] / backward_s if backward_s > 0 else 1.0
    return [None if t is None else t * fs if t <= forward_s else spans[0] + (t - forward_s) * bs for t in times]


class OverheadControl:
    """max_overhead kept to what was asked, step after step: a feedback on the plan's
    overhead. Why: a plan made from the timed step overshot its budget by 3-4% of the
    step on the H100 (the pack hooks' own CPU time, forward waiting at the drain longer
    than modelled) and by up to 2% on the H200 (8B-like stack at 0.03: forward 22 ms
    longer where 12 were allowed). Each offloaded step is timed whole (StepClock:
    three events, read once done, never waited for); its overhead over the timed
    step without offload is taken as the median of the last WINDOW steps of the
    current plan (at least SAMPLES: a step slowed by something else, a collection,
    another process on the GPU, moves a median little where it swings a mean), and
    when it differs from the one asked by more than DEADBAND x asked, the overhead
    the plan is made with moves by GAIN x the difference (an integral controller: a
    constant overshoot is taken out whatever its cause), held within
    [0, MAX_SCALE x asked]. Only steps of the current plan are fed in (the caller
    drops a clock of an older one: fed a step of the plan before, the controller
    swung and the peak over a run was its smallest plan's). Pure: update() only."""

    GAIN = 0.5
    SAMPLES = 3  # steps of a plan before it is judged
    WINDOW = 5  # the latest steps its median is taken over
    MAX_SCALE = 2.0  # a step that costs less than asked may plan with up to twice it
    DEADBAND = 0.1

    def __init__(self, asked_s: float, base_s: float):
        self.asked_s = asked_s  # the overhead asked: max_overhead x the timed step (seconds)
        self.base_s = base_s  # the timed step without offload: forward + backward (seconds)
        self.planned_s = asked_s  # the overhead the current plan was made with
        self.measured_s = None  # the current plan's overhead: the median of its latest steps
        self._samples: list = []  # the current plan's steps' overheads, latest last (at most WINDOW)

    def update(self, step_s: float) -> float | None:
        """An offloaded step took step_s (forward + backward, the current plan
        followed): the overhead to plan with from now on, or None to keep the plan."""
        self._samples = (self._samples + [step_s - self.base_s])[-self.WINDOW:]
        if len(self._samples) < self.SAMPLES:
            return None
        ordered = sorted(self._samples)
        m = self.measured_s = ordered[len(ordered) // 2]
        error = m - self.asked_s
        if abs(error) <= self.DEADBAND * self.asked_s:
            return None
        target = min(max(0.0, self.planned_s - self.GAIN * error), self.MAX_SCALE * self.asked_s)
        if target == self.planned_s:
            return None
        self.planned_s = target
        self._samples = []  # measured under the old plan: judge the new one on its own steps
        return target


class StepClock:
    """A step's forward and backward on the GPU, timed with three events and no other
    work per pack: the first pack, the first unpack, the step's end (the context's
    exit). Why: Calibration's per-pack work (an event, the memory allocated, the
    block's lookup) slows the CPU, and where forward was launched barely ahead of the
    GPU (eager transformers) the GPU waited for it: its timed forward came out
    1.6-2.6x a plain step's (H100, the bench's Llama), and the plan sent what the
    link carries in that longer forward. Calibration's times are stretched onto this
    step's spans (Calibration.facts)."""

    def __init__(self, torch):
        self._torch = torch
        self.device = None
        self.events: list = []  # first pack, first unpack, end

    def _record(self, device) -> None:
        e = self._torch.cuda.Event(enable_timing=True)
        e.record(self._torch.cuda.current_stream(device))
        self.events.append(e)

    def pack(self, device) -> None:
        if self.device is None:
            self.device = device
            self._record(device)

    def unpack(self, device) -> None:
        if len(self.events) == 1 and device == self.device:
            self._record(device)

    def end(self) -> None:
        if len(self.events) == 2:
            self._record(self.device)

    def done(self) -> bool:
        """Whether spans() would not wait: the step ended and the GPU passed its end."""
        return len(self.events) != 3 or self.events[2].query()

    def spans(self):
        """(forward_s, backward_s), or None where the step had no backward on a GPU."""
        if len(self.events) != 3:
            return None
        self.events[2].synchronize()
        a, b, c = self.events
        return a.elapsed_time(b) / 1e3, b.elapsed_time(c) / 1e3


class Calibration:
    """The timed step's events (see the module's text). Forward's thread calls pack,
    autograd's thread of that device unpack; nothing else touches it until finish."""

    def __init__(self, torch):
        self._torch = torch
        self.device = None
        self.packs: list = []  # [event or None, nbytes, block, eligible, allocated] per pack, in order
        self.backward: list = []  # the first and the latest unpack's events
        self.sizes: list = []  # each pack's bytes (0: not a CUDA tensor of this device): the shape planned for
        self.peak = (-1, None, None)  # (allocated bytes, event, pack position before it) at the step's peak
        self._blocks: dict = {}  # storage address -> (weakref to the storage, block id)
        self._seen: set = set()  # (address, offset, bytes) already counted: a copy moves them once
        self.timed_spans = (0.0, 0.0)  # forward_s, backward_s as this step measured them (facts)
        self.inputs = None  # plan_copies' inputs, once finished (replan)

    def _event(self, device):
        e = self._torch.cuda.Event(enable_timing=True)
        e.record(self._torch.cuda.current_stream(device))
        return e

    def _allocated(self, device) -> int:
        return self._torch.cuda.memory_allocated(device)

    def pack(self, device, t=None, eligible_bytes: int = 0) -> None:
        """A pack of t: its time, the bytes it could offload (0: not eligible), its block."""
        if self.device is None and t is not None:
            self.device = device
        if device != self.device or t is None:
            self.sizes.append(0)
            self.packs.append([None, 0, None, False, 0])  # kept, so positions stay aligned
            return
        import weakref

        storage = t.untyped_storage()
        address = storage.data_ptr()
        entry = self._blocks.get(address)
        if entry is None or entry[0]() is not storage:  # an address freed and reused: a new block
            entry = self._blocks[address] = (weakref.ref(storage), len(self._blocks))
        nbytes = t.numel() * t.element_size()
        self.sizes.append(nbytes)
        key = (address, t.storage_offset() * t.element_size(), nbytes)
        counted = 0
        if eligible_bytes and key not in self._seen:
            self._seen.add(key)
            counted = nbytes
        allocated = self._allocated(device)
        self.packs.append([self._event(device), counted, entry[1], bool(eligible_bytes), allocated])
        self._note_peak(device, allocated, len(self.packs) - 2)

    def _note_peak(self, device, allocated: int, before: int) -> None:
        if allocated > self.peak[0]:
            self.peak = (allocated, self._event(device), before)

    def unpack(self, device) -> None:
        if device != self.device:
            return
        e = self._event(device)
        if len(self.backward) < 2:
            self.backward.append(e)
        else:
            self.backward[1] = e
        self._note_peak(device, self._allocated(device), len(self.packs) - 1)

    def facts(self, spans=None):
        """(packs as Pack, forward_s, backward_s, peak_s, peak position), or None when
        the step saved nothing on a GPU or had no backward. spans: (forward_s,
        backward_s) of a step timed without per-pack work (StepClock): the pack
        times are stretched onto them (see StepClock)."""
        packs, b = self.packs, self.backward
        if not b or not any(p[0] is not None for p in packs):
            return None
        b[-1].synchronize()
        if self.peak[1] is not None:  # recorded after the latest unpack's event, in the same call
            self.peak[1].synchronize()
        f0 = next(p[0] for p in packs if p[0] is not None)
        forward_s = f0.elapsed_time(b[0]) / 1e3
        backward_s = b[0].elapsed_time(b[-1]) / 1e3
        peak_s = max(0.0, f0.elapsed_time(self.peak[1]) / 1e3) if self.peak[1] is not None else forward_s
        times = [f0.elapsed_time(e) / 1e3 if e is not None else None for e, *_ in packs]
        self.timed_spans = (forward_s, backward_s)
        if spans is not None and forward_s > 0:
            *times, peak_s = stretch(times + [peak_s], forward_s, backward_s, spans)
            forward_s, backward_s = spans
        out = [Pack(at, n, block, ok) for at, (_, n, block, ok, _) in zip(times, packs)]
        return out, forward_s, backward_s, peak_s, self.peak[2]

    def finish(self, max_overhead: float | None = None, target_peak: int | None = None, spans=None):
        """(Plan, figures), or None when the step saved nothing on a GPU or had no
        backward. One budget: max_overhead (a fraction of forward + backward) or
        target_peak (GPU bytes allocated at the peak: the plan that frees the rest
        at the least overhead; figures say what it costs and whether it is reached).
        spans: StepClock's (forward_s, backward_s), the step's true length."""
        facts = self.facts(spans)
        if facts is None:
            return None
        packs, forward_s, backward_s, peak_s, peak_position = facts
        d2h, h2d = pinned_rates(self._torch, self.device)
        figures = {"forward_s": forward_s, "backward_s": backward_s, "peak_s": peak_s, "peak_bytes": self.peak[0],
                   "timed_forward_s": self.timed_spans[0], "timed_backward_s": self.timed_spans[1],
                   "eligible_bytes": sum(p[1] for p in packs if p[3]), "d2h_gbps": d2h / 1e9,
                   "h2d_gbps": h2d / 1e9}
        if target_peak is not None:
            need = max(0, self.peak[0] - target_peak)
            plan, overhead_s = plan_for_peak(packs, forward_s, backward_s, need, d2h, h2d, peak_s=peak_s,
                                             peak_position=peak_position)
            figures.update(target_peak=target_peak, needed_bytes=need, reached=overhead_s is not None)
            overhead_s = overhead_s if overhead_s is not None else MAX_OVERHEAD * (forward_s + backward_s)
        else:
            overhead_s = max_overhead * (forward_s + backward_s)
            plan = plan_copies(packs, forward_s, backward_s, overhead_s, d2h, h2d, peak_s=peak_s,
                               peak_position=peak_position)
        # What a later plan at another overhead needs (replan: OverheadControl's changes)
        self.inputs = (packs, forward_s, backward_s, d2h, h2d, peak_s, peak_position)
        figures.update(overhead_s=overhead_s, overhead=overhead_s / (forward_s + backward_s) if forward_s + backward_s
                       else 0.0, planned_tensors=len(plan.positions), planned_bytes=plan.bytes,
                       bound_bytes=plan.bound_bytes)
        return plan, figures


def replan(inputs, overhead_s: float) -> Plan:
    """plan_copies again on a Calibration's inputs (``Calibration.inputs``), at another
    overhead (seconds)."""
    packs, forward_s, backward_s, d2h, h2d, peak_s, peak_position = inputs
    return plan_copies(packs, forward_s, backward_s, overhead_s, d2h, h2d, peak_s=peak_s,
                       peak_position=peak_position)


def _blocks(packs):
    """Candidate blocks, earliest first: (first pack's time, bytes, positions). A block
    with a pack that is not eligible, or on another device, is no candidate."""
    blocks, bad = {}, set()
    for position, p in enumerate(packs):
        at, n, block, ok = p if len(p) == 4 else (p[0], p[1], position, True)
        if block is None:
            block = ("alone", position)
        if at is None or not ok:
            bad.add(block)
            continue
        entry = blocks.setdefault(block, [at, 0, []])
        entry[1] += n
        entry[2].append(position)
    return sorted((v for k, v in blocks.items() if k not in bad and v[1] > 0), key=lambda v: v[0])


def copy_bound(packs, peak_s: float, overhead_s: float, d2h: float) -> int:
    """The most bytes that can have left the GPU by the peak: what the link carries
    from the first candidate's pack to the peak plus the overhead allowed (forward
    may wait that long for it), and no more than the candidates made by then."""
    blocks = _blocks(packs)
    if not blocks:
        return 0
    made = sum(n for at, n, _ in blocks if at <= peak_s)
    return int(min(made, max(0.0, peak_s + overhead_s - blocks[0][0]) * d2h))


def plan_copies(packs, forward_s: float, backward_s: float, overhead_s: float, d2h: float, h2d: float,
                peak_s: float | None = None, peak_position: int | None = None) -> Plan:
    """max_overhead's plan, from one timed step: which pack positions to offload.

    packs: a Pack (or (at, nbytes)) per pack, in order. Blocks (one GPU storage,
    all its packs together: offloading some views of it frees nothing) are taken
    earliest first, each copy starting once its tensor exists and the link is free
    (the link is one queue, d2h bytes/s): a block goes out if its copy ends by the
    peak (peak_s, default the end of forward) plus the time the overhead allows
    forward to wait for the link, and all of them can come back in backward
    (OVERLAP of it hidden, the overhead left over paying for the rest). Copies
    start at most half OUT_BYTES' time at the link's rate after their tensor (more in
    flight would make the CPU wait: offload.py), plus the overhead allowed (forward
    may wait that long for the link in all). "By the peak" means by the drain, the
    pack before the peak (peak_position, from the timed step; else the last pack by
    peak_s): there the CPU waits for the copies out. Returns a Plan."""
    peak_s = forward_s if peak_s is None else peak_s
    # The drain: the pack before the peak, where the CPU waits for the copies out
    # (offload.py); copies must land by then, not by the peak itself.
    drain = peak_position
    if drain is None or not 0 <= drain < len(packs) or packs[drain][0] is None:
        drain = max((i for i, p in enumerate(packs) if p[0] is not None and p[0] <= peak_s), default=None)
    land_s = min(peak_s, packs[drain][0]) if drain is not None else peak_s
    lag = OUT_BYTES / 2 / d2h + overhead_s
    positions, link_free, total = set(), 0.0, 0
    blocks = _blocks(packs)
    for at, n, where in blocks:
        start = max(link_free, at)
        end = start + n / d2h
        if start - at > lag or at > land_s:
            continue
        out_extra = max(0.0, end - land_s)  # forward waits this long at the drain
        back_extra = max(0.0, (total + n) / h2d - OVERLAP * backward_s)
        if out_extra + back_extra > overhead_s:
            continue
        positions.update(where)
        link_free, total = end, total + n
    before = sum(n for at, n, _ in blocks if at <= land_s)
    rate = (land_s * d2h / before) if before else 0.0
    first = next((p[1] for p in packs if p[1] and p[0] is not None and (len(p) < 4 or p[3])), 0)
    return Plan(positions, total, copy_bound(packs, land_s, overhead_s, d2h), drain if positions else None, rate,
                before, first)


MAX_OVERHEAD = 10.0  # target_peak's search: at most this many times forward + backward


def plan_for_peak(packs, forward_s: float, backward_s: float, need_bytes: int, d2h: float, h2d: float,
                  peak_s: float | None = None, peak_position: int | None = None):
    """target_peak's plan: the one plan_copies makes at the least overhead whose bytes
    reach need_bytes (bisection over the overhead, to 0.1% of forward + backward).
    Returns (Plan, overhead_s); overhead_s None when no overhead up to MAX_OVERHEAD
    reaches it (too little is made before the peak): then the plan at MAX_OVERHEAD."""
    step_s = forward_s + backward_s

    def at(overhead_s):
        return plan_copies(packs, forward_s, backward_s, overhead_s, d2h, h2d, peak_s=peak_s,
                           peak_position=peak_position)

    low = at(0.0)
    if low.bytes >= need_bytes:
        return low, 0.0
    lo, hi = 0.0, MAX_OVERHEAD * step_s
    best = at(hi)
    if best.bytes < need_bytes:
        return best, None
    while hi - lo > 1e-3 * step_s:
        mid = (lo + hi) / 2
        plan = at(mid)
        if plan.bytes >= need_bytes:
            hi, best = mid, plan
        else:
            lo = mid
    return best, hi


class Adaptive:
    """The plan for a step whose packs are not the timed step's (another sequence
    length, MoE routing): decided block by block, as plan_copies would, from the
    timed step's rates instead of its times. Forward's time is taken as proportional
    to the bytes it saves (both scale with tokens; attention's time grows faster,
    which makes the rule cautious on longer sequences and a little generous on
    shorter ones): plan.rate is the link bytes carried per eligible byte forward
    makes. A block goes out while the modelled queue on the link stays within what
    it can carry by the drain plus half OUT_BYTES and the overhead's bytes, and until
    forward has made the timed step's eligible bytes before the drain, scaled by the
    first block's bytes over the timed step's (the tokens' ratio). Pure: decide()
    only; forward's thread alone calls it."""

    def __init__(self, plan: Plan, first_bytes: int, overhead_bytes: int = 0):
        self.rate = plan.rate
        scale = first_bytes / plan.first_bytes if plan.first_bytes else 1.0
        self.peak_bytes = plan.before_peak * scale
        self.slack = OUT_BYTES / 2 + overhead_bytes * scale  # what forward may wait for at its end
        self.made = 0.0  # eligible bytes made so far
        self.queue = 0.0  # bytes on the link not yet carried (modelled)
        self.bytes = 0

    def decide(self, nbytes: int) -> bool:
        self.queue = max(0.0, self.queue - nbytes * self.rate)
        self.made += nbytes
        if self.made > self.peak_bytes:
            return False
        left = (self.peak_bytes - self.made) * self.rate  # what the link carries before the peak
        if self.queue + nbytes > left + self.slack or self.queue > self.slack:
            return False
        self.queue += nbytes
        self.bytes += nbytes
        return True


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
