"""One rule for every timeout of ferry's Python API (_args.timeout): seconds (an int or
a float, numpy numbers too); None or math.inf: no limit; negative, NaN, a bool or a
string refused with InvalidArgumentError naming the argument.

Issue 38 item 8: pool.wait(timeout=inf) (or 1e10, 1e300) returned False at once (the
native clock overflowed), NaN was accepted, a negative timeout waited forever and
Handoff.drain(timeout=-1) hung after its consumer died. Here: each bad value refused
at every public timeout; inf, 1e10 and 1e300 really wait (a waiter thread is still
waiting after 0.3 s, and a later add() releases it with True); tiny timeouts return
False promptly; a finite wait longer than one native slice ends on time; drain with
a dead consumer ends within its timeout.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import threading
import time

import numpy as np
import pytest

from ferry import _args
from ferry.errors import InvalidArgumentError
from ferry.node import Handoff, HandoffPeerGoneError, HandoffTimeoutError, NodePool, memmove_many

CTX = mp.get_context("spawn")
BAD = [(-1, r"timeout=-1: out of range"), (-0.001, r"timeout=-0.001: out of range"),
       (-math.inf, r"timeout=-inf: out of range"), (math.nan, r"timeout=nan: out of range"),
       (True, r"timeout=True: expected seconds >= 0, or None \(no limit\) \(a bool is not a timeout\)"),
       ("1", r"timeout='1': expected seconds"), (-(10 ** 400), r"out of range")]
FOREVER = [None, math.inf, 1e10, 1e300, 10 ** 400]


def _id(value) -> str:
    text = repr(value)
    return text if len(text) < 20 else text[:8] + "..."


def _name(what: str) -> str:
    return f"to{os.getpid()}-{what}-{random.randrange(1 << 30)}"


@pytest.fixture
def pool():
    with NodePool(_name("pool"), 1 << 20) as p:
        yield p


def test_the_rule():
    assert _args.timeout(None) is None and _args.timeout(math.inf) is None and _args.timeout(10 ** 400) is None
    assert _args.timeout(0) == 0.0 and _args.timeout(2) == 2.0 and _args.timeout(np.float32(0.5)) == 0.5
    assert _args.timeout(np.int64(3)) == 3.0 and _args.timeout(1e300) == 1e300
    for value, message in BAD:
        with pytest.raises(InvalidArgumentError, match=message):
            _args.timeout(value)
    with pytest.raises(InvalidArgumentError, match="^drain_s=-1: "):
        _args.timeout(-1, "drain_s")


@pytest.mark.parametrize("value, message", BAD, ids=[_id(v) for v, _ in BAD])
def test_bad_timeouts_are_refused_everywhere(pool, tmp_path, value, message):
    """value=0 below: a wait that would return at once, so a timeout that is not refused
    shows as no error (never as a hang)."""
    from ferry import channel
    from ferry.nixl import metadata, transfers, ucx

    block = pool.alloc(4096)
    calls = {
        "NodePool.wait": lambda: pool.wait(block, 0, 0, timeout=value),
        "NodePool()": lambda: NodePool(_name("bad"), 1 << 20, timeout=value),
        "Handoff()": lambda: Handoff(pool, "bad", 1, 4096, timeout=value, copy=memmove_many),
        "nixl.load_metadata": lambda: metadata.load_metadata(None, tmp_path / "none.json", timeout=value),
        "nixl.transfer": lambda: transfers.transfer(None, "READ", None, None, "peer", timeout=value),
        "nixl.Transfer.wait": lambda: transfers.Transfer.__new__(transfers.Transfer).wait(value),
        "ucx.run_probe": lambda: ucx.run_probe("/nonexistent/libucp.so", timeout=value, gpus=0),
    }
    h = Handoff(pool, "drain", 1, 4096, timeout=5, copy=memmove_many)
    calls["Handoff.drain"] = lambda: h.drain(timeout=value)
    for what, call in calls.items():
        with pytest.raises(InvalidArgumentError, match=message):
            call()
            pytest.fail(f"{what} took timeout={value!r}")
    with pytest.raises(InvalidArgumentError, match=message.replace("timeout=", "timeout_ms=").replace(
            "seconds", "milliseconds")):
        channel.Channel.__new__(channel.Channel).wait(0, 0, timeout_ms=value)
    h.close()


def test_bad_timeouts_of_a_node_load_and_a_snapshot_are_refused(pool, tmp_path):
    pytest.importorskip("torch")
    from ferry.torch import node_load
    from ferry.torch.snapshots import SaveFuture

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    done = SaveFuture(lambda: ["p"])
    assert done.wait(math.inf) == ["p"] and done.wait(None) == ["p"] and done.wait(0) == ["p"]
    for value, message in BAD:
        with pytest.raises(InvalidArgumentError, match=message):
            node_load.read_file_once(pool, path, 0, 1, timeout=value)
        with pytest.raises(InvalidArgumentError, match=message):
            done.wait(value)
    nf = node_load.read_file_once(pool, path, 0, 1, timeout=math.inf)  # no limit: it loads
    assert bytes(nf.view()) == b"x" * 100
    nf.release()


@pytest.mark.parametrize("timeout", FOREVER + [0, 2], ids=_id)
def test_an_open_takes_every_good_timeout(timeout):
    name = _name("open")
    with NodePool(name, 1 << 20, timeout=timeout) as pool, NodePool(name, timeout=timeout) as same:
        assert same is not pool and same.capacity == pool.capacity  # the second open attaches (one process)


def _waiter(pool, block, timeout):
    out = {}

    def run():
        out["result"] = pool.wait(block, 0, 1, timeout=timeout)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("timeout", FOREVER, ids=_id)
def test_no_limit_and_huge_timeouts_really_wait(pool, timeout):
    block = pool.alloc(4096)
    t, out = _waiter(pool, block, timeout)
    time.sleep(0.3)
    assert t.is_alive() and "result" not in out, f"wait(timeout={timeout!r}) returned {out} at once"
    pool.add(block, 0)
    t.join(10)
    assert not t.is_alive() and out["result"] is True


def test_a_waiter_in_another_process_is_released_by_an_add(pool):
    block = pool.alloc(4096)
    t, out = _waiter(pool, block, math.inf)
    p = CTX.Process(target=_add_later, args=(pool.name, block.handle))
    p.start()
    t.join(30)
    p.join(30)
    assert out.get("result") is True and p.exitcode == 0


def _add_later(name, handle):
    other = NodePool(name)
    time.sleep(0.3)
    other.add(other.block(handle), 0)
    other.close()


@pytest.mark.parametrize("timeout", [0, 1e-9, 0.01, np.float64(0.05)], ids=repr)
def test_tiny_timeouts_return_false_promptly(pool, timeout):
    block = pool.alloc(4096)
    t0 = time.monotonic()
    assert pool.wait(block, 0, 1, timeout=timeout) is False
    assert time.monotonic() - t0 < 0.5


def test_a_wait_longer_than_one_native_slice_ends_on_time(pool):
    block = pool.alloc(4096)
    t0 = time.monotonic()
    assert pool.wait(block, 0, 1, timeout=1.6) is False
    assert 1.55 < time.monotonic() - t0 < 3.0
    pool.add(block, 0)
    assert pool.wait(block, 0, 1, timeout=1e300) is True


def _consumer(name, key, mode, q):
    pool = NodePool(name, label="consumer")
    h = Handoff(pool, key, 2, 4096, timeout=30, poll=0.05, copy=memmove_many)
    q.put("open")
    if mode == "recv-once":
        h.recv([bytearray(1000)], None)
        q.put("received")
    time.sleep(0.2)
    os._exit(0)  # dies with slots undrained, no close


@pytest.mark.parametrize("mode, drain_timeout, error", [
    ("recv-once", math.inf, HandoffPeerGoneError),  # it joined: noticed within poll, even with no limit
    ("recv-once", None, HandoffPeerGoneError),
    ("never-recv", 1.0, HandoffTimeoutError),  # it never joined: only the timeout ends the drain
])
def test_drain_with_a_dead_consumer_ends_within_its_timeout(mode, drain_timeout, error):
    name = _name("drain")
    with NodePool(name, 1 << 20) as pool:
        h = Handoff(pool, "k", 2, 4096, timeout=30, poll=0.05, copy=memmove_many)
        q = CTX.Queue()
        p = CTX.Process(target=_consumer, args=(name, "k", mode, q))
        p.start()
        assert q.get(timeout=60) == "open"
        h.send([bytearray(1000)], None)
        if mode == "recv-once":
            assert q.get(timeout=60) == "received"
            h.send([bytearray(1000)], None)  # never received
        else:
            h.send([bytearray(1000)], None)
        p.join(30)
        t0 = time.monotonic()
        with pytest.raises(error):
            h.drain(timeout=drain_timeout)
        assert time.monotonic() - t0 < 5
        h.close()
