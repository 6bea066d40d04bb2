"""fork() and interpreter exit, each case in its own process (gdrcopy_sanity style):
a pool inherited by a forked child refuses with NotSupportedError and the child exits
cleanly; a pool the child makes works; the parent is unaffected; exiting while daemon
threads are inside ferry calls never aborts. Before: 8 of 10 children of a pool with
a background thread hung, a child that made its own pool died of SIGABRT, and exit
with daemon threads aborted ("terminate called without an active exception")."""

import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 120


def run(code: str):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    return r.returncode, r.stdout, r.stderr


# Each case forks 10 children; the parent checks every child's status and that its
# own pool still works. The script prints "parent ok" at the very end.
FORK_CASES = {
    # The reproducer, as a loop: a pool with a releaser and a live buffer.
    "child_exits_with_inherited_pool": """
        import ferry, os, sys
        p = ferry.Pool(release_delay_ms=50); b = p.alloc(100)
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
    """,
    # The child uses the inherited pool: refused, clearly; frees are harmless.
    "child_is_refused_clearly": """
        import ferry, os, sys
        p = ferry.Pool(release_delay_ms=50, target_bytes=8 << 20, chunk_bytes=2 << 20)
        b = p.alloc(3 << 20); memoryview(b)[:4] = b"abcd"
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                code = 0
                for call in (lambda: p.alloc(10), p.trim, p.stats, p.wait_ready):
                    try:
                        call()
                        code = 3
                    except ferry.NotSupportedError as e:
                        if "fork" not in str(e):
                            code = 4
                if bytes(memoryview(b)[:4]) != b"abcd":
                    code = 5
                b.release()   # a no-op in the child
                os._exit(code) if code else sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
        assert bytes(memoryview(b)[:4]) == b"abcd"
    """,
    # The child makes a pool of its own (this died of SIGABRT) and exits.
    "child_makes_its_own_pool": """
        import ferry, os, sys
        p = ferry.Pool(release_delay_ms=50); b = p.alloc(100)
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                q = ferry.Pool(release_delay_ms=20, chunk_bytes=2 << 20)
                data = os.urandom(3 << 20)
                c = q.alloc(len(data)); memoryview(c)[:] = data
                assert bytes(memoryview(c)) == data
                c.release(); q.trim()
                sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
    """,
    # Threads inside the pool at the moment of the fork.
    "fork_while_threads_allocate": """
        import ferry, os, sys, threading
        p = ferry.Pool(release_delay_ms=1, chunk_bytes=2 << 20)
        stop = False
        def loop():
            while not stop:
                p.alloc(3 << 20).release(); p.trim()
        threads = [threading.Thread(target=loop) for _ in range(3)]
        for t in threads: t.start()
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                try:
                    p.alloc(10)
                    os._exit(3)
                except ferry.NotSupportedError:
                    pass
                ferry.Pool(chunk_bytes=2 << 20).alloc(100).release()
                sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
        stop = True
        for t in threads: t.join()
        s = p.stats()
        assert s["allocations"] == s["frees"], s
    """,
}


@pytest.mark.parametrize("name", sorted(FORK_CASES))
def test_fork(name):
    code = textwrap.dedent(FORK_CASES[name]) + "p.alloc(5000).release()\nprint('parent ok')\n"
    rc, out, err = run(code)
    assert rc == 0 and out.strip().endswith("parent ok"), out + err
    assert "terminate called" not in err and "Traceback" not in err, err


def test_multiprocessing_fork_context_children_use_their_own_pools():
    rc, out, err = run("""
        import multiprocessing as mp, ferry
        def work(n):
            pool = ferry.Pool(chunk_bytes=2 << 20)
            b = pool.alloc(n); memoryview(b)[:] = bytes([n % 251]) * n
            return sum(memoryview(b)) == (n % 251) * n
        if __name__ == "__main__":
            keep = ferry.Pool(release_delay_ms=10).alloc(1000)
            with mp.get_context("fork").Pool(3) as workers:
                assert all(workers.map(work, [1000, 5000, 3 << 20, 7]))
            print("ok")
    """)
    assert rc == 0 and out.strip() == "ok", out + err


EXIT_WITH_DAEMONS = """
    import threading, time, ferry
    p = ferry.Pool(release_delay_ms=1, chunk_bytes=2 << 20)
    def loop():
        while True:
            b = p.alloc(3 << 20); b.release(); p.trim()
    for _ in range(4):
        threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.5)
"""


@pytest.mark.parametrize("run_index", range(5))
def test_exit_while_daemon_threads_are_inside_ferry_calls(run_index):
    rc, out, err = run(EXIT_WITH_DAEMONS)
    assert rc == 0, f"exit status {rc}: {err}"
    assert "terminate called" not in err and "leaked" not in err, err


def test_sys_exit_from_main_with_daemon_threads_copying_buffers():
    rc, out, err = run("""
        import sys, threading, ferry
        p = ferry.Pool(chunk_bytes=2 << 20, target_bytes=4 << 20)
        started = threading.Barrier(3)
        def loop():
            started.wait()
            while True:
                b = p.alloc(1 << 20); memoryview(b)[:] = bytes(1 << 20); p.stats(); b.release()
        for _ in range(2):
            threading.Thread(target=loop, daemon=True).start()
        started.wait()
        sys.exit(7)
    """)
    assert rc == 7, err
    assert "terminate called" not in err, err


# A save (AtomicFile.save: src/load/save_file.h) runs in C++ with the GIL
# released and touches no Python object until it returns: daemon threads still
# inside one when the interpreter exits must not abort it. PyTorch is left out:
# its own calls drop and retake the GIL under C++ frames and abort the same way
# at exit (seen in 1 of 20 runs), which is not ferry's to fix.
SAVE_AT_EXIT = """
    import os, threading, time
    from ferry import _ferry, temp_names
    from ferry.pool import Pool
    SLOT = 1 << 20
    src = bytearray(os.urandom(4 << 20))
    pool = Pool()
    address = pool.alloc(len(src)).ptr  # freed with the pool, at exit
    def loop(k):
        path = "{dir}/f%d" % k
        while True:
            f = _ferry.AtomicFile(path, temp_names.temp_path(path), True, False)
            f.save(b"h" * 4096, [(address + 1, (4 << 20) - 1, -1)] * 6, pool._native, [], SLOT, 4, 2, [path])
            f.publish(False)
    for k in range(3):
        threading.Thread(target=loop, args=(k,), daemon=True).start()
    time.sleep(0.5)
"""


@pytest.mark.parametrize("run_index", range(5))
def test_exit_while_daemon_threads_are_in_the_write_pipeline(run_index, tmp_path):
    """Exiting while daemon threads are inside a save (C++, the GIL released,
    no Python touched until it returns) ends cleanly: gil.h's exit rule."""
    rc, out, err = run(SAVE_AT_EXIT.replace("{dir}", str(tmp_path)))
    assert rc == 0, f"exit status {rc}: {err}"
    assert "terminate called" not in err and "Fatal Python error" not in err, err
