"""ferry.copy / copy_async / register and ferry.torch copies (GPU; skipped without one)."""

import pytest

import ferry

MiB = 1 << 20


def test_copy_without_a_device_says_so():
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    src = bytearray(16)
    with pytest.raises(ferry.NoDeviceError):
        ferry.copy(0x1000, src, 16)


@pytest.fixture
def device_buffer(gpu):
    from ferry import _ferry

    made = []

    def alloc(n):
        p = _ferry.cuda_malloc(n)
        made.append(p)
        return p

    yield alloc
    for p in made:
        _ferry.cuda_free(p)


@pytest.mark.parametrize("strategy", [None, "staged", "pin-in-place", "hybrid", "cuda"])
def test_numpy_round_trip_with_odd_sizes_and_offsets(device_buffer, strategy):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)
    dev = device_buffer(80 * MiB)
    for n in (1, 4097, 3 * MiB + 5, 70 * MiB + 1):
        src = rng.integers(0, 256, n + 3, dtype=np.uint8)[3:]  # misaligned view
        back = np.full(n, 0xAB, dtype=np.uint8)
        ferry.copy(dev + 5, src, strategy=strategy)
        ferry.copy(back, dev + 5, n, strategy=strategy)
        assert np.array_equal(src, back), (n, strategy)


def test_async_copy_reports_strategy_and_keeps_objects_alive(device_buffer):
    np = pytest.importorskip("numpy")
    dev = device_buffer(32 * MiB)
    src = np.random.default_rng(1).integers(0, 256, 32 * MiB, dtype=np.uint8)
    c = ferry.copy_async(dev, src)
    assert c.strategy == "staged"
    c.wait()
    assert c.done and c.seconds >= 0
    back = np.zeros_like(src)
    ferry.copy_async(back, dev).wait()
    assert np.array_equal(src, back)


def test_registered_buffer_goes_direct(device_buffer):
    np = pytest.importorskip("numpy")
    dev = device_buffer(8 * MiB)
    host = np.random.default_rng(2).integers(0, 256, 8 * MiB, dtype=np.uint8)
    with ferry.register(host) as reg:
        assert reg.registered_bytes >= host.nbytes
        c = ferry.copy_async(dev, host)
        assert c.strategy == "direct"
        c.wait()
    back = np.zeros_like(host)
    ferry.copy(back, dev)
    assert np.array_equal(host, back)


def test_bad_copies_raise_value_errors(device_buffer):
    dev = device_buffer(MiB)
    with pytest.raises(ValueError):
        ferry.copy(bytearray(16), bytes(16))  # host to host
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.copy(bytearray(16), bytes(32))  # sizes differ without nbytes
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.copy(dev, bytes(2 * MiB))  # past the device allocation
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.copy(bytes(16), dev, 16)  # read-only destination


def test_torch_pageable_and_pinned_tensors(gpu):
    torch = pytest.importorskip("torch")
    import ferry.torch as ft

    t = torch.randn(3, 1000, 333)
    d = ft.to_device(t)
    assert d.is_cuda and torch.equal(d.cpu(), t)
    d2 = ft.to_device(t, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(d2.cpu(), t)
    out = torch.full_like(t, -1.0)
    assert torch.equal(ft.to_host(d, out=out), t)
    p = ft.empty_pinned((1000, 77), torch.float16)
    assert p.is_pinned() and p.shape == (1000, 77) and p.dtype == torch.float16
    p.copy_(torch.randn(1000, 77).half())
    g = p.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(g.cpu(), p)
