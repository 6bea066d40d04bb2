"""ferry.nixl.coalesce and post(coalesce=...): descriptor pairs adjacent on both
sides join into larger ones, and a transfer moves exactly the same bytes. Pure
checks (no NIXL): random permutations, runs, gaps, odd sizes, devices and caps
against a byte-by-byte map. With NIXL (scripts/test installs nixl-cu13): two
agents in a fresh process move ferry Pool memory with coalescing on, off and
with a small cap over random layouts, data verified, and joined rows that would
span two registrations (remote or local) fall back to the rows as given.
"""

import bisect
import os
import random
import subprocess
import sys

import pytest

import ferry
import ferry.nixl as fn


def assert_same_bytes(local, remote, jl, jr):
    """The joined lists pair every byte as the originals do: each original pair
    lies inside one joined pair at the same local -> remote offset (devices
    equal), and each joined pair is made of exactly the original pairs inside it."""
    joined = sorted((a, n, d, b, e) for (a, n, d), (b, _, e) in zip(jl.rows, jr.rows))
    starts = [j[0] for j in joined]
    filled = [0] * len(joined)
    for (a, n, d), (b, m, e) in zip(local.rows, remote.rows):
        assert n == m
        hits = [i for i in range(bisect.bisect_right(starts, a) - 1, -1, -1)
                if joined[i][0] <= a and a + n <= joined[i][0] + joined[i][1]
                and (joined[i][2], joined[i][4]) == (d, e) and joined[i][3] - joined[i][0] == b - a][:1]
        assert hits, f"original pair {(a, n, d, b, e)} is in no joined pair"
        filled[hits[0]] += n
    assert filled == [j[1] for j in joined]


def pairs(rows, mem_types=("DRAM", "VRAM")):
    local = fn.Descs(mem_types[0], [(a, n, d) for a, _, n, d, _ in rows])
    remote = fn.Descs(mem_types[1], [(b, n, e) for _, b, n, _, e in rows])
    return local, remote


def random_layout(rng: random.Random, count: int, *, gaps: bool, shuffle_remote: bool, runs: int = 4):
    """(local address, remote address, nbytes, local device, remote device) rows:
    odd sizes, local blocks in order (with gaps when asked); remote: one range
    (shuffle_remote False) or runs of up to `runs` consecutive blocks placed in
    a random order with random gaps; the row order shuffled."""
    sizes = [rng.choice((1, 7, 64, 4096, 4099, 65536)) for _ in range(count)]
    la, rows = 0x10000, []
    for n in sizes:
        rows.append([la, 0, n, 0, 0])
        la += n + (rng.choice((0, 0, 1, 512)) if gaps else 0)
    groups, k = [], 0
    while k < count:
        run = rng.randint(1, runs) if shuffle_remote else count
        groups.append(rows[k:k + run])
        k += run
    if shuffle_remote:
        rng.shuffle(groups)
    rb = 0x900000
    for group in groups:
        rb += rng.choice((0, 8, 4096)) if shuffle_remote else 0
        for row in group:
            row[1] = rb
            rb += row[2]
    rng.shuffle(rows)
    return [tuple(r) for r in rows]


def check_join(local, remote, cap):
    jl, jr = fn.coalesce(local, remote, cap)
    assert jl.mem_type == local.mem_type and jr.mem_type == remote.mem_type
    assert_same_bytes(local, remote, jl, jr)
    assert jl.nbytes == local.nbytes and len(jl) <= len(local)
    originals = {(a, n) for a, n, _ in local.rows}
    for a, n, _ in jl.rows:
        assert n <= cap or (a, n) in originals  # over the cap only a row that was never joined
    if len(jl) == len(local):
        assert jl is local and jr is remote
    return jl, jr


def test_consecutive_blocks_join_up_to_the_cap():
    rows = [(0x1000 + k * 65536, 0x80000000 + k * 65536, 65536, 0, 0) for k in range(2048)]
    local, remote = pairs(rows)
    jl, jr = check_join(local, remote, fn.COALESCE_BYTES)
    assert len(jl) == 64 and all(n == 2 << 20 for _, n, _ in jl.rows)
    assert jr.rows[1] == (0x80000000 + (2 << 20), 2 << 20, 0)
    assert len(fn.coalesce(local, remote, 128 << 20)[0]) == 1
    assert fn.coalesce(local, remote, 0) == (local, remote)
    assert fn.coalesce(local, remote, 65536) == (local, remote)  # no two fit under the cap


def test_rows_listed_in_reverse_join_and_the_joined_list_keeps_its_owners():
    owner = object()
    local = fn.Descs("DRAM", [(0x1000 + k * 100, 100, 0) for k in reversed(range(10))], (owner,))
    remote = fn.Descs("DRAM", [(0x9000 + k * 100, 100, 0) for k in reversed(range(10))])
    jl, jr = check_join(local, remote, 1 << 20)
    assert jl.rows == ((0x1000, 1000, 0),) and jr.rows == ((0x9000, 1000, 0),)
    assert jl._owners == (owner,)


@pytest.mark.parametrize("case, rows", [
    ("remote reversed", [(0x1000, 0x9100, 256, 0, 0), (0x1100, 0x9000, 256, 0, 0)]),
    ("remote gap", [(0x1000, 0x9000, 256, 0, 0), (0x1100, 0x9101, 256, 0, 0)]),
    ("local gap", [(0x1000, 0x9000, 256, 0, 0), (0x1101, 0x9100, 256, 0, 0)]),
    ("local device differs", [(0x1000, 0x9000, 256, 0, 0), (0x1100, 0x9100, 256, 1, 0)]),
    ("remote device differs", [(0x1000, 0x9000, 256, 0, 1), (0x1100, 0x9100, 256, 0, 0)]),
    ("same local twice", [(0x1000, 0x9000, 256, 0, 0), (0x1000, 0x9100, 256, 0, 0)]),
    ("overlapping local", [(0x1000, 0x9000, 256, 0, 0), (0x1080, 0x9100, 256, 0, 0)]),
])
def test_pairs_not_adjacent_on_both_sides_stay_separate(case, rows):
    local, remote = pairs(rows)
    assert fn.coalesce(local, remote, 1 << 30) == (local, remote)


def test_random_layouts_move_the_same_bytes():
    rng = random.Random(25)
    for trial in range(300):
        rows = random_layout(rng, rng.randint(1, 40), gaps=trial % 3 == 0, shuffle_remote=trial % 2 == 0)
        if trial % 7 == 0:  # some rows on another device
            rows = [(a, b, n, d if k % 5 else 1, e) for k, (a, b, n, d, e) in enumerate(rows)]
        local, remote = pairs(rows)
        for cap in (1, 64, 4096, 8200, 65536 * 3, 1 << 40):
            check_join(local, remote, cap)


def test_coalesce_checks_its_arguments():
    local, remote = pairs([(0x1000, 0x9000, 256, 0, 0)])
    with pytest.raises(ferry.InvalidArgumentError, match="max_bytes=-1 is negative"):
        fn.coalesce(local, remote, -1)
    with pytest.raises(ferry.InvalidArgumentError, match="1 local descriptors but 2 remote"):
        fn.coalesce(local, remote + remote)
    buf = ferry.Pool().alloc(4096)
    for value, fragment in ((-1, "coalesce=-1 is negative"), ("2M", "coalesce='2M'")):
        with pytest.raises(ferry.InvalidArgumentError, match=fragment):
            fn.post(object(), "WRITE", fn.descs(buf), fn.descs(buf), "peer", coalesce=value)


# ---- with NIXL: the bytes that arrive ----------------------------------------------------

TRANSFER_SCRIPT = r"""
import random, numpy as np, ferry, ferry.nixl as fn
rng = random.Random(2025)
a, b = fn.agent("A", peers="local"), fn.agent("B", peers="local")
pa, pb = ferry.Pool(), ferry.Pool()
N = 3 << 20
src, dst = pa.alloc(N), pb.alloc(N)
ra, rb = fn.register_pool(a, pa), fn.register_pool(b, pb)
peer = fn.add_remote(a, b.get_agent_metadata())
data = np.frombuffer(np.random.default_rng(3).bytes(N), np.uint8)
s, d = np.frombuffer(src, np.uint8), np.frombuffer(dst, np.uint8)

def layout(count, size, kind):
    order = list(range(count))
    if kind == "shuffled":
        rng.shuffle(order)
    elif kind == "runs":  # runs of consecutive slots, runs in random order
        cuts = sorted(rng.sample(range(1, count), min(count - 1, count // 4)))
        runs = [order[i:j] for i, j in zip([0] + cuts, cuts + [count])]
        rng.shuffle(runs)
        order = [k for r in runs for k in r]
    gap = size + (7 if kind == "gaps" else 0)
    return [k * gap for k in range(count)], [order[k] * gap for k in range(count)]

checked = 0
for trial in range(24):
    size = rng.choice((4099, 65536, 12345, 1 << 20 if trial % 6 == 0 else 777))
    kind = ("adjacent", "shuffled", "runs", "gaps")[trial % 4]
    count = min((N // (size + 7)) - 1, rng.randint(2, 200))
    local_off, remote_off = layout(count, size, kind)
    for op in ("WRITE", "READ"):
        for cap in (True, False, 3 * size - 1):
            if op == "WRITE":
                s[:] = data; d[:] = 0xA5
                mine, theirs, base_l, base_r = src, dst, src.ptr, dst.ptr
            else:  # A pulls B's bytes into its own buffer
                d[:] = data; s[:] = 0xA5
                base_l, base_r = src.ptr, dst.ptr
            local = fn.blocks([base_l + o for o in local_off], size, mem_type="DRAM")
            remote = fn.blocks([base_r + o for o in remote_off], size, mem_type="DRAM")
            with fn.transfer(a, op, local, remote, peer, timeout=60, coalesce=cap) as t:
                joined = len(fn.coalesce(local, remote, fn.COALESCE_BYTES if cap is True else int(cap))[0])
                assert t.posted == (count if cap is False else joined), (t.posted, count, joined, cap)
            got, want = (d, s) if op == "WRITE" else (s, d)
            expect = np.full(N, 0xA5, np.uint8)
            for lo, ro in zip(local_off, remote_off):
                if op == "WRITE":
                    expect[ro:ro + size] = data[lo:lo + size]
                else:
                    expect[lo:lo + size] = data[ro:ro + size]
            assert np.array_equal(got, expect), (trial, op, kind, size, cap)
            checked += 1
    if kind == "adjacent" and count > 2:
        assert joined < count

# Joined rows that would span two registrations: the rows go as given, the data arrives.
half = 1 << 20
p2 = ferry.Pool()
two = p2.alloc(2 * half)
r1 = fn.register(b, fn.blocks([two.ptr], half, mem_type="DRAM"))
r2 = fn.register(b, fn.blocks([two.ptr + half], half, mem_type="DRAM"))
peer = fn.add_remote(a, b.get_agent_metadata())
t2 = np.frombuffer(two, np.uint8)
t2[:] = 0xA5; s[:] = data
blk = 65536
n = 2 * half // blk
local = fn.blocks([src.ptr + k * blk for k in range(n)], blk, mem_type="DRAM")
remote = fn.blocks([two.ptr + k * blk for k in range(n)], blk, mem_type="DRAM")
with fn.write(a, local, remote, peer, timeout=60) as t:
    assert t.posted == n, t.posted
assert np.array_equal(t2, data[:2 * half])
# the local side in two registrations (agent B pushes from `two` into A's pool)
peer_a = fn.add_remote(b, a.get_agent_metadata())
s[:] = 0xA5
with fn.write(b, remote, local, peer_a, timeout=60) as t:
    assert t.posted == n, t.posted
assert np.array_equal(s[:2 * half], data[:2 * half])
# within one registration the same rows join
with fn.write(a, local, fn.blocks([dst.ptr + k * blk for k in range(n)], blk, mem_type="DRAM"),
              "B", timeout=60) as t:
    assert t.posted == 2 * half // fn.COALESCE_BYTES, t.posted
print("ok", checked)
"""


def test_transfers_with_and_without_coalescing_deliver_the_same_bytes():
    if not fn.available():
        pytest.skip(f"NIXL is not installed: {fn.unavailable_reason()}")
    r = subprocess.run([sys.executable, "-c", TRANSFER_SCRIPT], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NIXL_LOG_LEVEL": "FATAL"})
    if r.returncode != 0 and "NIXL_ERR_BACKEND" in r.stderr:
        pytest.skip(f"NIXL's UCX backend does not start here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0 and r.stdout.strip().startswith("ok"), r.stdout + r.stderr[-4000:]
