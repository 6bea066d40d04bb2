"""Activation offload: ``offload_activations``, the tensors autograd saves in forward
kept in ferry pinned memory until backward needs them.

    offload = ferry.torch.offload_activations()          # made once, used every step
    for batch in loader:
        with offload:
            loss = model(batch).loss
            loss.backward()
        opt.step(); opt.zero_grad()

How (``torch.autograd.graph.saved_tensors_hooks``):

- pack (forward): a saved CUDA tensor's bytes go to an exact-size allocation of one
  ferry pinned pool per device (recycled across steps: host memory does not grow, no
  power-of-two rounding), copied on a side stream that first waits for the work
  queued so far on the tensor's stream; ``record_stream`` keeps the tensor's GPU block
  from being reused before that copy is done, and the tensor itself is not kept, so
  its GPU memory is freed as soon as the copy completes and nothing else holds it.
- unpack (backward): the tensor comes back on a second side stream into memory of that
  stream, and the compute stream waits for it with an event. Backward asks for saved
  tensors roughly in reverse order, so each unpack also prefetches the tensors packed
  before it, up to ``prefetch_bytes`` ahead, so most unpacks find theirs in flight or
  done. The bytes, dtype, shape, strides and conj/neg bits come back exactly: gradients
  are bit-equal to a step without offload.
- host memory returns to the pool when autograd drops the saved tensor (after its
  node ran in backward, or with the graph), never while a copy may still touch it.

What stays where it is: tensors on the CPU; leaves (parameters, buffers, inputs) and
views of leaves (their memory is held elsewhere: offloading them frees nothing);
tensors under ``min_bytes``; tensors whose elements are not one dense block (a
strided slice: copying it would change its layout); and, under a budget, everything
past it. The same bytes saved twice (one tensor, or two views of one block: a linear
layer saves its input as a 3-D and a 2-D view) are copied once.

Every save of one GPU storage goes the way its first save went: a storage that one
save keeps on the GPU frees nothing if its other saves are copied.

Budget: ``max_bytes=N`` offloads, in the order forward saves them (the earliest
layers first: backward needs them last, so their return hides best), until N bytes
this step. ``max_overhead=f`` (e.g. 0.1): the first three steps under this object
offload nothing: the first warms the allocator and the kernels up (``WARM_STEPS``),
the second is timed whole (``StepClock``), the third times each pack, the memory
allocated and so the peak on the GPU, stretched onto the second's spans; later steps
offload the blocks whose copies the link can carry by the peak, each starting soon
after its tensor is saved, plus what ``f`` of the step allows forward to wait
(``plan_copies``; rates of ferry pinned copies measured once per device), the
plan's overhead then corrected from each offloaded step's own time
(``OverheadControl``: three events a step, read once done). Just
before the peak the CPU waits for the copies out, so the caching allocator can
reuse their memory for the peak's allocations. ``target_peak=N`` (GPU bytes): the
same timing, then the plan that brings the memory allocated at the peak down to N at
the least overhead (``plan_for_peak``; ``stats.calibration`` says the overhead it
costs and whether N is reached). A step of another shape is decided
pack by pack from the timed step's rates (``Adaptive``). Spreading the copies over
forward, rather than sending the first N bytes, is what keeps forward from waiting
for the link (offload_plan.py). Default: every eligible tensor.

Host memory: when a step that offloaded ends (``__exit__``), the CPU waits for the
two copy streams (not for backward's compute) and every pinned buffer whose saved
tensor is gone goes back to the pool; ``close()`` also trims the pool.

Errors: an exception inside the ``with`` leaves no copy running and no pinned memory
held once the saved tensors are gone (their graph freed). Threads: pack runs on the
forward thread, unpack on autograd's thread of the tensor's device; ``_lock`` guards
the step's bookkeeping and no CUDA call is made under it.
"""

from __future__ import annotations

import collections
import threading
import weakref

from .. import _args
from ..errors import InvalidArgumentError
from . import _torch_private
from ._torch import torch_module as _torch
from .offload_plan import OUT_BYTES, Adaptive, Calibration, OverheadControl, StepClock, replan
from .pinned import default_pinned_pool, empty_pinned

MIN_BYTES = 1 << 20  # smaller tensors stay: per-tensor costs (~30 us) beat their DMA time
PREFETCH_BYTES = 256 << 20  # how far backward's prefetch runs ahead of the unpacks (GPU memory)
WARM_STEPS = 1  # max_overhead/target_peak: steps that offload nothing before the timed two
PLANNING_STEPS = WARM_STEPS + 2  # ... and with them (StepClock's, Calibration's): none offloads
TIMED_KEPT = 4  # max_overhead: offloaded steps' clocks kept until their events are done
ALIGN = 512  # the caching allocator's block alignment: a fetched tensor keeps ptr % ALIGN


class OffloadStats:
    """What one object did, summed over its steps; ``last_step_*`` for the last one."""

    __slots__ = ("steps", "offloaded_bytes", "offloaded_tensors", "kept_tensors", "kept_bytes", "deduplicated",
                 "fetched_on_demand", "prefetched", "last_step_offloaded_bytes", "budget_bytes", "calibration")

    def __init__(self):
        self.steps = self.offloaded_bytes = self.offloaded_tensors = self.kept_tensors = self.kept_bytes = 0
        self.deduplicated = self.fetched_on_demand = self.prefetched = self.last_step_offloaded_bytes = 0
        self.budget_bytes = None  # None: no budget
        self.calibration = None  # max_overhead: {forward_s, backward_s, eligible_bytes, d2h/h2d GB/s}

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class _Lane:
    """Per device: the two side streams, the pinned pool, and the copies out not yet
    known to be done (forward's memory bound: OUT_BYTES)."""

    def __init__(self, torch, device):
        self.device = device
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)
        self.pool = None  # the process's pinned pool for the device, on first use
        self.out: collections.deque = collections.deque()  # (event, bytes), oldest first; forward's thread only
        self.out_bytes = 0


class _Step:
    """One step's copies, in pack order (for backward's prefetch). Guarded by
    ActivationOffload._lock."""

    __slots__ = ("order", "seen", "cursor", "inflight", "bytes", "packs", "blocks", "adaptive", "eligible", "first")

    def __init__(self):
        self.packs = 0  # pack calls so far (the position max_overhead's plan names)
        # storage address -> (weakref to the storage, offloaded?): every save of one storage
        # goes the same way (one kept view holds the whole block on the GPU)
        self.blocks: dict = {}
        self.adaptive = None  # max_overhead, a shape not planned for: offload_plan.Adaptive
        self.eligible = 0  # eligible bytes saved so far
        self.first = 0  # the first eligible pack's bytes (the tokens' scale, for Adaptive)
        self.order: list = []  # weakrefs to _Copy, in pack order
        self.seen: dict = {}  # (address, byte offset, bytes, version) -> weakrefs to (storage, _Copy)
        self.cursor = None  # the next index backward's prefetch looks at
        self.inflight = 0  # prefetched bytes not yet unpacked
        self.bytes = 0  # offloaded this step


class _Copy:
    """The bytes of one dense block of GPU memory, in pinned memory. Every view of
    that block saved this step shares it (a linear layer's input is saved as a 3-D
    and a 2-D view of the same bytes): one copy out, one back."""

    __slots__ = ("device", "nbytes", "offset", "host", "written", "fetched", "gpu", "users", "index", "step",
                 "owner", "__weakref__")

    def __del__(self):
        owner = self.owner
        if owner is not None and self.host is not None:  # a copy may still touch it: free it once done
            owner._retire(self.host, self.fetched or self.written)


class _Saved:
    """What pack returns and unpack gets: a view (dtype, shape, strides, conj/neg) of a _Copy."""

    __slots__ = ("copy", "dtype", "size", "stride", "conj", "neg")


class ActivationOffload:
    """A reusable context manager: ``with offload:`` around each training step's
    forward and backward. See the module's docstring; ``stats`` says what it did."""

    def __init__(self, *, max_bytes: int | None = None, max_overhead: float | None = None,
                 min_bytes: int = MIN_BYTES, prefetch_bytes: int = PREFETCH_BYTES, target_peak: int | None = None):
        if sum(x is not None for x in (max_bytes, max_overhead, target_peak)) > 1:
            raise InvalidArgumentError("offload_activations: give one of max_bytes, max_overhead and target_peak, "
                                       "not both")
        self.max_bytes = None if max_bytes is None else _args.size(max_bytes, "max_bytes")
        self.target_peak = None if target_peak is None else _args.size(target_peak, "target_peak")
        if max_overhead is not None:
            if isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float)) or \
                    not 0 <= max_overhead <= 10:
                raise InvalidArgumentError(
                    f"offload_activations: max_overhead must be a fraction of the step from 0 to 10, "
                    f"not {max_overhead!r}")
        self.max_overhead = max_overhead
        self.min_bytes = _args.size(min_bytes, "min_bytes")
        self.prefetch_bytes = _args.size(prefetch_bytes, "prefetch_bytes")
        self.stats = OffloadStats()
        self._torch = None
        self._lanes: dict[int, _Lane] = {}
        self._lock = threading.Lock()
        self._retiring: collections.deque = collections.deque()  # (event or None, host tensor)
        self._hooks = None
        self._budget = self.max_bytes
        self._plan = None  # max_overhead: offload_plan.Plan, once timed
        self._shape: list = []  # the timed step's bytes per pack: a step that differs is planned anew
        self._overhead_bytes = 0  # what max_overhead's time buys at the link's rate (Adaptive's slack)
        self._timing: Calibration | None = None  # the step being timed (offload_plan.py)
        self._warm_steps = 0  # budgeted steps run before the timed ones (WARM_STEPS)
        self._warming = False  # this step offloads nothing (a warm-up, or StepClock's)
        self._clock: StepClock | None = None  # the step timed whole, with no per-pack work
        self._spans = None  # its (forward_s, backward_s)
        self._inputs = None  # max_overhead: the plan's inputs (offload_plan.replan)
        self._control: OverheadControl | None = None  # max_overhead: the plan's overhead, kept to the one asked
        # (plan, StepClock) of offloaded steps not yet read; a clock of a plan since replaced is dropped
        self._timed: collections.deque = collections.deque()
        self._new_step()

    # ---- the context ---------------------------------------------------

    def __enter__(self):
        if self._hooks is not None:
            raise InvalidArgumentError("offload_activations: this object is already in use (one step at a time)")
        torch = self._torch = self._torch or _torch()
        self._finish_timing()
        self._new_step()
        self.stats.steps += 1
        timed = self.max_overhead is not None or self.target_peak is not None
        self._warming = False
        if timed and self.stats.calibration is None and torch.cuda.is_available():
            # Three steps offload nothing. A first step is no step to time: the
            # caching allocator maps its memory, cuBLAS picks its kernels (timed, its
            # forward was 1.8-4.5x later ones', H100). The second is timed whole
            # (StepClock), the third pack by pack (Calibration), its times stretched
            # onto the second's: its own per-pack work slows a forward launched
            # barely ahead of the GPU.
            if self._warm_steps < WARM_STEPS:
                self._warm_steps += 1
                self._warming = True
            elif self._spans is None:
                self._clock = StepClock(torch)
                self._warming = True
            else:
                self._timing = Calibration(torch)
        elif self._control is not None:
            self._follow_overhead()
            self._clock = StepClock(torch)  # this step's overhead, read at a later step's start
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        hooks, self._hooks = self._hooks, None
        hooks.__exit__(exc_type, exc, tb)
        clock, self._clock = self._clock, None
        if clock is not None and exc_type is None:
            clock.end()
            if self._warming:
                self._spans = clock.spans()  # None (no backward on a GPU): timed again next step
            elif self._step.adaptive is None and self._step.bytes:  # a step that followed the plan
                self._timed.append((self._plan, clock))
                while len(self._timed) > TIMED_KEPT:
                    self._timed.popleft()
        if exc_type is not None or self._step.bytes:
            # An abandoned step: no copy of it may run on. A finished one: its pinned
            # buffers go back to the pool now, not at the next step's first pack (so
            # host memory in use between steps is what the caller's graph still holds).
            # This waits for the copy streams only (the last fetch lands before
            # backward's last layers compute), not for backward.
            self._sync_lanes()
        self._reap()
        return False

    def close(self) -> None:
        """Gives every pinned buffer this object holds back to its pool (once the
        saved tensors that use them are gone: a graph kept alive keeps its own) and
        the pool's unused pinned memory back to the system. The object may be used
        again afterwards (a max_overhead plan is kept)."""
        if self._hooks is not None:
            raise InvalidArgumentError("offload_activations: close() inside the step's `with`")
        self._sync_lanes()
        self._reap()
        for lane in list(self._lanes.values()):
            if lane.pool is not None:
                lane.pool.trim()

    def _sync_lanes(self) -> None:
        for lane in list(self._lanes.values()):
            lane.d2h.synchronize()
            lane.h2d.synchronize()
            lane.out.clear()
            lane.out_bytes = 0

    def _new_step(self):
        self._step = _Step()  # a step still in backward keeps its own (each _Saved holds it)
        self.stats.last_step_offloaded_bytes = 0

    # ---- pack (forward) --------------------------------------------------

    def _eligible(self, t) -> bool:
        """Whether offloading t frees GPU memory and keeps it exact (budget aside)."""
        if not t.is_cuda or t.layout != self._torch.strided or t.is_leaf:
            return False
        base = _torch_private.view_base(t)  # a view of a parameter or input: its memory is held anyway
        if base is not None and base.is_leaf:
            return False
        return t.numel() * t.element_size() >= self.min_bytes and _dense(t)

    def _pack(self, t):
        if self._clock is not None and t.is_cuda:
            self._clock.pack(t.device)
        if self._warming:
            return t
        step = self._step
        position, step.packs = step.packs, step.packs + 1
        out = self._pack_one(t, step, position)
        if self._plan is not None and step.adaptive is None and position == self._plan.drain:
            self._drain()
        return out

    def _pack_one(self, t, step: _Step, position: int):
        nbytes = t.numel() * t.element_size()
        eligible = self._eligible(t)
        if self._timing is not None:  # the calibration step offloads nothing
            plain = t.is_cuda and t.layout == self._torch.strided
            self._timing.pack(t.device, t if plain else None, nbytes if eligible else 0)
            eligible = False
        elif eligible:
            eligible = self._chosen(step, position, t, nbytes)
        if not eligible:
            if self._timing is None and t.is_cuda and t.layout == self._torch.strided and not t.is_leaf:
                # later saves of its storage stay too
                storage = t.untyped_storage()
                entry = step.blocks.get(storage.data_ptr())
                if entry is None or entry[0]() is not storage:
                    step.blocks[storage.data_ptr()] = (weakref.ref(storage), False)
            self.stats.kept_tensors += 1
            self.stats.kept_bytes += nbytes if t.is_cuda else 0
            return t
        start = t.storage_offset() * t.element_size()  # strides are never negative in PyTorch
        storage = t.untyped_storage()
        key = (storage.data_ptr(), start, nbytes, _torch_private.version_counter(t))
        with self._lock:
            refs = step.seen.get(key)
            # The same storage object, not only the same address: freed memory is
            # reused at once by the caching allocator, for another tensor.
            copy = refs[1]() if refs is not None and refs[0]() is storage else None
            if copy is not None:
                copy.users += 1
        if copy is not None:
            self.stats.deduplicated += 1
        else:
            copy = self._copy_out(t, nbytes)
            copy.step = step
            with self._lock:
                copy.index = len(step.order)
                step.order.append(weakref.ref(copy))
                step.seen[key] = (weakref.ref(storage), weakref.ref(copy))
                step.bytes += nbytes
            self.stats.offloaded_tensors += 1
            self.stats.offloaded_bytes += nbytes
            self.stats.last_step_offloaded_bytes += nbytes
            self._reap()
        saved = _Saved()
        saved.copy, saved.dtype, saved.size, saved.stride = copy, t.dtype, tuple(t.shape), tuple(t.stride())
        saved.conj, saved.neg = t.is_conj(), t.is_neg()
        return saved

    def _chosen(self, step: _Step, position: int, t, nbytes: int) -> bool:
        """Whether an eligible tensor goes out under the budget. Every save of one
        storage goes the way its first went: offloading some views of a block while
        another save keeps the tensor frees nothing (and cost the link its bytes)."""
        storage = t.untyped_storage()
        address = storage.data_ptr()
        entry = step.blocks.get(address)
        if entry is not None and entry[0]() is storage:
            return entry[1]
        step.eligible += nbytes
        step.first = step.first or nbytes
        if self._plan is not None:
            plan = self._plan
            if step.adaptive is None and (position >= len(self._shape) or self._shape[position] != nbytes):
                # A shape the timed step did not have: decided pack by pack from its rates.
                step.adaptive = Adaptive(plan, step.first, self._overhead_bytes)
                step.adaptive.made = step.eligible - nbytes
            ok = step.adaptive.decide(nbytes) if step.adaptive is not None else position in plan.positions
        elif self._budget is not None:
            ok = step.bytes + nbytes <= self._budget
        else:
            ok = True
        step.blocks[address] = (weakref.ref(storage), ok)
        return ok

    def _drain(self) -> None:
        """max_overhead, just before forward's peak: wait for the copies out, so that
        the GPU memory of every planned tensor is reusable by the peak's allocations
        (the caching allocator reuses a block only once the CPU sees its copy done)."""
        for lane in list(self._lanes.values()):
            lane.d2h.synchronize()
            lane.out.clear()
            lane.out_bytes = 0

    def _copy_out(self, t, nbytes: int) -> _Copy:
        torch = self._torch
        lane = self._lane(t.device)
        c = _Copy()
        c.device, c.nbytes, c.users = t.device, nbytes, 1
        src = _raw_bytes(torch, t)
        c.offset = src.data_ptr() % ALIGN
        c.fetched = c.gpu = c.step = c.owner = None
        c.host = empty_pinned((nbytes,), torch.uint8, lane.pool)
        # The stream that made t, asked BEFORE the side stream becomes current: inside
        # `with torch.cuda.stream(lane.d2h)` current_stream() is d2h itself, and the
        # copy then waited for nothing (it read a tensor still being written, now and
        # then: one gradient in ten runs differed on the H200).
        compute = torch.cuda.current_stream(t.device)
        with torch.cuda.stream(lane.d2h):
            lane.d2h.wait_stream(compute)
            c.host.copy_(src, non_blocking=True)
            c.written = torch.cuda.Event()
            c.written.record(lane.d2h)
        t.record_stream(lane.d2h)  # the block is not reused before the copy read it
        c.owner = self
        self._bound_copies_out(lane, c.written, nbytes)
        return c

    def _bound_copies_out(self, lane: _Lane, event, nbytes: int) -> None:
        """Forward runs ahead of the link: a tensor's GPU memory is reusable only once
        its copy is done, and the caching allocator decides on the CPU's timeline. So
        the CPU waits for the oldest copies once more than OUT_BYTES are on their way:
        GPU memory held by copies stays bounded (the compute queued meanwhile runs on)."""
        lane.out.append((event, nbytes))
        lane.out_bytes += nbytes
        while lane.out and (lane.out_bytes > OUT_BYTES or lane.out[0][0].query()):
            oldest, n = lane.out.popleft()
            oldest.synchronize()
            lane.out_bytes -= n

    # ---- unpack (backward) -----------------------------------------------

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            if isinstance(saved, self._torch.Tensor) and saved.is_cuda:
                if self._timing is not None:
                    self._timing.unpack(saved.device)
                elif self._clock is not None:
                    self._clock.unpack(saved.device)
            return saved
        torch = self._torch
        copy = saved.copy
        if self._timing is not None:
            self._timing.unpack(copy.device)
        elif self._clock is not None:
            self._clock.unpack(copy.device)
        self._reap()
        with self._lock:
            buf = copy.gpu
            copy.users -= 1
            last = copy.users <= 0
            if buf is not None and last:
                copy.gpu = None  # its last user: the GPU memory goes with the returned view
                copy.step.inflight -= copy.nbytes
        if buf is None:  # not prefetched (or unpacked again: retain_graph)
            self.stats.fetched_on_demand += 1
            buf = self._fetch(copy)
            if not last:
                with self._lock:
                    copy.gpu = buf  # other views of it come next
                    copy.step.inflight += copy.nbytes
        self._prefetch_before(copy.step, copy.index)
        stream = torch.cuda.current_stream(copy.device)
        stream.wait_event(copy.fetched)
        buf.record_stream(stream)  # used here: not reused before this stream is done with it
        out = buf[copy.offset:copy.offset + copy.nbytes].view(saved.dtype).as_strided(saved.size, saved.stride)
        if saved.conj:
            out = out.conj()
        if saved.neg:
            out = _torch_private.neg_view(out)
        return out

    def _fetch(self, copy: _Copy):
        """Starts copy's bytes back to its GPU; returns the GPU buffer (copy.fetched: its event)."""
        torch = self._torch
        lane = self._lane(copy.device)
        with torch.cuda.stream(lane.h2d):  # memory of the h2d stream: no wait for compute
            lane.h2d.wait_event(copy.written)
            buf = torch.empty(copy.offset + copy.nbytes, dtype=torch.uint8, device=copy.device)
            buf[copy.offset:].copy_(copy.host, non_blocking=True)
            fetched = torch.cuda.Event()
            fetched.record(lane.h2d)
        copy.fetched = fetched
        return buf

    def _prefetch_before(self, step: _Step, index: int) -> None:
        """Fetch the copies packed before `index`, newest first, up to prefetch_bytes ahead."""
        while True:
            with self._lock:
                if step.cursor is None or step.cursor >= index:
                    step.cursor = index - 1
                if step.cursor < 0 or step.inflight >= self.prefetch_bytes:
                    return
                ref = step.order[step.cursor]
                step.cursor -= 1
                copy = ref()
                if copy is None or copy.gpu is not None or copy.users <= 0:
                    continue
                step.inflight += copy.nbytes
            buf = self._fetch(copy)
            with self._lock:
                copy.gpu = buf
            self.stats.prefetched += 1

    # ---- memory and streams ------------------------------------------------

    def _lane(self, device) -> _Lane:
        index = device.index if device.index is not None else self._torch.cuda.current_device()
        lane = self._lanes.get(index)
        if lane is None:
            lane = _Lane(self._torch, index)
            lane.pool = default_pinned_pool(index)
            with self._lock:
                lane = self._lanes.setdefault(index, lane)
        return lane

    def _retire(self, host, event) -> None:
        self._retiring.append((event, host))

    def _reap(self) -> None:
        """Free the host buffers whose last copy is done (oldest first). Forward's and
        autograd's threads may both reap: an entry is popped only if it is still the
        one looked at (its event queried outside the lock: no CUDA call under it)."""
        while True:
            with self._lock:
                if not self._retiring:
                    return
                entry = self._retiring[0]
            if entry[0] is not None and not entry[0].query():
                return
            with self._lock:
                if self._retiring and self._retiring[0] is entry:
                    self._retiring.popleft()

    def _finish_timing(self) -> None:
        """max_overhead: the step timed last time becomes the plan of every later one."""
        timing, self._timing = self._timing, None
        done = timing.finish(self.max_overhead, self.target_peak, self._spans) if timing is not None else None
        if done is not None:
            self._plan, self.stats.calibration = done
            self._shape = timing.sizes
            c = self.stats.calibration
            self._overhead_bytes = int(c["overhead_s"] * c["d2h_gbps"] * 1e9)
            self.stats.budget_bytes = self._plan.bytes
            if self.max_overhead is not None and c["overhead_s"] > 0:
                self._inputs = timing.inputs
                self._control = OverheadControl(c["overhead_s"], c["forward_s"] + c["backward_s"])
                c.update(planned_overhead_s=c["overhead_s"], measured_overhead_s=None)

    def _follow_overhead(self) -> None:
        """max_overhead: each offloaded step whose timing is in (its events done: never
        waited for) moves the overhead the plan is made with (OverheadControl)."""
        c = self.stats.calibration
        while self._timed and self._timed[0][1].done():
            plan, clock = self._timed.popleft()
            spans = clock.spans()
            if spans is None or plan is not self._plan:  # no backward, or a step of an older plan
                continue
            overhead_s = self._control.update(spans[0] + spans[1])
            c["measured_overhead_s"] = self._control.measured_s
            if overhead_s is not None:
                self._plan = replan(self._inputs, overhead_s)
                self._overhead_bytes = int(overhead_s * c["d2h_gbps"] * 1e9)
                self.stats.budget_bytes = self._plan.bytes
                c.update(planned_overhead_s=overhead_s, planned_tensors=len(self._plan.positions),
                         planned_bytes=self._plan.bytes)


def _dense(t) -> bool:
    """Whether t's elements fill one block of memory exactly, in some stride order
    (PyTorch's is_non_overlapping_and_dense, which Python does not expose)."""
    if t.numel() == 0:
        return False
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _raw_bytes(torch, t):
    """The bytes of a dense tensor (any stride order) as a flat uint8 tensor."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))
    if flat.is_conj():  # pragma: no cover - set_ makes a plain tensor
        flat = flat.resolve_conj()
    return flat.view(torch.uint8)


def offload_activations(*, max_bytes: int | None = None, max_overhead: float | None = None,
                        min_bytes: int = MIN_BYTES, prefetch_bytes: int = PREFETCH_BYTES,
                        target_peak: int | None = None) -> ActivationOffload:
    """A context manager that keeps the tensors autograd saves in ferry pinned memory
    (see the module's docstring). Make it once and enter it every step:
    ``max_overhead`` learns from its second and third steps, and its stats add up.

    max_bytes: offload at most this many bytes a step (earliest saved first);
    max_overhead: offload what keeps the step within this fraction over no offload
    (planned from a timed step, then corrected from each offloaded step's own time;
    a step costs 1.5-3% even at a plan of zero overhead: docs/offload.md);
    target_peak: offload what brings the GPU memory allocated at forward's peak down to
    this many bytes, at the least overhead (stats.calibration: "overhead" it costs,
    estimated, and "reached");
    min_bytes: tensors smaller than this stay on the GPU (default 1 MiB);
    prefetch_bytes: how far backward's prefetch runs ahead (default 256 MiB of GPU memory)."""
    return ActivationOffload(max_bytes=max_bytes, max_overhead=max_overhead, min_bytes=min_bytes,
                             prefetch_bytes=prefetch_bytes, target_peak=target_peak)
