"""ferry.nixl scenarios with real NIXL agents, each run in a fresh process by
tests/python/test_nixl.py (`python nixl_scenarios.py NAME`): UCX loads memory
hooks and threads into a process, so the pytest process stays free of it.
Each scenario has two agents in this process talking through UCX (tcp, unless
UCX_TLS says otherwise), asserts on real data and prints "ok" at the end.
The two-process exchange is examples/nixl_kv_offload.py --device cpu.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

import numpy as np  # noqa: E402

import ferry  # noqa: E402
import ferry.nixl as fn  # noqa: E402

MiB = 1 << 20


def random_fill(buf, seed: int) -> np.ndarray:
    view = np.frombuffer(buf, np.uint8)
    view[:] = np.frombuffer(np.random.default_rng(seed).bytes(len(view)), np.uint8)
    return view


def poisoned(buf) -> np.ndarray:
    view = np.frombuffer(buf, np.uint8)
    view[:] = 0xA5
    return view


def expect_error(cls, fragment: str, fn_, *args, **kwargs):
    try:
        fn_(*args, **kwargs)
    except cls as e:
        assert fragment in str(e), f"{fragment!r} not in {str(e)!r}"
        return e
    raise AssertionError(f"no {cls.__name__} raised")


def pool_follows_growth_and_trim():
    """A pool's chunks registered now and later: a peer reads odd-sized blocks
    at odd offsets; a chunk added later is unknown to the peer until it loads
    the metadata again; a released chunk is deregistered."""
    a, b = fn.make_agent("A"), fn.make_agent("B")
    pool_a = ferry.Pool(chunk_bytes=4 * MiB)
    pool_b = ferry.Pool(chunk_bytes=4 * MiB)
    src = pool_a.alloc(3 * MiB + 17)
    src_bytes = random_fill(src, 1)
    reg_a = fn.register_pool(a, pool_a)
    reg_b = fn.register_pool(b, pool_b)
    assert reg_a.regions == [(base, n) for base, n, _ in pool_a.chunks()]
    assert not reg_a.sync(), "nothing changed since registration"
    peer = fn.add_remote(b, a.get_agent_metadata())
    assert peer == "A"

    dst = pool_b.alloc(3 * MiB + 17)
    dst_bytes = poisoned(dst)
    lengths = [1, 4093, 65537, MiB + 3, 12345]
    src_offsets = [5, 100, 9000, 2 * MiB + 11, 3 * MiB - 12345 + 17]
    dst_offsets = [3 * MiB, 7, 300000, 1000, 2 * MiB]
    local = fn.blocks([dst.ptr + o for o in dst_offsets], lengths, mem_type="DRAM", owner=dst)
    remote = fn.blocks([src.ptr + o for o in src_offsets], lengths, mem_type="DRAM")
    with fn.read(b, local, remote, peer, timeout=60, sync=reg_b) as t:
        assert t.seconds is not None and t.nbytes == sum(lengths) and t.backend == "UCX"
    expected = np.full_like(dst_bytes, 0xA5)
    for so, do, n in zip(src_offsets, dst_offsets, lengths):
        expected[do : do + n] = src_bytes[so : so + n]
    assert np.array_equal(dst_bytes, expected), "READ moved the wrong bytes"

    # A chunk the pool adds later: registered by sync(), known to the peer after a reload.
    before = pool_a.chunk_generation
    grown = pool_a.alloc(5 * MiB + 1)  # beyond a chunk: a dedicated 6 MiB chunk
    assert pool_a.chunk_generation > before
    grown_bytes = random_fill(grown, 2)
    changes = reg_a.sync()
    assert len(changes.added) == 1 and not changes.removed and changes.added[0][1] == 6 * MiB
    remote = fn.descs(grown, MiB)
    local = fn.descs(dst, MiB)
    expect_error(fn.NixlError, "NIXL_ERR_NOT_FOUND", fn.read, b, local, remote, peer, timeout=60)
    assert fn.add_remote(b, a.get_agent_metadata()) == peer  # an update of a known agent
    with fn.read(b, local, remote, peer, timeout=60):
        pass
    assert np.array_equal(dst_bytes[:MiB], grown_bytes[:MiB])

    # The chunk released: sync() deregisters it; the first chunk stays registered.
    grown_base = changes.added[0][0]
    del grown_bytes
    grown.release()
    assert pool_a.trim(4 * MiB) >= 6 * MiB
    changes = reg_a.sync()
    assert changes.removed == [(grown_base, 6 * MiB)] and not changes.added
    assert grown_base not in [base for base, _ in reg_a.regions]
    assert len(reg_a.regions) == len(pool_a.chunks()) == 1
    reg_a.close()
    reg_a.close()  # idempotent
    expect_error(ferry.InvalidArgumentError, "closed", reg_a.sync)
    reg_b.close()


def plain_pool_part_release_registers_again():
    """trim() returning free pages of a used chunk moves its generation;
    sync() registers that chunk again, and new data there moves correctly."""
    a, b = fn.make_agent("A"), fn.make_agent("B")
    pool_a, pool_b = ferry.Pool(chunk_bytes=8 * MiB), ferry.Pool(chunk_bytes=8 * MiB)
    kept = pool_a.alloc(MiB, huge=True)
    freed = pool_a.alloc(4 * MiB, alignment=2 * MiB, huge=True)
    reg_a, reg_b = fn.register_pool(a, pool_a), fn.register_pool(b, pool_b)
    [(base, nbytes, generation)] = pool_a.chunks()
    freed.release()
    assert pool_a.trim(0) > 0
    [(base2, nbytes2, generation2)] = pool_a.chunks()
    assert (base2, nbytes2) == (base, nbytes) and generation2 > generation
    changes = reg_a.sync()
    assert changes.removed == [(base, nbytes)] and changes.added == [(base, nbytes)]
    again = pool_a.alloc(4 * MiB, alignment=2 * MiB, huge=True)  # in the released range: fresh pages
    again_bytes = random_fill(again, 3)
    kept_bytes = random_fill(kept, 4)
    peer = fn.add_remote(b, a.get_agent_metadata())
    dst = pool_b.alloc(5 * MiB)
    dst_bytes = poisoned(dst)
    local = fn.blocks([dst.ptr, dst.ptr + 4 * MiB], [4 * MiB, MiB], mem_type="DRAM", owner=dst)
    with fn.read(b, local, fn.descs(again) + fn.descs(kept), peer, timeout=60, sync=[reg_a, reg_b]):
        pass
    assert np.array_equal(dst_bytes[: 4 * MiB], again_bytes)
    assert np.array_equal(dst_bytes[4 * MiB :], kept_bytes)
    reg_a.close()
    reg_b.close()


def write_timeout_then_completion_and_errors():
    """WRITE; a wait that times out leaves the transfer posted and it still
    completes; bad requests fail before NIXL sees them, or with NixlError."""
    a, b = fn.make_agent("A"), fn.make_agent("B")
    pool_a, pool_b = ferry.Pool(), ferry.Pool()
    n = 256 * MiB  # over tcp this takes far longer than one poll
    src, dst = pool_a.alloc(n), pool_b.alloc(n)
    src_bytes, dst_bytes = random_fill(src, 5), poisoned(dst)
    reg_a, reg_b = fn.register_pool(a, pool_a), fn.register_pool(b, pool_b)
    peer = fn.add_remote(a, b.get_agent_metadata())
    t = fn.post(a, "WRITE", fn.descs(src), fn.descs(dst), peer)
    assert t.seconds is None, "256 MiB over tcp done within the post: nothing to time out"
    e = expect_error(fn.NixlTimeoutError, "not done after 0 s", t.wait, 0)
    assert isinstance(e, TimeoutError) and isinstance(e, ferry.FerryError)
    expect_error(ferry.InvalidArgumentError, "still running", t.repost)
    t.wait(120)
    assert np.array_equal(dst_bytes, src_bytes), "WRITE moved the wrong bytes"
    dst_bytes[:] = 0xA5
    t.repost().wait(120)  # the same request again
    assert np.array_equal(dst_bytes, src_bytes)
    t.release()
    t.release()  # idempotent
    expect_error(ferry.InvalidArgumentError, "released", t.repost)

    small = fn.descs(src, 4096)
    expect_error(ferry.InvalidArgumentError, "4096 bytes locally, 8192 remotely", fn.post, a, "WRITE", small,
                 fn.descs(dst, 8192), peer)
    expect_error(ferry.InvalidArgumentError, "op='COPY'", fn.post, a, "COPY", small, small, peer)
    expect_error(fn.NixlError, "initialize_xfer", fn.write, a, small, small, "nobody", timeout=5)
    expect_error(ferry.InvalidArgumentError, "backend_params for ['TCP']", fn.make_agent, "C",
                 backend_params={"TCP": {}})
    expect_error(fn.NixlError, "no 'NOPE' plugin", fn.make_agent, "C", backends=["NOPE"])
    reg_a.close()
    reg_b.close()


SCENARIOS = {f.__name__: f for f in (pool_follows_growth_and_trim, plain_pool_part_release_registers_again,
                                      write_timeout_then_completion_and_errors)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("ok")
