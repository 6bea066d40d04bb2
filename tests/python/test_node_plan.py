"""The route of a node load per file (ferry.torch.node_plan): through the pool, or
each rank alone where the file is in the page cache.

CPU: the page-cache probe on a real file on disk before and after its pages are
dropped (posix_fadvise DONTNEED) and read back; real spawned processes sharing
a NodePool agree on the routes the first rank to arrive chose, even when each
would choose otherwise (FERRY_NODE_LOAD differs per rank), also a rank that
comes after the planner has finished its load; a rank that never comes bounds
the planner's close by the timeout.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
from rank_processes import spawn

from ferry import _ferry
from ferry.errors import InvalidArgumentError
from ferry.node import NodePool
from ferry.torch import node_plan


def _name(what: str) -> str:
    return f"np{os.getpid()}-{what}-{random.randrange(1 << 30)}"


def _drop_cached(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def disk_files(tmp_path):
    """Two files of odd sizes on a file system with a page cache (not tmpfs),
    large enough that the probe's 64 reads lie 1 MiB apart, further than the
    read-ahead a missed probe starts."""
    paths = []
    for i, size in enumerate([(64 << 20) + 4321, (48 << 20) + 17]):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(random.Random(i).randbytes(size))  # noqa: S311 - test data
        paths.append(str(p))
    return paths


def test_the_probe_sees_pages_dropped_and_read_back(disk_files):
    """Each look is made once after a drop: a probe that misses starts the kernel's
    read-ahead (RWF_NOWAIT reads do), so a second look finds more cached."""
    a, b = disk_files
    _drop_cached(a)
    shares = _ferry.page_cache_shares([a])
    if shares[0] < 0:
        pytest.skip("this file system cannot tell what is cached (no RWF_NOWAIT)")
    if shares[0] > 0.5:
        pytest.skip(f"posix_fadvise(DONTNEED) did not drop the pages here ({shares[0]:.0%} still cached: tmpfs?)")
    for p in disk_files:
        _drop_cached(p)
    with open(a, "rb") as f:
        f.read()
    routes = node_plan.choose([a, b], ranks=2)
    assert [r for r, _ in routes] == ["alone", "pool"], routes
    assert "100% in the page cache" in routes[0][1] and "page cache" in routes[1][1]


def test_one_rank_or_a_forced_route_needs_no_probe(disk_files):
    assert [r for r, _ in node_plan.choose(disk_files, ranks=1)] == ["alone", "alone"]
    assert [r for r, _ in node_plan.choose(disk_files, 2, "pool")] == ["pool", "pool"]
    assert [r for r, _ in node_plan.choose(disk_files, 2, "alone")] == ["alone", "alone"]


def test_the_probe_refuses_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(InvalidArgumentError, match="not a regular file"):
        _ferry.page_cache_shares([str(tmp_path)])
    with pytest.raises(OSError):
        _ferry.page_cache_shares([str(tmp_path / "missing")])


def test_a_bad_forced_route_is_refused():
    code = ("from ferry.torch import node_plan\n"
            "try:\n    node_plan.forced_route()\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    env = dict(os.environ, FERRY_NODE_LOAD="sideways")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "InvalidArgumentError" in out.stdout and "FERRY_NODE_LOAD='sideways'" in out.stdout, out


def _planner(name, paths, rank, ranks, route, delay, marker, conn):
    """One rank: with delay > 0, wait until `marker` exists (another rank has
    planned) and then `delay` seconds more; plan with FERRY_NODE_LOAD=route
    (with delay 0 and a marker, make the marker once planned); close; send back
    the routes and close's time."""
    try:
        os.environ["FERRY_NODE_LOAD"] = route
        pool = NodePool(name, label=f"rank {rank}")
        if delay > 0:
            end = time.monotonic() + 60  # spawned ranks start seconds apart on a busy machine
            while not os.path.exists(marker) and time.monotonic() < end:
                time.sleep(0.01)
            time.sleep(delay)
        plan = node_plan.plan(pool, paths, rank, ranks, timeout=30)
        if delay == 0 and marker:
            open(marker, "w").close()
        t0 = time.monotonic()
        plan.close()
        took = time.monotonic() - t0
        end = time.monotonic() + 5  # the other rank lets go just after its own close returns
        while pool.stats()["used"] and time.monotonic() < end:
            time.sleep(0.01)
        conn.send(([r for r, _ in plan.routes], took, pool.stats()["used"]))
    except Exception as e:  # noqa: BLE001 - sent back to the test
        conn.send(f"{type(e).__name__}: {e}")
    conn.close()


def _spawn(args_per_rank, wait: float = 60) -> list:
    return spawn(_planner, args_per_rank, wait)


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_takes_the_route_the_planner_chose(disk_files, ranks):
    name = _name("agree")
    routes = ["alone" if r % 2 else "pool" for r in range(ranks)]  # each would choose otherwise
    with NodePool(name, 1 << 20, label="test"):
        outs = _spawn([(name, disk_files, r, ranks, routes[r], 0.0, None) for r in range(ranks)])
    assert all(not isinstance(o, str) for o in outs), outs
    chosen = {tuple(o[0]) for o in outs}
    assert len(chosen) == 1, outs  # one plan for every rank
    assert chosen.pop() in {("pool", "pool"), ("alone", "alone")}


def test_a_late_rank_gets_the_plan_of_a_finished_planner(disk_files, tmp_path):
    """Rank 0 plans "alone" and finishes its load at once; rank 1 comes 1 s after
    rank 0 has planned, wanting "pool": it must still get "alone" (the planner
    holds the plan until every rank has read it)."""
    name, marker = _name("late"), str(tmp_path / "planned")
    with NodePool(name, 1 << 20, label="test"):
        outs = _spawn([(name, disk_files, 0, 2, "alone", 0.0, marker), (name, disk_files, 1, 2, "pool", 1.0, marker)])
    assert all(not isinstance(o, str) for o in outs), outs
    assert outs[0][0] == outs[1][0] == ["alone", "alone"], outs
    assert outs[0][1] >= 0.9  # the planner waited for the late rank
    assert outs[0][2] == outs[1][2] == 0  # and the plan's block is gone once both let go


def test_a_rank_that_never_comes_bounds_the_planners_close(disk_files):
    name = _name("never")
    with NodePool(name, 1 << 20, label="test") as pool:
        plan = node_plan.plan(pool, disk_files, 0, 2, timeout=0.3)
        assert len(plan.routes) == 2
        t0 = time.monotonic()
        plan.close()
        took = time.monotonic() - t0
        assert 0.25 <= took < 5, took
        assert pool.stats()["used"] == 0
        plan.close()  # twice: nothing more
