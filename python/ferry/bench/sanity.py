"""`ferry bench sanity`: a named list of functional checks, like gdrcopy_sanity.

Each check prints Passed, Failed (with the reason) or Waived (the machine cannot
run it: no GPU, no gdrdrv, ...), then one total line. Exit status 1 if any
check failed. Every check uses random data and a poisoned destination.
"""

from __future__ import annotations

import os
import sys
import traceback

from ..units import MiB
from .records import Records
from .report import write_json
from .suite import Suite, Waived, add_repeats


def _need_gpu():
    from .. import _ferry, measure

    why = measure.gpu_absent_reason(_ferry.cuda_info())
    if why is not None:
        raise Waived(why)


def check_pool_recycles_exact_sizes():
    import ferry

    pool = ferry.Pool(chunk_bytes=8 * MiB)
    data = os.urandom(3 * MiB + 7)
    a = pool.alloc(len(data))
    memoryview(a)[:] = data
    assert bytes(memoryview(a)) == data
    ptr = a.ptr
    a.release()
    b = pool.alloc(len(data), zero=True)
    assert b.ptr == ptr and bytes(memoryview(b)[:64]) == bytes(64), "recycled and zeroed"
    assert pool.stats()["recycles"] == 1


def check_buffer_release_twice_frees_once():
    import ferry

    pool = ferry.Pool(chunk_bytes=4 * MiB)
    b = pool.alloc(100)
    b.release()
    b.release()  # a released Buffer frees nothing again (the C API reports double frees)
    assert pool.stats()["frees"] == 1


def check_pinned_pool_is_pinned():
    _need_gpu()
    import ferry

    pool = ferry.PinnedPool(device=0, chunk_bytes=16 * MiB, target_bytes=16 * MiB)
    pool.wait_ready()
    assert pool.alloc(MiB).pinned and pool.stats()["register_seconds"] > 0


def _round_trip(n, strategy):
    import ferry
    from .. import _ferry

    dev = _ferry.cuda_malloc(n + 64)
    try:
        src = bytearray(os.urandom(n))
        back = bytearray(b"\xee" * n)
        ferry.copy(dev + 3, src, strategy=strategy)
        ferry.copy(back, dev + 3, n, strategy=strategy)
        assert back == src, f"{strategy}: data differs"
    finally:
        _ferry.cuda_free(dev)


def check_copy_staged():
    _need_gpu()
    _round_trip(37 * MiB + 5, "staged")


def check_copy_pin_in_place():
    _need_gpu()
    _round_trip(70 * MiB + 1, "pin-in-place")


def check_copy_hybrid():
    _need_gpu()
    _round_trip(70 * MiB + 3, "hybrid")


def check_copy_small_cuda_path():
    _need_gpu()
    _round_trip(4099, None)


def check_channel_write_read():
    _need_gpu()
    from .. import _ferry
    from ..channel import Channel

    dev = _ferry.cuda_malloc(1 << 17)
    try:
        with Channel(device=0) as ch:
            for n in (1, 4, 4097, 65536):
                data = os.urandom(n)
                ch.write(dev + 5, data)
                assert ch.read(dev + 5, n) == data, f"{n} bytes"
    finally:
        _ferry.cuda_free(dev)


def check_channel_refuses_large_payloads():
    _need_gpu()
    from .. import _ferry
    from ..channel import Channel
    from ..errors import InvalidArgumentError

    dev = _ferry.cuda_malloc(1 << 18)
    try:
        with Channel(device=0) as ch:
            try:
                ch.write(dev, bytes(65537))
            except InvalidArgumentError as e:
                assert "copy" in str(e), str(e)
            else:
                raise AssertionError("a 65537-byte request was accepted")
    finally:
        _ferry.cuda_free(dev)


def check_gdrcopy_backend():
    from ..channel import gdrcopy_status

    available, reason = gdrcopy_status()
    if not available:
        raise Waived(reason)


def check_fault_injection_leaves_pool_usable():
    import ferry

    pool = ferry.Pool(chunk_bytes=4 * MiB)
    ferry.set_fault_injection("mmap:0")
    try:
        pool.alloc(MiB)
    except ferry.FerryError:
        pass
    else:
        raise AssertionError("the injected mmap failure did not surface")
    finally:
        ferry.set_fault_injection("")
    pool.alloc(MiB).release()


# ---- fork and exit: each case runs in a fresh interpreter, so that a hang or an
# abort is reported here instead of taking the sanity run with it.

def _child_script(code: str, timeout: float = 120.0) -> str:
    """Runs `code` in a new Python process; its stdout, or AssertionError with the why."""
    import subprocess
    import textwrap

    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung: no exit within {timeout:.0f} s") from None
    tail = (r.stderr or "").strip().splitlines()[-3:]
    if r.returncode != 0 or "terminate called" in r.stderr:
        raise AssertionError(f"exit status {r.returncode}: {' | '.join(tail)}")
    return r.stdout


# Forks 5 children that call `use` on objects made before the fork; each must get
# NotSupportedError naming fork() and exit cleanly (sys.exit: destructors run).
_FORK_TEMPLATE = """
import os, sys, ferry
{setup}
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        try:
            {use}
            code = 3
        except ferry.NotSupportedError as e:
            code = 0 if "fork" in str(e) else 4
        except BaseException:
            code = 5
        sys.exit(code)
    status = os.waitpid(pid, 0)[1]
    assert status == 0, f"child status {{status}}"
{after}
print("ok")
"""


def _fork_case(setup: str, use: str, after: str) -> None:
    out = _child_script(_FORK_TEMPLATE.format(setup=setup, use=use, after=after))
    assert out.strip().endswith("ok"), out


def check_fork_child_refuses_inherited_pool():
    _fork_case("p = ferry.Pool(release_delay_ms=50, chunk_bytes=2 << 20); b = p.alloc(3 << 20)",
               "p.alloc(100)", "p.alloc(100).release()")


def check_fork_child_makes_its_own_pool():
    out = _child_script("""
        import os, sys, ferry
        p = ferry.Pool(release_delay_ms=50); b = p.alloc(100)
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                q = ferry.Pool(release_delay_ms=20, chunk_bytes=2 << 20)
                data = os.urandom(3 << 20); c = q.alloc(len(data)); memoryview(c)[:] = data
                sys.exit(0 if bytes(memoryview(c)) == data else 3)
            assert os.waitpid(pid, 0)[1] == 0
        print("ok")
    """)
    assert out.strip() == "ok", out


def check_exit_with_daemon_threads_in_pool_calls():
    _child_script("""
        import threading, time, ferry
        p = ferry.Pool(release_delay_ms=1, chunk_bytes=2 << 20)
        def loop():
            while True:
                p.alloc(3 << 20).release(); p.trim()
        for _ in range(4):
            threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.5)
    """)


def check_fork_child_refuses_inherited_pinned_pool():
    _need_gpu()
    _fork_case("p = ferry.PinnedPool(device=0, chunk_bytes=16 << 20); b = p.alloc(1 << 20)",
               "p.alloc(100)", "assert p.alloc(4096).pinned")


_GPU_BUFFERS = """
from ferry import _ferry
n = 8 << 20
dev = _ferry.cuda_malloc(n)
src = bytearray(os.urandom(n))
"""


def check_fork_child_refuses_inherited_engine():
    _need_gpu()
    # device=0: the engine refuses before any CUDA call (an int address alone
    # would first be looked up in the driver, which CUDA does not allow after fork).
    _fork_case(_GPU_BUFFERS + "ferry.copy(dev, src, device=0)", "ferry.copy(dev, src, device=0)",
               "back = bytearray(n); ferry.copy(back, dev, device=0); assert back == src; _ferry.cuda_free(dev)")


def check_fork_child_refuses_inherited_channel():
    _need_gpu()
    _fork_case(_GPU_BUFFERS + "ch = ferry.Channel(device=0); ch.write(dev, bytes(src[:4096]))",
               "ch.write(dev, b'x' * 8)",
               "assert ch.read(dev, 4096) == bytes(src[:4096]); ch.close(); _ferry.cuda_free(dev)")


def check_exit_with_daemon_threads_copying():
    _need_gpu()
    _child_script("""
        import os, threading, time, ferry
        from ferry import _ferry
        n = 16 << 20
        def loop():
            dev = _ferry.cuda_malloc(n)
            src = bytearray(os.urandom(n)); back = bytearray(n)
            while True:
                ferry.copy(dev, src); ferry.copy(back, dev)
                assert back == src
        for _ in range(3):
            threading.Thread(target=loop, daemon=True).start()
        time.sleep(1.0)
    """)


CHECKS = [
    ("pool_recycles_exact_sizes", check_pool_recycles_exact_sizes),
    ("buffer_release_twice_frees_once", check_buffer_release_twice_frees_once),
    ("fault_injection_leaves_pool_usable", check_fault_injection_leaves_pool_usable),
    ("pinned_pool_is_pinned", check_pinned_pool_is_pinned),
    ("copy_small_cuda_path", check_copy_small_cuda_path),
    ("copy_staged", check_copy_staged),
    ("copy_pin_in_place", check_copy_pin_in_place),
    ("copy_hybrid", check_copy_hybrid),
    ("channel_write_read", check_channel_write_read),
    ("channel_refuses_large_payloads", check_channel_refuses_large_payloads),
    ("gdrcopy_backend", check_gdrcopy_backend),
    ("fork_child_refuses_inherited_pool", check_fork_child_refuses_inherited_pool),
    ("fork_child_makes_its_own_pool", check_fork_child_makes_its_own_pool),
    ("exit_with_daemon_threads_in_pool_calls", check_exit_with_daemon_threads_in_pool_calls),
    ("fork_child_refuses_inherited_pinned_pool", check_fork_child_refuses_inherited_pinned_pool),
    ("fork_child_refuses_inherited_engine", check_fork_child_refuses_inherited_engine),
    ("fork_child_refuses_inherited_channel", check_fork_child_refuses_inherited_channel),
    ("exit_with_daemon_threads_copying", check_exit_with_daemon_threads_copying),
]


def run(verbose: bool = False, repeats: int = 1) -> dict:
    """{check: (state, why)}; each check runs `repeats` times and passes only if it
    passes every time (the first failure is the one reported)."""
    results = {}
    for name, fn in CHECKS:
        for _ in range(repeats):
            try:
                fn()
                results[name] = ("Passed", "")
            except Waived as w:
                results[name] = ("Waived", str(w))
                break
            except Exception as e:  # a failed check must not stop the others
                detail = traceback.format_exc() if verbose else f"{type(e).__name__}: {e}"
                results[name] = ("Failed", detail)
                break
    return results


def records(results: dict) -> list[dict]:
    """One record per check: metric state, value Passed, Failed or Waived (params: why)."""
    out = Records(SanitySuite.key)
    for name, (state, why) in results.items():
        out.add(name, "state", state, None, why=why or None)
    return out.items


class SanitySuite(Suite):
    key = "sanity"
    description = "functional checks on this machine: Passed, Failed or Waived each, like gdrcopy_sanity"

    def add_arguments(self, p):
        p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed checks")
        add_repeats(p, 1, "runs of each check; a check passes only if every run passes")

    def waived(self, args):
        return None  # each check waives itself

    def run(self, args) -> int:
        results = run(args.verbose, args.repeats)
        width = max(len(n) for n in results)
        for name, (state, why) in results.items():
            print(f"{name:<{width}}  {state}{': ' + why if why else ''}")
        counts = {s: sum(1 for st, _ in results.values() if st == s) for s in ("Passed", "Failed", "Waived")}
        print(f"Total: {counts['Passed']} Passed, {counts['Failed']} Failed, {counts['Waived']} Waived")
        write_json(args.json, self.key, records(results))
        return 1 if counts["Failed"] else 0


SUITE = SanitySuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
