"""max_overhead's plan (ferry.torch.offload_plan, issue 42), on this CPU: synthetic
timelines of a Llama training step's saves (times from its matmul FLOPs, bytes from
its shapes, shared and unfreeable blocks as a HF decoder layer makes them). The plan
must reach >= 80% of the bound computed from the same facts (what the link carries
by the peak plus what the overhead lets forward wait), never spend more than the
overhead allowed, take every save of a block or none, and carry over to another
sequence length without a new timing step."""

import random

import pytest

from ferry.torch import offload_plan
from ferry.torch.offload_plan import (MAX_OVERHEAD, OUT_BYTES, OVERLAP, Adaptive, Pack, copy_bound, plan_copies,
                                      plan_for_peak)

GB = 1e9
D2H = H2D = 50 * GB  # about an H100's pinned rates


def llama_timeline(layers=12, tokens=16384, hidden=2048, inter=5632, vocab=32000, tflops=400e12, poison=True,
                   jitter=0.0, seed=0):
    """(packs, forward_s, backward_s, peak_s) of one step: per decoder layer the saves
    a HF Llama layer makes (bf16; a norm output saved by 3 projections is one block
    of 3 packs), spread over the layer's time; attention's time grows with tokens
    squared (its bytes do not). poison: rotary's strided slice of q (not eligible)
    beside q itself, so q's block frees nothing and must stay. The loss at the end
    (the peak)."""
    rng = random.Random(seed)
    packs, t, block = [], 0.0, 0
    b = 2 * tokens
    layer_s = (2 * tokens * (4 * hidden * hidden + 3 * hidden * inter) + tokens * tokens * hidden // 2) / tflops

    def new(nbytes, shared=1):
        nonlocal block
        block += 1
        return [Pack(t, nbytes, block, True)] + [Pack(t, 0, block, True) for _ in range(shared - 1)]

    packs += new(b * hidden)  # the embedding's output
    for _ in range(layers):
        for nbytes, shared in ((b * hidden, 1), (b * hidden, 3), (b * hidden, 1), (b * hidden // 4, 1),
                               (b * hidden // 4, 1), (b * hidden, 2), (b * hidden, 1), (b * hidden, 2),
                               (b * inter, 1), (b * inter, 1), (b * inter, 1), (b * inter, 1)):
            packs += new(nbytes, shared)
            t += layer_s / 12 * (1 + jitter * (rng.random() - 0.5))
        if poison:
            block += 1
            packs += [Pack(t, b * hidden, block, True), Pack(t, b * hidden // 2, block, False)]
    t += 2 * tokens * hidden * vocab / tflops
    packs += new(b * hidden, 2) + new(b * vocab) + new(2 * b * vocab)
    return packs, t, 2 * t, t


def blocks_of(packs):
    out = {}
    for position, p in enumerate(packs):
        out.setdefault(p[2], []).append(position)
    return out


def schedule(packs, positions, d2h=D2H):
    """The link as one queue over the planned copies, recomputed here: (bytes, end)."""
    free, total = 0.0, 0
    for p in sorted(positions):
        at, n = packs[p][0], packs[p][1]
        if n:
            free = max(free, at) + n / d2h
            total += n
    return total, free


def spent(packs, positions, forward_s, backward_s, peak_s):
    """The step time the planned copies cost over the overlap the plan assumes."""
    total, end = schedule(packs, positions)
    return max(0.0, end - peak_s) + max(0.0, total / H2D - OVERLAP * backward_s)


@pytest.mark.parametrize("tokens", [8192, 16384, 32768])
@pytest.mark.parametrize("overhead", [0.0, 0.03, 0.1, 0.25])
def test_plan_reaches_the_bound_within_the_budget(tokens, overhead):
    packs, forward_s, backward_s, peak_s = llama_timeline(tokens=tokens, jitter=0.5, seed=tokens)
    overhead_s = overhead * (forward_s + backward_s)
    plan = plan_copies(packs, forward_s, backward_s, overhead_s, D2H, H2D, peak_s=peak_s)
    bound = copy_bound(packs, peak_s, overhead_s, D2H)
    assert plan.bound_bytes == bound > 0
    assert plan.bytes >= 0.8 * bound, (plan.bytes / bound, plan.bytes, bound)
    total, end = schedule(packs, plan.positions)
    assert total == plan.bytes
    assert spent(packs, plan.positions, forward_s, backward_s, peak_s) <= overhead_s + 1e-9
    # A block goes whole or not at all, and one that a kept save holds never goes.
    for block, positions in blocks_of(packs).items():
        inside = {p in plan.positions for p in positions}
        assert len(inside) == 1, (block, positions)
        if not all(packs[p][3] for p in positions):
            assert inside == {False}
    assert plan.drain is not None and plan.drain >= max(plan.positions)


def test_the_bound_is_the_link_by_the_peak_and_no_more_than_was_made():
    packs = [Pack(0.0, 10 ** 9, 1), Pack(0.01, 10 ** 9, 2), Pack(0.02, 0, 2), Pack(0.5, 10 ** 9, 3)]
    # 0.1 s at 10 GB/s from the first pack to the peak: 1 GB; the third block comes later.
    assert copy_bound(packs, 0.1, 0.0, 10 * GB) == 10 ** 9
    assert copy_bound(packs, 0.1, 0.1, 10 * GB) == 2 * 10 ** 9  # overhead: forward may wait 0.1 s more
    assert copy_bound(packs, 0.1, 10.0, 10 * GB) == 2 * 10 ** 9  # only what was made by the peak
    assert copy_bound([Pack(None, 10 ** 9, 1), Pack(0.0, 5, 2, False)], 1.0, 0.0, GB) == 0


def test_plan_spreads_copies_over_forward_and_keeps_the_budgets():
    # 10 tensors of 0.1 GB saved every 10 ms over a 100 ms forward (plain (at, bytes)
    # pairs: each its own block); a 100 GB/s link carries each in 1 ms: all but the
    # last, saved at the drain (the last pack by the peak), which forward would wait for.
    n = int(0.1 * GB)
    packs = [(i * 0.01, n) for i in range(10)]
    plan = plan_copies(packs, 0.1, 0.2, 0.0, 100 * GB, 100 * GB)
    assert plan.positions == set(range(9)) and plan.bytes == 9 * n and plan.drain == 9
    # 5 GB/s: 20 ms a tensor, copies queue; tensor 4 would land at 100 ms, past the drain (90 ms).
    plan = plan_copies(packs, 0.1, 0.2, 0.0, 5 * GB, 100 * GB)
    assert plan.positions == {0, 1, 2, 3}, plan.positions
    # Backward's share: h2d 1 GB/s over 0.7 x 0.2 s brings back 0.14 GB: one tensor.
    plan = plan_copies(packs, 0.1, 0.2, 0.0, 100 * GB, 1 * GB)
    assert plan.positions == {0} and plan.bytes == n
    # Overhead allowed lets more out and back.
    assert len(plan_copies(packs, 0.1, 0.2, 0.1, 5 * GB, 100 * GB).positions) > 5
    # No candidate (0 bytes, another device, a block with a kept save) is ever planned.
    packs = [Pack(0.0, 0, 1), Pack(None, 10 ** 9, 2), Pack(0.001, 1000, 3), Pack(0.002, 10 ** 6, 4),
             Pack(0.003, 10 ** 6, 4, False)]
    assert plan_copies(packs, 0.1, 0.1, 0.0, GB, GB).positions == {2}
    # A copy that would start long after its tensor was saved waits for nothing: skipped.
    big = [(0.0, 10 * OUT_BYTES), (0.0001, 1000), (50.0, 1)]
    assert plan_copies(big, 100.0, 100.0, 0.0, 1 * GB, 1 * GB).positions == {0}
    # The peak before forward's end: copies must land by then.
    plan = plan_copies([(i * 0.01, n) for i in range(10)], 0.1, 0.2, 0.0, 5 * GB, 100 * GB, peak_s=0.06)
    assert plan.positions == {0, 1, 2} and plan.drain == 6, (plan.positions, plan.drain)
    # The peak in backward (0.5 s): copies land by the drain, the last pack (90 ms) or
    # the one the timed step saw before its peak, not by the peak itself.
    ten = [(i * 0.01, n) for i in range(10)]
    plan = plan_copies(ten, 0.1, 0.2, 0.0, 5 * GB, 100 * GB, peak_s=0.5)
    assert plan.positions == {0, 1, 2, 3} and plan.drain == 9, (plan.positions, plan.drain)
    plan = plan_copies(ten, 0.1, 0.2, 0.0, 5 * GB, 100 * GB, peak_s=0.5, peak_position=6)
    assert plan.positions == {0, 1, 2} and plan.drain == 6, (plan.positions, plan.drain)


def decide(plan, packs, overhead_bytes):
    """offload.py's decisions on another shape's packs: a block's first eligible pack
    asks the Adaptive rule, its other packs follow; a pack that is not eligible stays."""
    rule, decided, positions = None, {}, set()
    for position, (at, nbytes, block, eligible) in enumerate(packs):
        if not eligible:
            continue
        if block not in decided:
            rule = rule or Adaptive(plan, nbytes, overhead_bytes)
            decided[block] = rule.decide(nbytes)
        if decided[block]:
            positions.add(position)
    return positions


@pytest.mark.parametrize("overhead", [0.0, 0.03, 0.1, 0.25])
@pytest.mark.parametrize("tokens", [4096, 8192, 24576, 32768])
def test_another_sequence_length_is_planned_without_a_timing_step(overhead, tokens):
    """Timed at 16384 tokens; a step of another length is decided pack by pack: it
    frees >= 80% of that shape's own bound and its copies land by its peak plus the
    overhead and half OUT_BYTES' time (within 10%: forward's time is modelled as
    proportional to its bytes, and attention's is not)."""
    packs, forward_s, backward_s, peak_s = llama_timeline(tokens=16384)
    overhead_s = overhead * (forward_s + backward_s)
    plan = plan_copies(packs, forward_s, backward_s, overhead_s, D2H, H2D, peak_s=peak_s)
    other, f2, b2, peak2 = llama_timeline(tokens=tokens, jitter=0.3, seed=tokens)
    positions = decide(plan, other, int(overhead_s * D2H))
    blocks = blocks_of(other)
    freed = sum(other[p][1] for ps in blocks.values() if all(q in positions for q in ps) for p in ps)
    bound = copy_bound(other, peak2, overhead * (f2 + b2), D2H)
    assert freed >= 0.8 * bound, (freed / bound, freed, bound)
    _, end = schedule(other, positions)
    allowed = overhead * (f2 + b2) + OUT_BYTES / 2 / D2H
    assert end - peak2 <= 1.1 * allowed, (end - peak2, allowed)


@pytest.mark.parametrize("share", [0.5, 1.5, 3.0])
def test_target_peak_takes_the_least_overhead_that_frees_enough(share):
    """need = share x what the link frees at no overhead: below it no overhead; above
    it the least overhead (within the search's step) whose plan reaches it."""
    packs, forward_s, backward_s, peak_s = llama_timeline(tokens=16384, jitter=0.5, seed=7)
    free = plan_copies(packs, forward_s, backward_s, 0.0, D2H, H2D, peak_s=peak_s).bytes
    need = int(share * free)
    plan, overhead_s = plan_for_peak(packs, forward_s, backward_s, need, D2H, H2D, peak_s=peak_s)
    assert overhead_s is not None and plan.bytes >= need
    assert spent(packs, plan.positions, forward_s, backward_s, peak_s) <= overhead_s + 1e-9
    if share <= 1:
        assert overhead_s == 0.0
    else:
        assert overhead_s > 0
        less = plan_copies(packs, forward_s, backward_s, overhead_s - 2e-3 * (forward_s + backward_s), D2H, H2D,
                           peak_s=peak_s)
        assert less.bytes < need  # a little less overhead would not do


def test_target_peak_out_of_reach_says_so():
    packs, forward_s, backward_s, peak_s = llama_timeline(tokens=8192)
    made = sum(p[1] for p in packs if p[3] and p[0] <= peak_s)
    plan, overhead_s = plan_for_peak(packs, forward_s, backward_s, made * 2, D2H, H2D, peak_s=peak_s)
    assert overhead_s is None and 0 < plan.bytes <= made
    assert plan.bytes == plan_copies(packs, forward_s, backward_s, MAX_OVERHEAD * (forward_s + backward_s), D2H,
                                     H2D, peak_s=peak_s).bytes


def test_stretch_puts_a_slowed_step_onto_the_true_spans():
    rng = random.Random(9)
    for _ in range(200):
        fwd, bwd = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
        true = (fwd / rng.uniform(1.0, 3.0), bwd / rng.uniform(0.8, 1.5))
        times = sorted(rng.uniform(0, fwd + bwd) for _ in range(rng.randrange(1, 40)))
        times.insert(rng.randrange(len(times) + 1), None)
        out = offload_plan.stretch(times, fwd, bwd, true)
        assert out.index(None) == times.index(None)
        seen = [t for t in out if t is not None]
        assert seen == sorted(seen)  # order kept
        for t, o in zip(times, out):
            if t is None:
                continue
            if t <= fwd:
                assert o == pytest.approx(t * true[0] / fwd)  # forward's share kept
            else:
                assert true[0] < o <= true[0] + true[1] + 1e-12
    assert offload_plan.stretch([0.0, 0.2, 0.3], 0.2, 0.1, (0.1, 0.1)) == pytest.approx([0.0, 0.1, 0.2])


@pytest.mark.parametrize("seed", range(8))
def test_overhead_control_brings_a_step_to_the_overhead_asked(seed):
    """A step whose overhead is the planned one times k plus a constant d (the hooks'
    CPU time, waits the plan does not model) plus noise, and now and then a step
    slowed by something else (3x the asked overhead more): the controller settles
    where the typical step's overhead is the one asked, within its deadband and the
    noise, and never plans outside [0, MAX_SCALE x asked]."""
    rng = random.Random(seed)
    base = rng.uniform(0.1, 0.5)
    asked = rng.choice([0.03, 0.1, 0.25]) * base
    k, d, noise = rng.uniform(0.8, 1.3), rng.uniform(-0.2, 0.5) * asked, 0.01 * asked
    control = offload_plan.OverheadControl(asked, base)
    typical = []
    for i in range(80):
        step = base + k * control.planned_s + d + rng.uniform(-noise, noise)
        typical.append(step - base)
        outlier = i % 7 == 3
        control.update(step + (3 * asked if outlier else 0.0))
        assert 0.0 <= control.planned_s <= control.MAX_SCALE * asked
    band = control.DEADBAND * asked + 2 * noise
    assert max(abs(m - asked) for m in typical[-10:]) <= band, (k, d, typical[-10:])


def test_overhead_control_plans_nothing_extra_when_the_hooks_alone_cost_more():
    base, asked = 0.2, 0.006
    control = offload_plan.OverheadControl(asked, base)
    for _ in range(40):
        control.update(base + 2 * asked + control.planned_s)  # 2x asked whatever the plan
    assert control.planned_s == 0.0
    assert control.update(base + 2 * asked) is None  # held at the floor: no new plan


def test_overhead_control_judges_a_plan_on_its_median_step_within_its_deadband():
    base, asked = 0.2, 0.02
    control = offload_plan.OverheadControl(asked, base)
    assert control.update(base + asked * 3) is None  # one step is no judgement
    assert control.update(base + asked * 1.05) is None
    assert control.update(base + asked * 1.1) is None  # median 1.1 x asked: inside the band
    assert control.planned_s == asked and control.measured_s == pytest.approx(asked * 1.1)
    # median of (3, 1.05, 1.1, 1.5) x asked: 1.5 (the upper middle), 0.5 over: the plan moves GAIN x that
    assert control.update(base + asked * 1.5) == pytest.approx(asked * (1 - control.GAIN * 0.5))
    assert control.update(base + asked) is None  # the new plan starts from no steps


def test_replan_is_plan_copies_at_the_new_overhead():
    packs, forward_s, backward_s, peak_s = llama_timeline()
    inputs = (packs, forward_s, backward_s, D2H, H2D, peak_s, None)
    step = forward_s + backward_s
    last = -1
    for share in (0.0, 0.02, 0.05, 0.1, 0.2):
        plan = offload_plan.replan(inputs, share * step)
        same = plan_copies(packs, forward_s, backward_s, share * step, D2H, H2D, peak_s=peak_s)
        assert plan.positions == same.positions and plan.bytes == same.bytes
        assert plan.bytes >= last  # more overhead never plans less
        last = plan.bytes
