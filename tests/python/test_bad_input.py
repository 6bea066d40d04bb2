"""Every bad input of issue #14 (and #12's bad sizes), one table: each gives a ferry
error (InvalidArgumentError, or OutOfMemoryError for a target larger than the
machine) whose message names the option or argument and quotes the value. None
needs a GPU: the arguments are checked before any device is touched."""

import os
import subprocess
import sys

import pytest

import ferry
from ferry import InvalidArgumentError, OutOfMemoryError

MiB = 1 << 20


def pool_with(**options):
    return lambda: ferry.Pool(**options)


def alloc(*args, **kwargs):
    return lambda: ferry.Pool(chunk_bytes=2 * MiB).alloc(*args, **kwargs)


def empty_pinned(shape):
    def call():
        pytest.importorskip("torch")
        import ferry.torch

        ferry.torch.empty_pinned(shape)  # the shape is checked before anything is allocated

    return call


# (id, call, error class, text the message must hold: the name and the quoted value)
CASES = [
    # Pool options of the wrong type or range (were std::bad_cast)
    ("limit_bytes=-1", pool_with(limit_bytes=-1), InvalidArgumentError, "limit_bytes=-1"),
    ("chunk_bytes=-1", pool_with(chunk_bytes=-1), InvalidArgumentError, "chunk_bytes=-1"),
    ("chunk_bytes=2**64", pool_with(chunk_bytes=2**64), InvalidArgumentError, f"chunk_bytes={2**64}"),
    ("chunk_bytes='64MiB'", pool_with(chunk_bytes="64MiB"), InvalidArgumentError, "chunk_bytes='64MiB'"),
    ("chunk_bytes=1.5", pool_with(chunk_bytes=1.5), InvalidArgumentError, "chunk_bytes=1.5"),
    ("chunk_bytes=True", pool_with(chunk_bytes=True), InvalidArgumentError, "chunk_bytes=True"),
    ("chunk_bytes=3MiB", pool_with(chunk_bytes=3 * MiB), InvalidArgumentError, "chunk_bytes=3145728"),
    ("touch_threads=2**31", pool_with(touch_threads=2**31), InvalidArgumentError, f"touch_threads={2**31}"),
    ("touch_threads=5000", pool_with(touch_threads=5000), InvalidArgumentError, "touch_threads=5000"),
    ("release_delay_ms=2**63", pool_with(release_delay_ms=2**63), InvalidArgumentError,
     f"release_delay_ms={2**63}"),
    ("release_delay_ms=10**13", pool_with(release_delay_ms=10**13), InvalidArgumentError,
     f"release_delay_ms={10**13}"),
    ("release_delay_ms=2**62", pool_with(release_delay_ms=2**62), InvalidArgumentError,
     f"release_delay_ms={2**62}"),
    ("release_delay_ms=-1", pool_with(release_delay_ms=-1), InvalidArgumentError, "release_delay_ms=-1"),
    ("release_batch_bytes=-5", pool_with(release_batch_bytes=-5), InvalidArgumentError,
     "release_batch_bytes=-5"),
    ("numa_node=2**31", pool_with(numa_node=2**31), InvalidArgumentError, f"numa_node={2**31}"),
    ("numa_node=-3", pool_with(numa_node=-3), InvalidArgumentError, "numa_node=-3"),
    ("target_bytes=-1", pool_with(target_bytes=-1), InvalidArgumentError, "target_bytes=-1"),
    ("target_bytes=2**64-1", pool_with(target_bytes=2**64 - 1), OutOfMemoryError,
     f"target_bytes={2**64 - 1}"),
    ("memfd='yes'", pool_with(memfd="yes"), InvalidArgumentError, "memfd='yes'"),
    ("zero_recycled='no'", pool_with(zero_recycled="no"), InvalidArgumentError, "zero_recycled='no'"),
    ("huge_pages=1", pool_with(huge_pages=1), InvalidArgumentError, "huge_pages=1"),
    ("target_huge=1", pool_with(target_huge=1), InvalidArgumentError, "target_huge=1"),
    ("PinnedPool(device='x')", lambda: ferry.PinnedPool(device="x"), InvalidArgumentError, "device='x'"),
    ("PinnedPool(device=-1)", lambda: ferry.PinnedPool(device=-1), InvalidArgumentError, "device=-1"),
    # Allocation and trim arguments (were nanobind's "incompatible function arguments")
    ("alloc(huge='yes')", alloc(10, 256, huge="yes"), InvalidArgumentError, "huge='yes'"),
    ("alloc(-1)", alloc(-1), InvalidArgumentError, "nbytes=-1"),
    ("alloc(2**64)", alloc(2**64), InvalidArgumentError, f"nbytes={2**64}"),
    ("alloc(1.5)", alloc(1.5), InvalidArgumentError, "nbytes=1.5"),
    ("alloc(True)", alloc(True), InvalidArgumentError, "nbytes=True"),
    ("alloc('8')", alloc("8"), InvalidArgumentError, "nbytes='8'"),
    ("alloc(alignment=-256)", alloc(64, alignment=-256), InvalidArgumentError, "alignment=-256"),
    ("alloc(alignment=3)", alloc(64, alignment=3), InvalidArgumentError, "alignment 3"),
    ("alloc(alignment=2.0)", alloc(64, alignment=2.0), InvalidArgumentError, "alignment=2.0"),
    ("trim(-1)", lambda: ferry.Pool(chunk_bytes=2 * MiB).trim(-1), InvalidArgumentError, "keep_bytes=-1"),
    ("trim(None)", lambda: ferry.Pool(chunk_bytes=2 * MiB).trim(None), InvalidArgumentError, "keep_bytes=None"),
    # Copies, registrations, batches, channels, pinned tensors: sizes
    ("copy(nbytes=-1)", lambda: ferry.copy(bytearray(64), bytes(64), -1), InvalidArgumentError, "nbytes=-1"),
    ("copy(nbytes=True)", lambda: ferry.copy(bytearray(64), bytes(64), True), InvalidArgumentError,
     "nbytes=True"),
    ("copy(nbytes=1.5)", lambda: ferry.copy(bytearray(64), bytes(64), 1.5), InvalidArgumentError, "nbytes=1.5"),
    ("copy_async(nbytes=-8)", lambda: ferry.copy_async(bytearray(64), bytes(64), -8), InvalidArgumentError,
     "nbytes=-8"),
    ("copy(address=-4096)", lambda: ferry.copy(-4096, bytes(64), 64), InvalidArgumentError, "dst=-4096"),
    ("register(nbytes=-1)", lambda: ferry.register(bytearray(64), -1), InvalidArgumentError, "nbytes=-1"),
    ("copy_many_async(sizes=[64, -1])",
     lambda: ferry.copy_many_async([bytearray(64)] * 2, [bytes(64)] * 2, [64, -1]), InvalidArgumentError,
     "sizes[1]=-1"),
    ("Channel(idle_us=-1)", lambda: ferry.Channel(idle_us=-1), InvalidArgumentError, "idle_us=-1"),
    ("Channel(slots=1.5)", lambda: ferry.Channel(slots=1.5), InvalidArgumentError, "slots=1.5"),
    ("Channel(timeout_ms=2**32)", lambda: ferry.Channel(timeout_ms=2**32), InvalidArgumentError,
     f"timeout_ms={2**32}"),
    ("Channel(use_gdrcopy='yes')", lambda: ferry.Channel(use_gdrcopy="yes"), InvalidArgumentError,
     "use_gdrcopy='yes'"),
    ("empty_pinned((2, -3))", empty_pinned((2, -3)), InvalidArgumentError, "shape[1]=-3"),
    ("empty_pinned(1.5)", empty_pinned(1.5), InvalidArgumentError, "shape=1.5"),
    # Fault-injection specs (were accepted)
    ("fault 'mmap:99999999999999999999999'", lambda: ferry.set_fault_injection("mmap:99999999999999999999999"),
     InvalidArgumentError, "'mmap:99999999999999999999999'"),
    ("fault 'mmap: 5'", lambda: ferry.set_fault_injection("mmap: 5"), InvalidArgumentError, "'mmap: 5'"),
    ("fault 'mmap:+5'", lambda: ferry.set_fault_injection("mmap:+5"), InvalidArgumentError, "'mmap:+5'"),
    ("fault 'mmap:1=EWHAT'", lambda: ferry.set_fault_injection("mmap:1=EWHAT"), InvalidArgumentError, "'EWHAT'"),
    ("fault spec 5", lambda: ferry.set_fault_injection(5), InvalidArgumentError, "spec=5"),
]


@pytest.mark.parametrize("call, error, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_a_ferry_error_quoting_the_value(call, error, text):
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value), str(info.value)


def test_a_refused_call_loses_nothing():
    pool = ferry.Pool(chunk_bytes=2 * MiB)
    keep = pool.alloc(100)
    memoryview(keep)[:4] = b"\x01\x02\x03\x04"
    for bad in (-1, 2**64, 1.5, True, "8"):
        with pytest.raises(InvalidArgumentError):
            pool.alloc(bad)
    stats = pool.stats()
    assert stats["allocations"] == 1 and stats["small"]["in_use"]["current"] == 256
    assert bytes(memoryview(keep)[:4]) == b"\x01\x02\x03\x04"
    ferry.set_fault_injection("")


def test_numpy_integers_are_sizes():
    np = pytest.importorskip("numpy")
    pool = ferry.Pool(chunk_bytes=2 * MiB, release_delay_ms=np.int32(5))
    buf = pool.alloc(np.int64(4097), alignment=np.uint16(64))
    assert buf.nbytes == 4097 and buf.ptr % 64 == 0
    assert pool.trim(np.uint64(0)) >= 0


# FERRY_* variables are read once per process: each case runs in a child.
ENV_CASES = [
    ("FERRY_RELEASE_DELAY_MS", "10000000000000"),  # was a busy loop under the pool's lock
    ("FERRY_RELEASE_DELAY_MS", str(2**62)),
    ("FERRY_RELEASE_DELAY_MS", "-1"),
    ("FERRY_COPY_WORKERS", "-5"),  # was silently the default
    ("FERRY_TOUCH_THREADS", str(2**31)),
    ("FERRY_CHUNK_SIZE", "-1"),
    ("FERRY_CHUNK_SIZE", "1.5G"),
    ("FERRY_POOL_LIMIT", "99999999999999999999"),
    ("FERRY_FAULT_INJECT", "mmap: 5"),
    ("FERRY_FAULT_INJECT", "mmap:99999999999999999999999"),
]


@pytest.mark.parametrize("name, value", ENV_CASES, ids=[f"{n}={v}" for n, v in ENV_CASES])
def test_bad_environment_values_are_refused_up_front(name, value):
    code = "import ferry\nferry.Pool().alloc(3 << 20)\n"
    env = dict(os.environ, **{name: value})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "InvalidArgumentError" in r.stderr, r.stderr
    assert f"{name}='{value}'" in r.stderr, r.stderr


def test_longest_release_delay_neither_spins_nor_hangs():
    # The largest accepted delay (a day): the pool works and is destroyed at once.
    code = (
        "import ferry, resource\n"
        "p = ferry.Pool(release_delay_ms=86_400_000, chunk_bytes=2 << 20)\n"
        "for _ in range(3): p.alloc(3 << 20).release()\n"
        "del p\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
