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


def _random_bytes(rng, n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def test_recycled_memory_is_uninitialized_by_default_and_stats_say_so():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    buf = pool.alloc(MiB, huge=False)
    ptr = buf.ptr
    assert bytes(memoryview(buf)) == bytes(MiB), "fresh memory must read as zero"
    data = _random_bytes(random.Random(2), MiB)
    memoryview(buf)[:] = data
    buf.release()
    again = pool.alloc(MiB, huge=False)
    assert again.ptr == ptr, "the freed range should be recycled"
    assert bytes(memoryview(again)) == data, "torch.empty's contract: recycled memory is handed out as it is"
    st = pool.stats()
    assert st["zero_recycled"] is False and st["zeroed_bytes"] == 0 and st["zero_seconds"] == 0
    assert st["recycles"] == 1 and st["chunk_reservations"] == 1


def test_zero_true_never_hands_out_another_allocations_bytes():
    pool = ferry.Pool(chunk_bytes=8 * MiB)
    rng = random.Random(3)
    zeroed = 0
    for n in (1, 255, 4097, MiB + 3, 3 * MiB + 1):
        for align in (1, 64, 4096):
            a = pool.alloc(n, alignment=align)
            memoryview(a)[:] = _random_bytes(rng, n)
            ptr = a.ptr
            a.release()
            b = pool.alloc(n, alignment=align, zero=True)
            assert b.ptr == ptr
            assert bytes(memoryview(b)) == bytes(n), f"{n} bytes at alignment {align}: old bytes survived"
            zeroed += -(-n // align) * align
            b.release()
    st = pool.stats()
    assert st["zeroed_bytes"] == zeroed and st["zero_seconds"] > 0


def test_a_zero_recycled_pool_clears_every_recycled_allocation():
    pool = ferry.Pool(chunk_bytes=8 * MiB, zero_recycled=True)
    assert pool.stats()["zero_recycled"] is True
    rng = random.Random(4)
    live = []
    for _ in range(200):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live))).release()
            continue
        n = rng.randint(1, 2 * MiB)
        b = pool.alloc(n, alignment=rng.choice((1, 256, 4096)))
        assert bytes(memoryview(b)) == bytes(n), "a new allocation holds another's bytes"
        memoryview(b)[:] = _random_bytes(rng, n)
        live.append(b)
    st = pool.stats()
    assert st["recycles"] > 0 and st["zeroed_bytes"] > 0


def test_a_target_serves_one_allocation_of_its_whole_size():
    n = 64 * MiB + 12345  # not a multiple of 2 MiB: the chunk is rounded up
    pool = ferry.Pool(target_bytes=n)
    buf = pool.alloc(n)  # at once: waits for the target instead of reserving
    st = pool.stats()
    reserved = st["small"]["reserved"]["current"] + st["huge"]["reserved"]["current"]
    assert reserved == -(-n // (2 * MiB)) * (2 * MiB), "reserved more than the target"
    assert st["chunk_reservations"] == 1 and st["target_seconds"] > 0
    rng = random.Random(5)
    head, tail = _random_bytes(rng, 4096), _random_bytes(rng, 4096)
    view = memoryview(buf)
    view[:4096], view[n - 4096 :] = head, tail
    assert bytes(view[:4096]) == head and bytes(view[n - 4096 :]) == tail
    view.release()
    buf.release()


def test_a_target_serves_many_smaller_allocations():
    pool = ferry.Pool(target_bytes=32 * MiB)
    pool.wait_ready()
    rng = random.Random(6)
    bufs, used = [], 0
    while used < 28 * MiB:
        n = rng.randint(1, MiB)
        bufs.append(pool.alloc(n))
        used += n + 256
    st = pool.stats()
    assert st["chunk_reservations"] == 1, "small allocations reserved chunks beside the target"
    assert st["small"]["reserved"]["current"] == 0 and st["huge"]["reserved"]["current"] == 32 * MiB
    del bufs


def test_register_lead_bytes_is_an_option():
    pool = ferry.Pool(target_bytes=8 * MiB, register_lead_bytes=0)
    pool.wait_ready()
    pool.alloc(8 * MiB).release()
    assert pool.stats()["chunk_reservations"] == 1


def test_empty_pinned_tensors_from_a_pool():
    torch = pytest.importorskip("torch")
    from ferry.torch import empty_pinned

    pool = ferry.Pool(chunk_bytes=8 * MiB)  # any pool works; a PinnedPool pins them
    cases = [((3, 5), torch.float32), (7, torch.int64), ((), torch.float16), ((2, 0, 3), torch.bfloat16),
             ([4, 1024], torch.uint8), (torch.Size([17, 3]), torch.complex64), ((5,), torch.bool),
             ((9,), torch.float8_e4m3fn)]
    for shape, dtype in cases:
        t = empty_pinned(shape, dtype, pool=pool)
        ref = torch.empty(shape, dtype=dtype)
        assert t.shape == ref.shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
        if t.numel() and dtype not in (torch.bool, torch.float8_e4m3fn):
            src = torch.arange(t.numel()).reshape(t.shape).to(dtype)
            t.copy_(src)
            assert torch.equal(t, src)
    st = pool.stats()
    assert st["allocations"] == len(cases)
    del t
    import gc

    gc.collect()
    st = pool.stats()
    assert in_use(st) == 0 and st["frees"] == len(cases), "a tensor's memory did not return to the pool"
    # zero=True clears recycled memory; without it the old bytes stay (torch.empty's contract).
    a = empty_pinned(MiB, torch.uint8, pool=pool)
    a.copy_(torch.randint(1, 256, (MiB,), dtype=torch.uint8))
    ptr = a.data_ptr()
    del a
    b = empty_pinned(MiB, torch.uint8, pool=pool, zero=True)
    assert b.data_ptr() == ptr and int(b.count_nonzero()) == 0
    with pytest.raises(ferry.InvalidArgumentError, match="negative"):
        empty_pinned((4, -1), torch.float32, pool=pool)
    with pytest.raises(ferry.InvalidArgumentError, match="expected an integer"):
        empty_pinned((4, 2.5), torch.float32, pool=pool)


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
    assert st["register_seconds"] > 0 and st["chunk_reservations"] == 1
    buf.release()


# A target of N then one allocation of N: one chunk, one registration, used
# whole by DMA in both directions. Not a multiple of 2 MiB, above 1 GiB (the
# old targets' largest chunk).
TARGET_N = (1 << 30) + 6 * MiB + 12345


def _assert_one_chunk(pool):
    st = pool.stats()
    reserved = st["small"]["reserved"]["current"] + st["huge"]["reserved"]["current"]
    assert st["chunk_reservations"] == 1, st
    assert reserved == -(-TARGET_N // (2 * MiB)) * (2 * MiB), "pinned more than the target"


def test_target_allocation_with_ferry_copy_both_directions(gpu):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    pool = ferry.PinnedPool(device=0, target_bytes=TARGET_N)
    buf = pool.alloc(TARGET_N)
    _assert_one_chunk(pool)
    host = np.frombuffer(buf, dtype=np.uint8)
    rng = np.random.default_rng(7)
    words = TARGET_N // 8
    host[: words * 8].view(np.uint64)[:] = rng.integers(0, 2**63, size=words, dtype=np.uint64)
    host[words * 8 :] = rng.integers(0, 256, size=TARGET_N - words * 8, dtype=np.uint8)
    dev = torch.full((TARGET_N,), 0xA5, dtype=torch.uint8, device="cuda")  # poisoned
    c = ferry.copy_async(dev, buf)
    c.wait()
    assert c.strategy == "direct", "pinned memory should go straight to the DMA engine"
    expected = torch.from_numpy(host.copy()).cuda()
    assert torch.equal(dev, expected), "host->device over the whole target allocation"
    src = torch.randint(0, 256, (TARGET_N,), dtype=torch.uint8, device="cuda")
    host[:] = 0x5A  # poisoned
    c = ferry.copy_async(buf, src)
    c.wait()
    assert c.strategy == "direct"
    assert torch.equal(torch.from_numpy(host.copy()).cuda(), src), "device->host over the whole target allocation"
    del host, c
    buf.release()


def test_empty_pinned_over_a_whole_target_with_torch_non_blocking_copies(gpu):
    torch = pytest.importorskip("torch")
    from ferry.torch import empty_pinned

    pool = ferry.PinnedPool(device=0, target_bytes=TARGET_N)
    t = empty_pinned(TARGET_N, torch.uint8, pool=pool)
    _assert_one_chunk(pool)
    assert t.is_pinned()
    src = torch.randint(0, 256, (TARGET_N,), dtype=torch.uint8, device="cuda")
    t.fill_(0x5A)  # poisoned
    t.copy_(src, non_blocking=True)  # device->host
    torch.cuda.synchronize()
    assert torch.equal(t.cuda(), src), "device->host non_blocking over the whole allocation"
    dst = torch.full((TARGET_N,), 0xA5, dtype=torch.uint8, device="cuda")  # poisoned
    dst.copy_(t, non_blocking=True)  # host->device
    torch.cuda.synchronize()
    assert torch.equal(dst, src), "host->device non_blocking over the whole allocation"
    moved = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(moved, src)
    del t, moved
    # A shaped tensor over the recycled range: still one registration.
    h = empty_pinned((TARGET_N // 2 // 4096, 4096), torch.float16, pool=pool)
    assert h.is_pinned() and pool.stats()["chunk_reservations"] == 1
    ref = torch.randn(h.shape, dtype=torch.float16, device="cuda")
    h.copy_(ref, non_blocking=True)
    torch.cuda.synchronize()
    back = torch.zeros_like(ref)
    back.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, ref)


def test_one_big_allocation_without_a_target_is_one_registration(gpu):
    torch = pytest.importorskip("torch")
    from ferry.torch import empty_pinned

    pool = ferry.PinnedPool(device=0)
    t = empty_pinned(TARGET_N, torch.uint8, pool=pool)  # a dedicated chunk, registered while touched
    st = pool.stats()
    assert st["chunk_reservations"] == 1 and t.is_pinned()
    src = torch.randint(0, 256, (TARGET_N,), dtype=torch.uint8, device="cuda")
    t.fill_(0x5A)
    t.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    dst = torch.full_like(src, 0xA5)
    dst.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)
