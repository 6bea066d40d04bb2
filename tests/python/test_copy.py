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


def _sysfs(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def test_each_engine_reports_its_numa_node_and_crew(gpu, device_buffer):
    """The engine's node is the one sysfs gives its PCI device on a multi-node host, -1
    on a one-node host; its crew is bound to that node's usable CPUs (unbound: [])."""
    import os

    from ferry.facts import parsers

    np = pytest.importorskip("numpy")

    online = parsers.parse_cpulist(_sysfs("/sys/devices/system/node/online")) or []
    for d, info in enumerate(gpu["devices"]):
        bus = parsers.normalize_pci_bus_id(info["pci_bus_id"])
        node = parsers.parse_int(_sysfs(f"/sys/bus/pci/devices/{bus}/numa_node"))
        want = node if len(online) > 1 and node in online else -1
        st = ferry.engine(d).stats()
        assert st["numa_node"] == want, (d, bus, node, online)
        assert st["crew_threads"] >= 1
        if want < 0:
            assert st["crew_cpus"] == []
        else:
            node_cpus = set(parsers.parse_cpulist(_sysfs(f"/sys/devices/system/node/node{want}/cpulist")))
            assert st["crew_cpus"] == sorted(node_cpus & os.sched_getaffinity(0))
    # A staged round trip through device 0's (placed) staging memory and crew.
    n = 3 * MiB + 17
    src = np.random.default_rng(16).integers(0, 256, n, dtype=np.uint8)
    back = np.full(n, 0xEE, dtype=np.uint8)
    dev = device_buffer(n)
    ferry.copy(dev, src, n, strategy="staged")
    ferry.copy(back, dev, n, strategy="staged")
    assert np.array_equal(back, src)


# ---- many items in one call ------------------------------------------------------------


def test_copy_many_mixed_objects_both_directions(gpu):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    pool = ferry.PinnedPool(device=0)
    sizes = [1, 7, 4096, 65537, 3 * MiB + 1, 17 * MiB + 3, 1000]
    srcs, devs, backs = [], [], []
    for i, n in enumerate(sizes):
        if i % 3 == 0:
            src = rng.integers(0, 256, n + 1, dtype=np.uint8)[1:]  # pageable, misaligned
        elif i % 3 == 1:
            src = pool.alloc(n)
            np.frombuffer(memoryview(src), dtype=np.uint8)[:] = rng.integers(0, 256, n, dtype=np.uint8)
        else:
            src = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
        srcs.append(src)
        devs.append(torch.full((n,), 0xCD, dtype=torch.uint8, device="cuda"))
        backs.append(np.full(n, 0xEE, dtype=np.uint8))
    ferry.copy_many(devs, srcs)
    ferry.copy_many(backs, devs)
    for i, (src, back) in enumerate(zip(srcs, backs)):
        expect = np.frombuffer(memoryview(src), dtype=np.uint8) if not hasattr(src, "numpy") else src.numpy()
        assert np.array_equal(expect, back), i


def test_copy_many_with_arrays_of_addresses(gpu):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    blk, count = 64 << 10, 257
    host = ferry.PinnedPool(device=0).alloc(blk * count * 2)
    view = np.frombuffer(memoryview(host), dtype=np.uint8)
    view[:] = np.random.default_rng(3).integers(0, 256, view.size, dtype=np.uint8)
    dev = torch.full((blk * count * 2,), 0x11, dtype=torch.uint8, device="cuda")
    order = np.random.default_rng(4).permutation(count * 2)[:count]
    srcs = (host.ptr + order * blk).astype(np.int64)
    dsts = np.int64(dev.data_ptr()) + np.arange(count, dtype=np.int64) * blk
    ferry.copy_many(dsts, srcs, np.full(count, blk, dtype=np.int64))
    got = dev[: blk * count].cpu().numpy().reshape(count, blk)
    for k, j in enumerate(order):
        assert np.array_equal(got[k], view[j * blk:(j + 1) * blk]), k
    # Lists of ints work the same, and async.
    back = ferry.PinnedPool(device=0).alloc(blk * count)
    ferry.copy_many_async([back.ptr + k * blk for k in range(count)], dsts.tolist(), [blk] * count).wait()
    assert np.array_equal(np.frombuffer(memoryview(back), dtype=np.uint8), got.reshape(-1))


def test_copy_many_names_the_bad_item_and_the_engine_works_on(gpu):
    torch = pytest.importorskip("torch")
    devs = [torch.zeros(1000, device="cuda") for _ in range(5)]
    srcs = [torch.randn(1000) for _ in range(5)]
    srcs[3] = torch.randn(999)
    with pytest.raises(ferry.InvalidArgumentError, match="item 3"):
        ferry.copy_many(devs, srcs)
    with pytest.raises(ferry.InvalidArgumentError, match="sizes"):
        ferry.copy_many([devs[0].data_ptr()], [srcs[0].data_ptr()])
    with pytest.raises(ferry.InvalidArgumentError, match="dsts\\[1\\]"):
        ferry.copy_many([devs[0], "nope"], srcs[:2])
    srcs[3] = torch.randn(1000)
    ferry.copy_many(devs, srcs)
    assert all(torch.equal(d.cpu(), s) for d, s in zip(devs, srcs))


def test_copy_follows_torchs_current_stream(gpu):
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    dev = torch.zeros(8 << 20, dtype=torch.uint8, device="cuda")
    host = torch.empty(8 << 20, dtype=torch.uint8)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        dev.fill_(7)
        ferry.copy(host, dev)  # must run after the fill, on `side`
    assert int(host.min()) == 7 and int(host.max()) == 7


def test_to_device_and_back_keep_a_nested_structure(gpu):
    torch = pytest.importorskip("torch")
    import collections

    import ferry.torch as ft

    Pair = collections.namedtuple("Pair", "a b")
    sd = collections.OrderedDict()
    sd["w"] = torch.randn(4096, 333)
    sd["norm"] = torch.randn(4096, dtype=torch.bfloat16)
    sd["step"] = torch.tensor(7)                          # 0-d
    sd["empty"] = torch.empty(0, 5)
    sd["idx"] = torch.randint(-5, 5, (1001,), dtype=torch.int64)
    sd["t"] = torch.randn(64, 96).t()                     # not contiguous
    sd._metadata = {"": {"version": 1}}
    batch = {"state": sd, "items": [torch.randn(3), (torch.ones(2, dtype=torch.uint8), "label", 5)],
             "pair": Pair(torch.randn(7), None)}
    on_gpu = ft.to_device(batch)
    assert type(on_gpu["state"]) is collections.OrderedDict
    assert on_gpu["state"]._metadata == sd._metadata
    assert list(on_gpu["state"].keys()) == list(sd.keys())
    assert isinstance(on_gpu["pair"], Pair) and on_gpu["pair"].b is None
    assert on_gpu["items"][1][1:] == ("label", 5)
    for k, v in sd.items():
        g = on_gpu["state"][k]
        assert g.is_cuda and g.shape == v.shape and g.dtype == v.dtype, k
        assert torch.equal(g.cpu(), v), k
    back = ft.to_host(on_gpu)
    for k, v in sd.items():
        assert not back["state"][k].is_cuda and torch.equal(back["state"][k], v), k
    assert torch.equal(back["items"][1][0], torch.ones(2, dtype=torch.uint8))
    # Into existing (pinned) tensors.
    out = {k: ft.empty_pinned(v.shape, v.dtype) for k, v in sd.items()}
    filled = ft.to_host(on_gpu["state"], out=out)
    assert all(filled[k] is out[k] and torch.equal(out[k], v) for k, v in sd.items())
    with pytest.raises(ferry.InvalidArgumentError, match="out tensor"):
        ft.to_host(on_gpu["state"], out={k: torch.empty(1) for k in sd})


def test_to_device_and_to_host_move_values_of_conjugate_and_negative_views(gpu):
    """A conj or neg view's memory holds x, it means conj(x) or -x: the copy carries
    the values (a raw byte copy carried x)."""
    torch = pytest.importorskip("torch")
    import ferry.torch as ft

    g = torch.Generator().manual_seed(9)
    c = torch.randn(2 * 4099, generator=g).view(torch.complex64)
    f = torch.randn(3001, generator=g)
    views = {"conj": c.conj(), "neg": torch._neg_view(f), "strided_conj": c[::3].conj()}
    on_gpu = ft.to_device(views, "cuda")
    for k, v in views.items():
        assert torch.equal(on_gpu[k].cpu(), v.resolve_conj().resolve_neg()), k
    gpu_views = {"conj": c.cuda().conj(), "neg": torch._neg_view(f.cuda())}
    back = ft.to_host(gpu_views)
    for k, v in gpu_views.items():
        assert torch.equal(back[k], v.cpu().resolve_conj().resolve_neg()), k
