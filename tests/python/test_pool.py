"""ferry.Pool / PinnedPool from Python: buffers, accounting, errors."""

import gc
import random

import pytest

import ferry

MiB = 1 << 20


def in_use(stats):
    return stats["small"]["in_use"]["current"] + stats["huge"]["in_use"]["current"]


def test_alloc_exact_size_buffer_protocol_and_random_data():
    pool = ferry.Pool(chunk_bytes=8 * MiB)
    rng = random.Random(1)
    for n in (1, 7, 4095, 4097, MiB + 3, 3 * MiB + 1):
        buf = pool.alloc(n)
        assert buf.nbytes == n and len(buf) == n
        view = memoryview(buf)
        assert view.nbytes == n and not view.readonly
        data = bytes(rng.getrandbits(8) for _ in range(min(n, 4096)))
        view[: len(data)] = data
        view[n - 1 : n] = b"\x5a"
        assert bytes(memoryview(buf)[: len(data) - (1 if n == len(data) else 0)]) == data[
            : len(data) - (1 if n == len(data) else 0)
        ]
        assert memoryview(buf)[n - 1] == 0x5A
        view.release()
        buf.release()
    assert in_use(pool.stats()) == 0


def test_numpy_and_dlpack_views_keep_the_buffer_alive():
    np = pytest.importorskip("numpy")
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    buf = pool.alloc(1000, alignment=64)
    assert buf.ptr % 64 == 0
    a = np.frombuffer(buf, dtype=np.uint8)
    a[:] = np.arange(1000) % 251
    b = np.from_dlpack(buf)
    assert b.shape == (1000,) and int(b[999]) == 999 % 251
    with pytest.raises(BufferError):
        buf.release()  # views alive: refusing keeps them from seeing recycled memory
    del a, b
    gc.collect()
    assert buf.exports == 0
    buf.release()
    assert buf.released
    with pytest.raises(ValueError):
        buf.ptr


def test_recycled_memory_is_zeroed_by_default():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    buf = pool.alloc(MiB, huge=False)
    ptr = buf.ptr
    memoryview(buf)[:] = b"\xff" * MiB
    buf.release()
    again = pool.alloc(MiB, huge=False)
    assert again.ptr == ptr, "the freed range should be recycled"
    assert bytes(memoryview(again)) == bytes(MiB)
    st = pool.stats()
    assert st["recycles"] >= 1 and st["chunk_reservations"] == 1


def test_garbage_collection_frees_and_stats_return_to_zero():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    bufs = [pool.alloc(random.randint(1, 3 * MiB)) for _ in range(20)]
    assert in_use(pool.stats()) > 0
    del bufs
    gc.collect()
    st = pool.stats()
    assert in_use(st) == 0
    assert st["frees"] == st["allocations"] == 20
    released = pool.trim()
    assert released > 0
    st = pool.stats()
    assert st["small"]["reserved"]["current"] + st["huge"]["reserved"]["current"] == 0


def test_bad_input_raises_the_right_classes():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    with pytest.raises(ferry.InvalidArgumentError):
        pool.alloc(0)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        pool.alloc(16, alignment=3)
    with pytest.raises(ferry.InvalidArgumentError, match="unknown pool option"):
        ferry.Pool(chunk_size=1)
    with pytest.raises(ferry.InvalidArgumentError, match="huge_pages"):
        ferry.Pool(huge_pages="sometimes")
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Pool(chunk_bytes=3 * MiB)  # not a multiple of 2 MiB


def test_limit_raises_memory_error_naming_the_limit():
    pool = ferry.Pool(chunk_bytes=4 * MiB, limit_bytes=8 * MiB)
    with pytest.raises(MemoryError, match="8 MiB"):
        pool.alloc(32 * MiB)
    with pytest.raises(ferry.OutOfMemoryError):
        pool.alloc(32 * MiB)
    buf = pool.alloc(MiB)  # still usable
    buf.release()


def test_fault_injection_in_mmap_fails_cleanly():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    ferry.set_fault_injection("mmap:0")
    try:
        with pytest.raises(ferry.FerryError):
            pool.alloc(MiB)
    finally:
        ferry.set_fault_injection("")
    assert in_use(pool.stats()) == 0
    pool.alloc(MiB).release()


def test_pinned_pool_without_device_says_so():
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present (see test_pinned_pool_on_device)")
    with pytest.raises(ferry.NoDeviceError, match="CUDA"):
        ferry.PinnedPool(device=0)


def test_pinned_pool_on_device(gpu):
    pool = ferry.PinnedPool(device=0, chunk_bytes=16 * MiB, target_bytes=32 * MiB)
    pool.wait_ready()
    buf = pool.alloc(5 * MiB + 3)
    assert buf.pinned
    st = pool.stats()
    assert st["register_seconds"] > 0 and st["chunk_reservations"] == 2
    buf.release()
