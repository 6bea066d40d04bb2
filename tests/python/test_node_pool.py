"""ferry.node.NodePool from Python: real processes (multiprocessing spawn) share one
pool; the budget counts all; a rank killed with SIGKILL loses only its own blocks;
signal words cross processes; on a GPU, each process pins what it touches and copies
to and from the shared bytes bit-exactly."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal

import numpy as np
import pytest

from ferry.errors import InvalidArgumentError, NotSupportedError, OutOfMemoryError
from ferry.node import NodePool


def _name(what: str) -> str:
    return f"py{os.getpid()}-{what}-{random.randrange(1 << 30)}"


def _member(name, todo, conn):
    """A rank: attach, do `todo` (a list of (verb, args)), send back what each gave."""
    pool = NodePool(name, label=f"rank-{os.getpid()}")
    out = []
    for verb, args in todo:
        try:
            if verb == "alloc":
                nbytes, seed = args
                b = pool.alloc(nbytes)
                b.view()[:nbytes] = random.Random(seed).randbytes(nbytes)
                out.append(b.handle)
            elif verb == "check":
                handle, nbytes, seed = args
                out.append(bytes(pool.block(handle).view()[:nbytes]) == random.Random(seed).randbytes(nbytes))
            elif verb == "named":
                b = pool.named(*args)
                out.append((b.handle, b.created))
            elif verb == "add":
                handle, index = args
                out.append(pool.add(pool.block(handle), index))
            elif verb == "wait":
                handle, index, value, timeout = args
                out.append(pool.wait(pool.block(handle), index, value, timeout))
            elif verb == "take":
                pool.take(args)
                out.append(True)
            elif verb == "hang":
                conn.send(out)
                signal.pause()
        except Exception as e:  # noqa: BLE001 - sent back to the test
            out.append(f"{type(e).__name__}: {e}")
    conn.send(out)
    conn.close()


def _run(name, todo, wait=True):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_member, args=(name, todo, child))
    p.start()
    if not wait:
        return p, parent
    out = parent.recv()
    p.join(30)
    return out


def test_ranks_share_bytes_and_the_budget():
    name = _name("share")
    with NodePool(name, 8 << 20, label="parent") as pool:
        mine = pool.alloc(3 * 65536 + 5)
        data = random.Random(9).randbytes(3 * 65536 + 5)
        mine.view()[: len(data)] = data
        out = _run(name, [("check", (mine.handle, len(data), 9)), ("alloc", (1_000_003, 7)),
                          ("named", ("table", 12345)), ("alloc", (7 << 20, 1))])
        assert out[0] is True  # the child read our bytes
        theirs, (named, created), too_much = out[1], out[2], out[3]
        assert created is True
        assert "OutOfMemoryError" in too_much and "parent" in too_much and "rank-" in too_much
        # the child exited: its unnamed block went with it; it was the named block's only holder
        assert pool.stats()["used"] == mine.nbytes
        with pytest.raises(InvalidArgumentError):
            pool.block(theirs)
        assert bytes(mine.view()[: len(data)]) == data
        del named


def test_a_child_reads_what_the_parent_wrote():
    name = _name("read")
    with NodePool(name, 4 << 20) as pool:
        b = pool.alloc(777_777)
        b.view()[:777_777] = random.Random(3).randbytes(777_777)
        assert _run(name, [("check", (b.handle, 777_777, 3)), ("check", (b.handle, 777_777, 4))]) == [True, False]


def test_a_rank_killed_with_sigkill_loses_only_its_blocks():
    name = _name("kill")
    with NodePool(name, 16 << 20) as pool:
        mine = pool.alloc(4 << 20)
        mine.view()[:] = random.Random(1).randbytes(mine.nbytes)
        p, conn = _run(name, [("alloc", (8 << 20, 2)), ("alloc", (65536, 3)), ("hang", None)], wait=False)
        dead_big, handed = conn.recv()
        pool.take(handed)  # we keep what the doomed rank made
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert pool.reclaim_dead() == 8 << 20
        assert bytes(pool.block(handed).view()) == random.Random(3).randbytes(65536)
        assert bytes(mine.view()) == random.Random(1).randbytes(mine.nbytes)
        with pytest.raises(InvalidArgumentError):
            pool.block(dead_big)
        assert [m["this_process"] for m in pool.stats()["members"]] == [True]


def test_signal_words_cross_processes_and_time_out():
    name = _name("words")
    with NodePool(name, 1 << 20) as pool:
        flags = pool.alloc(4096)
        p, conn = _run(name, [("wait", (flags.handle, 3, 2, 20.0))], wait=False)
        pool.add(flags, 3)
        pool.add(flags, 3)
        assert conn.recv() == [True]
        p.join(30)
        assert pool.value(flags, 3) == 2
        assert pool.wait(flags, 3, 3, timeout=0.05) is False
        with pytest.raises(InvalidArgumentError):
            pool.add(flags, flags.nbytes // 4)  # past the block's words


def test_bad_arguments_are_ferry_errors():
    with pytest.raises(InvalidArgumentError):
        NodePool("no spaces", 1 << 20)
    with pytest.raises(InvalidArgumentError):
        NodePool(_name("nocap"))  # nobody serves it and no capacity
    with pytest.raises(InvalidArgumentError):
        NodePool(_name("x"), -1)
    with pytest.raises(InvalidArgumentError):
        NodePool(_name("x"), 1 << 20, device="cuda")
    with pytest.raises(InvalidArgumentError, match="huge_pages='huge'"):
        NodePool(_name("x"), 1 << 20, huge_pages="huge")
    with NodePool(_name("bad"), 1 << 20) as pool:
        with pytest.raises(OutOfMemoryError, match="Held: pid"):
            pool.alloc(2 << 20)
        with pytest.raises(InvalidArgumentError):
            pool.named(5, 10)
        with pytest.raises(InvalidArgumentError):
            pool.block("0")
        with pytest.raises(InvalidArgumentError, match="pin_all: this NodePool was opened without device="):
            pool.pin_all()
        b = pool.alloc(1)
        pool.free(b)
        with pytest.raises(InvalidArgumentError, match="no live block"):
            pool.free(b)
        assert pool.stats()["used"] == 0


def test_the_pages_come_as_asked_and_stats_say_which():
    with NodePool(_name("off"), 4 << 20, huge_pages="off") as pool:
        s = pool.stats()
        assert s["page_bytes"] == 4096 and s["piece_bytes"] == 0  # no device: nothing pinned
        b = pool.alloc(3 << 20)
        data = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8)
        np.frombuffer(b.view(), np.uint8)[:] = data
        assert np.array_equal(np.frombuffer(b.view(), np.uint8), data)
    with NodePool(_name("auto"), 4 << 20) as pool:  # hugetlb only where enough pages are free: either works
        assert pool.stats()["page_bytes"] in (4096, 2 << 20)


def test_a_view_outlives_close_and_calls_after_close_are_ferry_errors():
    name = _name("close")
    pool = NodePool(name, 1 << 20)
    b = pool.alloc(70_000)
    v = b.view()
    data = random.Random(5).randbytes(70_000)
    v[:70_000] = data
    pool.close()
    assert bytes(v[:70_000]) == data  # still mapped: the view holds this process's mapping
    for call in (lambda: pool.alloc(1), lambda: pool.stats(), lambda: b.view(), lambda: pool.ready(b),
                 lambda: pool.add(b, 0), lambda: pool.name):
        with pytest.raises(InvalidArgumentError, match="closed"):
            call()
    del v
    again = NodePool(name, 1 << 20)  # this process's last reference is gone: a fresh pool
    assert again.stats()["created_here"] and again.stats()["used"] == 0
    again.close()


def test_an_open_pool_holds_one_idle_thread_and_two_fds_and_close_gives_them_back():
    name = _name("holds")

    def held():
        threads = 0
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    threads += f.read().strip() == "ferry-node"
            except OSError:
                pass  # a thread that ended meanwhile
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return threads, sum(f"memfd:ferry-node:{name}" in link for link in links), sum(
            link.startswith("socket:") for link in links)

    threads, memfds, sockets = held()
    pool = NodePool(name, 8 << 20)
    b = pool.alloc(4 << 20)
    b.view()[:] = bytes(b.nbytes)  # touched: the pages exist
    assert held() == (threads + 1, 1, sockets + 1)  # the server thread, the memfd, the listening socket
    pool.close()
    assert held() == (threads, memfds, sockets)


def test_a_forked_child_gets_a_clear_refusal():
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    pool = NodePool(_name("fork"), 1 << 20)
    b = pool.alloc(100)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            pool.alloc(10)
            os.write(w, b"no error")
        except NotSupportedError as e:
            os.write(w, b"ok" if "fork" in str(e) else str(e).encode())
        except BaseException as e:  # noqa: BLE001
            os.write(w, repr(e).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 4096) == b"ok"
    assert pool.stats()["used"] == b.nbytes
    pool.close()


def _gpu_member(name, device, handle, nbytes, conn):
    import torch
    import ferry

    pool = NodePool(name, device=device)
    b = pool.block(handle)
    pool.wait_ready(b)
    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    ferry.copy(src, b.address, nbytes)  # h2d from the shared bytes
    dst = pool.alloc(nbytes)
    pool.wait_ready(dst)
    ferry.copy(dst.address, src, nbytes)  # d2h into a block of ours
    conn.send((dst.handle, pool.stats()["registered_bytes"]))
    conn.recv()  # keep the block alive until the parent has read it
    conn.close()


def test_two_processes_pin_and_copy_through_the_pool(gpu, monkeypatch):
    import torch

    devices = torch.cuda.device_count()
    name = _name("gpu")
    monkeypatch.setenv("FERRY_NODE_PIN_PIECE", "64MiB")  # the child's pieces: its copies cross one's end
    nbytes = (96 << 20) + 12345  # over a 64 MiB piece boundary
    with NodePool(name, 512 << 20, device=0) as pool:
        src = pool.alloc(nbytes)
        data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        src.view()[:nbytes] = data.numpy().tobytes()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_gpu_member, args=(name, 1 % devices, src.handle, nbytes, child))
        p.start()
        handle, registered = parent.recv()
        back = pool.block(handle)
        assert bytes(back.view()[:nbytes]) == bytes(src.view()[:nbytes])
        assert registered < pool.capacity  # the other rank pinned only what it touched
        pool.wait_ready(back)
        gpu_copy = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0").fill_(7)
        import ferry

        ferry.copy(gpu_copy, back.address, nbytes)
        assert torch.equal(gpu_copy.cpu(), data)
        pool.pin_all()  # the rest of the pool, in the background
        pool.wait_ready()
        assert pool.stats()["registered_bytes"] == pool.capacity
        parent.send(True)
        p.join(60)
        assert p.exitcode == 0
