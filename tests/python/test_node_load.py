"""Read once per node (ferry.torch.node_load, load_safetensors(node=)).

CPU: real processes (multiprocessing spawn) share one NodePool and read one
random file of an odd size; each sees every byte of the file, and the kernel's
count of bytes each read (/proc/self/io rchar) is its part, not the file. A
block that lands on an earlier block's stale bytes still works (its signal
words are zeroed before any rank uses them). A rank that never comes, ranks
that disagree, a rank given twice and bad arguments are clear errors.
GPU (skipped without a device): two ranks load a real safetensors file with
node= and get tensors bit-equal to load_safetensors without it.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import pytest
from rank_processes import spawn

from ferry.errors import InvalidArgumentError
from ferry.node import NodePool
from ferry.torch import node_load
from ferry.torch.node_load import HEADER_BYTES, NodeLoadTimeout, open_file_once, read_file_once

SIZE = (10 << 20) + 12345


def _name(what: str) -> str:
    return f"nl{os.getpid()}-{what}-{random.randrange(1 << 30)}"


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _rank(name, path, rank, ranks, loads, timeout, conn):
    """One rank: attach, read the file `loads` times; send back per load
    (sha256 of the block's file bytes, stats, rchar delta) or the error."""
    out = []
    try:
        pool = NodePool(name, label=f"rank {rank}")
        for _ in range(loads):
            before = _rchar()
            nf = read_file_once(pool, path, rank, ranks, timeout=timeout)
            delta = _rchar() - before
            try:
                out.append((hashlib.sha256(nf.view()).hexdigest(), nf.stats, delta))
            finally:
                nf.release()
    except Exception as e:  # noqa: BLE001 - sent back to the test
        out.append(f"{type(e).__name__}: {e}")
    conn.send(out)
    conn.close()


_spawn = spawn


def _ranks(name, path, ranks, loads=1, rank_of=None, ranks_of=None, timeout=60):
    return _spawn(_rank, [(name, path, rank_of(r) if rank_of else r, ranks_of(r) if ranks_of else ranks, loads,
                           timeout) for r in range(ranks)])


@pytest.fixture
def random_file(tmp_path):
    data = random.Random(33).randbytes(SIZE)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return str(path), hashlib.sha256(data).hexdigest()


def _capacity(size: int, granule: int = 64 << 10) -> int:
    """Room for one file's block and its marker, nothing more."""
    return (HEADER_BYTES + size + granule - 1) // granule * granule + granule


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_each_rank_reads_its_part_and_sees_the_whole_file(random_file, ranks):
    path, sha = random_file
    name = _name("parts")
    with NodePool(name, 2 * _capacity(SIZE), label="test"):
        outs = _ranks(name, path, ranks, loads=2)  # twice: a second load of the same file starts anew
    for r, out in enumerate(outs):
        assert len(out) == 2 and not isinstance(out[0], str) and not isinstance(out[1], str), out
    for load in range(2):
        got = [out[load] for out in outs]
        assert all(g[0] == sha for g in got)  # every rank sees the file's bytes
        parts = sorted(g[1]["part"] for g in got)
        assert parts[0][0] == 0 and parts[-1][1] == SIZE
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, no overlap
        assert sum(g[1]["bytes_read"] for g in got) == SIZE
        assert sum(g[1]["made_block"] for g in got) == 1
        for g in got:  # the kernel's count: this rank read its part, not the file
            lo, hi = g[1]["part"]
            assert hi - lo <= g[2] <= hi - lo + (256 << 10), (g[1], g[2])
            assert hi - lo < SIZE


def _piece_rank(name, path, rank, ranks, conn):
    """One rank taking pieces as they come: per piece (lo, hi, sha256 of its bytes
    in the block at that moment), then finish()'s stats."""
    try:
        pool = NodePool(name, label=f"rank {rank}")
        nf = open_file_once(pool, path, rank, ranks, timeout=60)
        try:
            got = [(lo, hi, hashlib.sha256(nf.view()[lo:hi]).hexdigest()) for lo, hi in nf.pieces()]
            nf.finish()
            conn.send((got, nf.stats))
        finally:
            nf.release()
    except Exception as e:  # noqa: BLE001 - sent back to the test
        conn.send(f"{type(e).__name__}: {e}")
    conn.close()


def test_pieces_come_in_file_order_each_whole_when_given(tmp_path):
    """A file of three pieces read by three ranks: each piece a rank is given
    already holds the file's bytes (read by whichever ranks), in file order."""
    size = 2 * node_load.MIN_PIECE + 12345
    data = random.Random(8).randbytes(size)
    path = tmp_path / "three-pieces.bin"
    path.write_bytes(data)
    step = node_load.piece_bytes(size)
    want = [(lo, min(lo + step, size), hashlib.sha256(data[lo:lo + step]).hexdigest()) for lo in range(0, size, step)]
    assert len(want) == 3
    name = _name("pieces")
    with NodePool(name, _capacity(size), label="test") as pool:
        outs = _spawn(_piece_rank, [(name, str(path), r, 3) for r in range(3)])
        assert pool.stats()["used"] == 0
    for out in outs:
        assert not isinstance(out, str), outs
        got, stats = out
        assert got == want
        assert stats["read_seconds"] is not None and stats["wait_seconds"] is not None


def test_piece_lengths_bound_the_words():
    assert node_load.piece_bytes(1) == node_load.MIN_PIECE
    for big in (node_load.MAX_PIECES * node_load.MIN_PIECE + 1, 1 << 40):  # just over the minimum; 1 TiB
        step = node_load.piece_bytes(big)
        assert step % (2 << 20) == 0 and -(-big // step) <= node_load.MAX_PIECES and step < (1 << 32)
    assert node_load.piece_bytes(3 << 40) >= 1 << 32  # refused by open_file_once: a word counts 32 bits


def test_a_block_on_stale_bytes_works(random_file):
    """The pool hands out blocks with whatever bytes were there: an earlier block's
    0xFF in the signal words must not count as ranks that arrived."""
    path, sha = random_file
    name = _name("stale")
    with NodePool(name, _capacity(SIZE), label="test") as pool:
        junk = pool.alloc(pool.capacity)
        junk.view()[:] = b"\xff" * pool.capacity
        pool.free(junk)
        outs = _ranks(name, path, 2)
        assert [out[0][0] for out in outs] == [sha, sha], outs


def test_one_rank_alone_reads_everything(random_file):
    path, sha = random_file
    with NodePool(_name("one"), _capacity(SIZE)) as pool:
        nf = read_file_once(pool, path, 0, 1, timeout=10)
        try:
            assert hashlib.sha256(nf.view()).hexdigest() == sha
            assert nf.stats["part"] == (0, SIZE) and nf.stats["made_block"]
        finally:
            nf.release()
        assert pool.stats()["used"] == 0  # block and marker freed


def test_a_rank_that_never_comes_times_out_clearly(random_file):
    path, _ = random_file
    with NodePool(_name("alone"), _capacity(SIZE)) as pool:
        with pytest.raises(NodeLoadTimeout, match=r"1 of 2 ranks had read their part after 0.5 s") as e:
            read_file_once(pool, path, 1, 2, timeout=0.5)
        assert isinstance(e.value, TimeoutError)
        assert pool.stats()["used"] == 0  # nothing left held


def test_ranks_that_disagree_or_repeat_are_refused(random_file):
    path, sha = random_file
    name = _name("twice")
    with NodePool(name, 2 * _capacity(SIZE), label="test"):
        twice = _ranks(name, path, 2, rank_of=lambda r: 0, timeout=3)  # both say rank 0
        differ = _ranks(name, path, 2, ranks_of=lambda r: 2 + r, timeout=3)  # ranks=2 and ranks=3
    errors = sorted(o[0] for o in twice)
    assert errors[0].startswith("InvalidArgumentError") and "rank=0 is taken by another process" in errors[0], twice
    assert errors[1].startswith("NodeLoadTimeout") and "1 of 2 ranks had read their part" in errors[1], twice
    errors = sorted(o[0] for o in differ)
    assert all(isinstance(e, str) for e in errors), differ
    assert any("every rank must pass the same ranks" in e for e in errors), differ


def _call_bounded(call, fifo=None):
    """call() on a thread: (its error or result, whether it finished within 10 s).
    A call stuck in opening the FIFO is freed by opening its write end (then closed)."""
    out = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    stuck = t.is_alive()
    if stuck and fifo is not None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader gets EOF
        t.join(10)
    return out, not stuck


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
@pytest.mark.parametrize("verb", ["read_file_once", "open_file_once"])
def test_only_a_regular_file_is_read(tmp_path, kind, verb):
    """Issue 38 item 11: a FIFO blocked in os.open whatever the timeout, /dev/zero read as
    an empty file. Both are refused at once, as load_safetensors refuses them."""
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif kind == "directory":
        path = str(tmp_path)
    else:
        path = "/dev/zero"
    fn = read_file_once if verb == "read_file_once" else open_file_once
    with NodePool(_name("fifo"), 1 << 20) as pool:
        t0 = time.monotonic()
        out, finished = _call_bounded(lambda: fn(pool, path, 0, 1, timeout=2), path if kind == "fifo" else None)
        if "result" in out:
            out["result"].release()
        assert finished, f"{verb}({kind}) blocked (in os.open)"
        assert isinstance(out.get("error"), InvalidArgumentError), out
        assert str(out["error"]) == f"{path}: not a regular file"
        assert time.monotonic() - t0 < 2
        assert pool.stats()["used"] == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 2, "ranks": 2}, r"rank=2.*0-1"),
    ({"rank": 0, "ranks": 0}, r"ranks=0"),
    ({"rank": -1, "ranks": 2}, r"rank=-1"),
    ({"rank": "0", "ranks": 2}, r"rank='0'"),
])
def test_bad_rank_arguments(random_file, kwargs, match):
    path, _ = random_file
    with NodePool(_name("bad"), _capacity(SIZE)) as pool:
        with pytest.raises(InvalidArgumentError, match=match):
            read_file_once(pool, path, timeout=1, **kwargs)


def test_ranks_from_the_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(InvalidArgumentError, match=r"LOCAL_RANK is not set.*pass rank="):
        node_load.node_ranks(None, None)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert node_load.node_ranks(None, None) == (3, 4)
    assert node_load.node_ranks(1, None) == (1, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(InvalidArgumentError, match=r"LOCAL_WORLD_SIZE='four' is not an integer"):
        node_load.node_ranks(0, None)


def test_parts_cover_the_file_aligned():
    for size, ranks in [(0, 3), (1, 4), (SIZE, 3), ((1 << 30) + 7, 8)]:
        b = node_load.parts(size, ranks)
        assert b[0] == 0 and b[-1] == size and b == sorted(b) and len(b) == ranks + 1
        align = (2 << 20) if size >= ranks * (8 << 20) else 4096
        assert all(x % align == 0 for x in b[:-1])


# ---- load_safetensors(node=) ------------------------------------------------------------


def test_load_safetensors_refuses_bad_node_arguments(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    path = str(tmp_path / "none.safetensors")  # node arguments are checked first
    with pytest.raises(InvalidArgumentError, match=r"node='pool': expected a ferry.node.NodePool"):
        load_safetensors(path, node="pool", rank=0, ranks=1)
    with NodePool(_name("st"), 1 << 20) as pool:
        with pytest.raises(InvalidArgumentError, match=r"pass rank= .*and ranks="):
            load_safetensors(path, node=pool)
        with pytest.raises(InvalidArgumentError, match=r"ranks=0"):
            load_safetensors(path, node=pool, rank=0, ranks=0)
        with pytest.raises(InvalidArgumentError, match=r"rank=5"):
            load_safetensors(path, node=pool, rank=5, ranks=2)
        with pytest.raises(InvalidArgumentError, match=r"timeout=-1: out of range"):
            load_safetensors(path, node=pool, rank=0, ranks=1, timeout=-1)


def _gpu_rank(name, path, rank, ranks, conn):
    """A rank on GPU rank % count: load with and without node=; send back whether
    every tensor is bit-equal, or the error."""
    try:
        import torch

        from ferry.torch import load_safetensors

        dev = rank % torch.cuda.device_count()
        pool = NodePool(name, device=dev, label=f"rank {rank}")
        plain = load_safetensors(path, device=dev)
        shared = load_safetensors(path, device=dev, node=pool, rank=rank, ranks=ranks, timeout=120)
        half = load_safetensors(path, device=dev, node=pool, rank=rank, ranks=ranks, dtype=torch.float16,
                                keys=["w.big", "w.odd"])
        same = sorted(plain) == sorted(shared) and all(
            plain[k].dtype == shared[k].dtype and torch.equal(plain[k].view(torch.uint8), shared[k].view(torch.uint8))
            for k in plain)
        cast = all(torch.equal(half[k], plain[k].to(torch.float16)) for k in half)
        cols = plain["w.big"].shape[1]  # tensor parallel: this rank's columns of w.big, rows of w.int
        mine = (1, cols * rank // ranks, cols * (rank + 1) // ranks)
        rows = (0, 12345 * rank // ranks, 12345 * (rank + 1) // ranks)
        tp = load_safetensors(path, device=dev, node=pool, rank=rank, ranks=ranks, keys=["w.big", "w.int"],
                              slices={"w.big": mine, "w.int": rows})
        parts = torch.equal(tp["w.big"], plain["w.big"][:, mine[1]:mine[2]]) and torch.equal(
            tp["w.int"], plain["w.int"][rows[1]:rows[2]])
        routes = {r for r, _ in shared.routes.values()} | {r for r, _ in tp.routes.values()}
        conn.send((same, cast and parts, pool.stats()["registered_bytes"], routes))
    except Exception as e:  # noqa: BLE001 - sent back to the test
        conn.send(f"{type(e).__name__}: {e}")
    conn.close()


@pytest.mark.parametrize("route", ["pool", "alone", "auto"])
def test_two_ranks_load_bit_equal_to_a_plain_load(gpu, tmp_path, monkeypatch, route):
    """Each route of node loads (ferry.torch.node_plan): forced through the pool,
    forced alone, and chosen (the file was just written: in the page cache, so
    each rank alone)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("FERRY_NODE_PIN_PIECE", "4MiB")  # the ranks' pinned pieces: w.big crosses several
    monkeypatch.setenv("FERRY_NODE_LOAD", route)  # the spawned ranks read it
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(5)
    tensors = {
        "w.big": torch.randn(1031, 4099, generator=g),  # ~16.9 MB: crosses a 2 MiB part bound and pinned pieces
        "w.odd": torch.randn(7, 13, generator=g).to(torch.bfloat16),
        "w.int": torch.randint(-9, 9, (12345,), generator=g, dtype=torch.int32),
        "w.u8": torch.randint(0, 255, (3, 5, 7), generator=g, dtype=torch.uint8),
        "w.empty": torch.empty(0, 4),
    }
    path = str(tmp_path / "model.safetensors")
    st.save_file(tensors, path)
    name = _name("gpu")
    with NodePool(name, 256 << 20, label="test"):
        outs = _spawn(_gpu_rank, [(name, path, r, 2) for r in range(2)], wait=300)
    for out in outs:
        assert not isinstance(out, str), outs
        same, cast, registered, routes = out
        assert same and cast, outs
        assert routes == {"alone" if route == "auto" else route}, outs
        if route == "pool":
            assert registered > 0  # the pool was pinned for the rank's GPU


def test_piece_items_cover_every_item_once_in_order():
    rng = random.Random(21)
    for _ in range(200):
        size = rng.randrange(1, 5000)
        items, at = [], 0
        while True:  # non-overlapping items with gaps, as a safetensors file's tensors
            at += rng.randrange(0, 40)
            n = rng.randrange(1, 300)
            if at + n > size:
                break
            items.append((at, n, 10**9 + at * 7))
            at += n
        step = rng.randrange(1, 700)
        seen, start = {}, 0
        for lo in range(0, size, step):
            hi = min(lo + step, size)
            offsets, sizes, addresses, start = node_load.piece_items(items, lo, hi, start)
            for o, n, a in zip(offsets, sizes, addresses):
                assert lo <= o and o + n <= hi and n > 0
                seen.setdefault(o, []).append((n, a))
        got = sorted((o, n, a) for o, v in seen.items() for n, a in v)
        # stitched back: each item's bytes exactly once, each part at its own place on the device
        for off, n, dst in items:
            parts = [(o, k, a) for o, k, a in got if off <= o < off + n]
            assert sum(k for _, k, _ in parts) == n
            assert all(a == dst + (o - off) for o, _, a in parts)
        assert sum(k for _, k, _ in got) == sum(n for _, n, _ in items)
