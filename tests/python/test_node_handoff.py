"""ferry.node.Handoff between two real processes on the CPU: host buffers and
memmove_many stand in for the GPUs (the ring, the signal words, the plan and the
peer watching are the same code the GPU path runs). Random data, odd sizes,
items larger than a slot, many rounds, bit-exact; a consumer that dies or
stalls gives the producer a clear error, not a hang."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import uuid

import pytest

np = pytest.importorskip("numpy")

from ferry.errors import InvalidArgumentError  # noqa: E402
from ferry.node import (Handoff, HandoffError, HandoffPeerGoneError, HandoffTimeoutError,  # noqa: E402
                        NodePool, memmove_many)
from ferry.node_handoff import plan  # noqa: E402

CTX = multiprocessing.get_context("spawn")


def _name() -> str:
    return f"t-ho-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _round_sizes(seed: int, r: int) -> list[int]:
    """Round r's item sizes: odd sizes, zeros, and now and then one bigger than a slot."""
    rng = np.random.default_rng(seed * 1000 + r)
    n = int(rng.integers(1, 40))
    sizes = rng.integers(0, 9000, size=n)
    if r % 7 == 3:
        sizes[int(rng.integers(0, n))] = 50_001  # spans several 12 KiB slots
    return [int(x) for x in sizes]


def _round_items(seed: int, r: int) -> list:
    rng = np.random.default_rng(seed * 7919 + r)
    return [rng.integers(0, 256, size=n, dtype=np.uint8) for n in _round_sizes(seed, r)]


def _producer(name: str, key: str, rounds: int, seed: int, slots: int, slot_bytes: int, q) -> None:
    try:
        pool = NodePool(name, 4 << 20, label="producer")
        h = Handoff(pool, key, slots, slot_bytes, timeout=30, poll=0.05, copy=memmove_many)
        for r in range(rounds):
            items = _round_items(seed, r)
            h.send([a.ctypes.data for a in items], [a.nbytes for a in items])
        h.drain()
        q.put(("ok", h.pending))
        h.close()
    except Exception as e:  # the test reports it
        q.put(("error", f"{type(e).__name__}: {e}"))


def _consumer(name: str, key: str, rounds: int, seed: int, slots: int, slot_bytes: int, q, action: str) -> None:
    """Receives `rounds` rounds, then: "exit" (dies without closing), "stall" (sleeps)."""
    try:
        pool = NodePool(name, 4 << 20, label="consumer")
        h = Handoff(pool, key, slots, slot_bytes, timeout=30, poll=0.05, copy=memmove_many)
        for r in range(rounds):
            sizes = _round_sizes(seed, r)
            out = [np.zeros(n, np.uint8) for n in sizes]
            h.recv([a.ctypes.data for a in out], sizes)
        q.put(("ok", None))
        if action == "exit":
            q.close()
            q.join_thread()  # the message is out before the process dies without closing anything
            os._exit(0)
        time.sleep(600)
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def _get(q, timeout=60):
    kind, value = q.get(timeout=timeout)
    assert kind == "ok", value
    return value


@pytest.mark.parametrize("slots", [1, 3])
def test_blocks_cross_between_processes_bit_exact_over_many_rounds(slots):
    name, key, seed, rounds = _name(), "kv", int.from_bytes(os.urandom(2), "little"), 120
    pool = NodePool(name, 4 << 20, label="consumer (test)")
    h = Handoff(pool, key, slots, 10_000, timeout=30, poll=0.05, copy=memmove_many)
    assert h.slot_bytes == 12288  # rounded up to 4 KiB
    q = CTX.Queue()
    p = CTX.Process(target=_producer, args=(name, key, rounds, seed, slots, 10_000, q))
    p.start()
    try:
        for r in range(rounds):
            expected = _round_items(seed, r)
            out = [np.full(a.nbytes + 3, 0xEE, np.uint8) for a in expected]  # 3 guard bytes each
            sizes = [a.nbytes for a in expected]
            if r % 2:  # as ferry bench node passes them: int64 arrays of addresses and of sizes
                got = h.recv(np.array([a.ctypes.data for a in out], np.int64), np.array(sizes, np.int64))
            else:
                got = h.recv([a.ctypes.data for a in out], sizes)
            assert got == plan([a.nbytes for a in expected], h.slot_bytes)[0]
            for i, (a, b) in enumerate(zip(expected, out)):
                assert np.array_equal(a, b[: a.nbytes]), f"round {r} item {i} ({a.nbytes} bytes) differs"
                assert (b[a.nbytes:] == 0xEE).all(), f"round {r} item {i}: bytes past it written"
        assert _get(q) == 0  # the producer's drain() saw every slot drained
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0
    assert h.pending == 0
    h.close()


def test_a_consumer_that_dies_gives_the_producer_a_clear_error_not_a_hang():
    name, key, seed = _name(), "kv", 5
    pool = NodePool(name, 4 << 20, label="producer (test)")
    h = Handoff(pool, key, 2, 8192, timeout=60, poll=0.05, copy=memmove_many)
    q = CTX.Queue()
    p = CTX.Process(target=_consumer, args=(name, key, 3, seed, 2, 8192, q, "exit"))
    p.start()
    start = time.monotonic()
    try:
        with pytest.raises(HandoffPeerGoneError, match=r"the consumer \(pid \d+\) left the pool"):
            for r in range(1000):
                items = _round_items(seed, r)
                h.send([a.ctypes.data for a in items], [a.nbytes for a in items])
        assert time.monotonic() - start < 30  # well under timeout=60: noticed by watching, not by waiting
        _get(q)
    finally:
        p.join(30)
    # the handoff is broken for good: a later send says so at once
    with pytest.raises(HandoffError, match="broken"):
        h.send([bytearray(10)], None)
    h.close()


def test_a_live_consumer_that_stalls_times_out_with_who_holds_what():
    name, key, seed = _name(), "kv", 9
    pool = NodePool(name, 4 << 20, label="producer (test)")
    h = Handoff(pool, key, 1, 4096, timeout=60, poll=0.05, copy=memmove_many)
    q = CTX.Queue()
    p = CTX.Process(target=_consumer, args=(name, key, 1, seed, 1, 4096, q, "stall"), daemon=True)
    p.start()
    try:
        items = _round_items(seed, 0)
        h.send([a.ctypes.data for a in items], [a.nbytes for a in items])  # waits for the consumer to start
        _get(q)  # it received round 0 and now sleeps
        h.timeout = 1.0
        t0 = time.monotonic()
        with pytest.raises(HandoffTimeoutError, match=r"did not drain slot 0 .* within 1 s .*consumer"):
            for r in range(1, 100):
                items = _round_items(seed, r)
                h.send([a.ctypes.data for a in items], [a.nbytes for a in items])
        assert 0.9 < time.monotonic() - t0 < 20
    finally:
        p.kill()
        p.join(30)
    h.close()


def test_recv_with_other_sizes_than_send_is_refused_and_consumes_nothing():
    pool = NodePool(_name(), 1 << 20)
    h = Handoff(pool, "k", 2, 4096, timeout=5, copy=memmove_many)
    src = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)
    h.send([src], None)
    out = np.zeros(3000, np.uint8)
    with pytest.raises(InvalidArgumentError, match="recv of 1 items .* the producer's send had 1 items"):
        h.recv([out.ctypes.data], [2999])
    assert h.recv([out], None) == 3000  # the slot is still there
    assert np.array_equal(out, src) and h.pending == 0
    h.close()


def _open_other(name, key, slots, slot_bytes, q):
    try:
        pool = NodePool(name, label="other")
        Handoff(pool, key, slots, slot_bytes, timeout=5, copy=memmove_many)
        q.put(("ok", None))
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("mine, theirs", [
    ((2, 4096), (3, 4096)),  # the same block size (one header granule + 3 slots fit 2 granules): the header differs
    ((3, 64 << 10), (4, 64 << 10)),  # issue 38: the block's size differs (256 KiB and 320 KiB)
    ((4, 64 << 10), (4, 128 << 10)),
])
def test_both_sides_must_give_the_same_slots_and_slot_bytes(mine, theirs):
    """Whether the sizes differ or only the header, the message names both sides'
    slots and slot_bytes (not "named block 'req-7' exists with 256 KiB, not 320 KiB")."""
    name = _name()
    pool = NodePool(name, 4 << 20)
    h = Handoff(pool, "req-7", *mine, copy=memmove_many)
    q = CTX.Queue()
    p = CTX.Process(target=_open_other, args=(name, "req-7", *theirs, q))
    p.start()
    kind, msg = q.get(timeout=60)
    p.join(30)
    want = (f"InvalidArgumentError: Handoff 'req-7': the other side opened it with slots={mine[0]}, "
            f"slot_bytes={mine[1]} ({mine[1] >> 10} KiB); this side asked slots={theirs[0]}, "
            f"slot_bytes={theirs[1]} ({theirs[1] >> 10} KiB): give both sides the same slots and slot_bytes")
    assert kind == "error" and msg.startswith(want), msg
    assert pool.stats()["members"][0]["named"] == 1 and len(pool.stats()["members"]) == 1  # the other held nothing
    h.close()


def test_a_block_of_the_key_that_is_no_handoff_is_named_as_such():
    pool = NodePool(_name(), 1 << 20)
    other = pool.named("k", 4096)
    with pytest.raises(InvalidArgumentError, match=r"Handoff 'k': the other side opened it with a block of 65536 "
                                                   r"bytes \(64 KiB; its header is not a handoff's, or not written "
                                                   r"yet\); this side asked slots=2, slot_bytes=4096 \(4 KiB\)"):
        Handoff(pool, "k", 2, 4096, copy=memmove_many)
    pool.free(other)


def _open_expect_timeout(name, key, q):
    try:
        pool = NodePool(name, label="late opener")
        h = Handoff(pool, key, 2, 4096, timeout=1.0, copy=memmove_many)
        q.put(("ok", f"opened with sent={h._sent} received={h._received} pending={h.pending}"))
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def test_a_stale_header_in_reused_pool_memory_is_not_taken_for_a_ready_one():
    """The pool hands out blocks unzeroed: a block freed by an earlier handoff and made
    again for a new key holds the old header (magic, ready, counters) until its
    maker rewrites it. Another process opening the key in between must wait for
    the maker, not run on the old counters."""
    name = _name()
    pool = NodePool(name, 1 << 20)
    old = Handoff(pool, "old", 2, 4096, copy=memmove_many)
    src = bytearray(os.urandom(5000))
    old.send([src], None)
    old.recv([bytearray(5000)], None)
    size, handle = old.block.nbytes, old.block.handle
    filler = pool.alloc(pool.stats()["free"])  # the old block's bytes are then the only free ones
    old.close()
    maker = pool.named("new", size)  # a maker that has not written the header yet
    assert maker.created and maker.handle == handle  # the same bytes, the old header in them
    pool.free(filler)
    q = CTX.Queue()
    p = CTX.Process(target=_open_expect_timeout, args=(name, "new", q))
    p.start()
    kind, msg = q.get(timeout=60)
    p.join(30)
    assert kind == "error" and "HandoffTimeoutError" in msg and "did not finish writing the header" in msg, msg
    pool.free(maker)


@pytest.mark.parametrize("bad, match", [
    (dict(slots=0), "slots=0"), (dict(slot_bytes=0), "slot_bytes=0"), (dict(timeout=-1), "timeout=-1"),
    (dict(timeout=float("nan")), "timeout=nan"), (dict(poll=-1), "poll=-1"), (dict(poll=float("inf")), "poll=inf"),
    (dict(copy="fast"), "copy='fast'")])
def test_bad_arguments_are_refused(bad, match):
    pool = NodePool(_name(), 1 << 20)
    args = dict(slots=2, slot_bytes=4096, copy=memmove_many) | bad
    with pytest.raises(InvalidArgumentError, match=match):
        Handoff(pool, "k", **args)


def test_sizes_must_match_the_items():
    pool = NodePool(_name(), 1 << 20)
    h = Handoff(pool, "k", 2, 4096, copy=memmove_many)
    with pytest.raises(InvalidArgumentError, match="need sizes"):
        h.send([12345])
    with pytest.raises(InvalidArgumentError, match="2 sizes for 1 items"):
        h.send([bytearray(8)], [4, 4])
    with pytest.raises(InvalidArgumentError, match=r"sizes\[0\]=9: srcs\[0\] holds only 8 bytes"):
        h.send([bytearray(8)], [9])
    buf = np.zeros(64, np.uint8)
    addrs = np.array([buf.ctypes.data, buf.ctypes.data + 32], np.int64)
    with pytest.raises(InvalidArgumentError, match="3 sizes for 2 items"):
        h.send(addrs, np.array([4, 4, 4], np.int64))
    with pytest.raises(InvalidArgumentError, match="-4 is negative"):
        h.send(addrs, np.array([4, -4], np.int64))
    h.close()


def test_the_plan_covers_every_byte_once_within_slots():
    rng = np.random.default_rng(int.from_bytes(os.urandom(2), "little"))
    for _ in range(200):
        slot = int(rng.integers(1, 20)) * 4096
        sizes = rng.integers(0, 3 * slot, size=int(rng.integers(1, 50)))
        sizes[rng.random(len(sizes)) < 0.2] = 0
        total, chunks = plan(sizes, slot)
        covered = [0] * len(sizes)
        seen = np.zeros(max(total, 1), np.int32)
        for c, (item, off, pos, length) in enumerate(chunks):
            assert (pos >= 0).all() and (pos + length <= slot).all() and (length > 0).all()
            for i, o, p, n in zip(item.tolist(), off.tolist(), pos.tolist(), length.tolist()):
                covered[i] += n
                seen[c * slot + p: c * slot + p + n] += 1
                assert o + n <= sizes[i]
        assert covered == sizes.tolist()
        assert seen.max(initial=0) <= 1  # no two pieces share a byte of the ring


# ---- on the GPU: the default copy (ferry.copy_many), GPU -> pinned slots -> GPU ----------


def _layout(seed: int, sizes: list[int], salt: int) -> tuple[list[int], int]:
    """Offsets of the items in a buffer, in a seeded shuffled order (scattered blocks)."""
    order = np.random.default_rng(seed + salt).permutation(len(sizes))
    offsets, at = [0] * len(sizes), 0
    for i in order.tolist():
        offsets[i] = at
        at += sizes[i] + 512  # gaps that must stay untouched
    return offsets, at


def _gpu_sizes(seed: int, r: int) -> list[int]:
    rng = np.random.default_rng(seed * 31 + r)
    kinds = [64 << 10, 2 << 20, int(rng.integers(1, 3 << 20)), 65535]
    return [kinds[int(k)] for k in rng.integers(0, len(kinds), size=int(rng.integers(20, 60)))]


def _gpu_side(role: str, name: str, key: str, seed: int, device: int, rounds: int, q) -> None:
    try:
        import ferry
        from ferry import _ferry

        _ferry.cuda_warm_up(device)
        pool = NodePool(name, 128 << 20, device=device, label=role)
        h = Handoff(pool, key, 3, 8 << 20, timeout=60)
        problems = []
        for r in range(rounds):
            sizes = _gpu_sizes(seed, r)
            src_off, src_n = _layout(seed + r, sizes, 1)
            dst_off, dst_n = _layout(seed + r, sizes, 2)
            data = np.random.default_rng(seed + 1000 + r).integers(0, 256, src_n, dtype=np.uint8)
            if role == "producer":
                buf = _ferry.cuda_malloc(src_n, device)
                ferry.copy(buf, data, src_n, device=device)
                h.send(np.array(src_off, np.int64) + buf, sizes)
            else:
                buf = _ferry.cuda_malloc(dst_n, device)
                ferry.copy(buf, np.full(dst_n, 0xEE, np.uint8), dst_n, device=device)
                h.recv(np.array(dst_off, np.int64) + buf, sizes)
                got = np.empty(dst_n, np.uint8)
                ferry.copy(got, buf, dst_n, device=device)
                written = np.zeros(dst_n, bool)
                for i, n in enumerate(sizes):
                    written[dst_off[i]:dst_off[i] + n] = True
                    if not np.array_equal(got[dst_off[i]:dst_off[i] + n], data[src_off[i]:src_off[i] + n]):
                        problems.append(f"round {r} item {i} ({n} bytes) differs")
                if (got[~written] != 0xEE).any():
                    problems.append(f"round {r}: bytes between the items were written")
            _ferry.cuda_free(buf)
        if role == "producer":
            h.drain()
        h.close()
        q.put(("ok", problems))
    except Exception as e:
        q.put(("error", f"{type(e).__name__}: {e}"))


def test_on_the_gpu_scattered_blocks_cross_from_one_gpu_to_another_bit_exact(gpu):
    """GPU 0 -> node pool -> GPU 1 (GPU 0 again where there is one), 64 KiB, 2 MiB
    and odd-sized blocks at shuffled places, the default copy (ferry.copy_many)."""
    devices = len(gpu["devices"])
    name, seed = _name(), int.from_bytes(os.urandom(2), "little")
    qs = {role: CTX.Queue() for role in ("producer", "consumer")}
    procs = [CTX.Process(target=_gpu_side, args=(role, name, "kv", seed, i % devices, 4, qs[role]))
             for i, role in enumerate(("producer", "consumer"))]
    for p in procs:
        p.start()
    try:
        results = {}
        for (role, q), p in zip(qs.items(), procs):  # both, whichever fails first
            try:
                results[role] = q.get(timeout=150)
            except queue.Empty:
                results[role] = ("error", f"no answer within 150 s (exit code {p.exitcode}: a crash?)")
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    failed = {role: value for role, (kind, value) in results.items() if kind != "ok"}
    assert not failed, f"{failed}"  # both sides' messages: one side's error is often the other's timeout
    assert results["consumer"][1] == [], results["consumer"][1]
