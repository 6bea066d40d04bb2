"""KV-cache blocks through ferry.copy_many (int64 address arrays, one size) and
ferry.copy_blocks (a block table over layers), pinned pool <-> GPU (issue 41):
random sizes, counts and places from a printed seed (FERRYTEST_SEED repeats it),
every path, poisoned destinations, both directions at once from two threads.
GPU tests skip without a device; bad block tables are refused before any work."""

import os
import random
import threading

import pytest

import ferry

KiB, MiB = 1 << 10, 1 << 20
POISON = 0xEE


@pytest.fixture
def seed():
    s = int(os.environ.get("FERRYTEST_SEED", random.randrange(1 << 32)))
    print(f"test_kv_blocks seed {s} (FERRYTEST_SEED={s} repeats it)")
    return s


@pytest.fixture
def mem(gpu):
    """(pinned pool, alloc_device(n)) with every device allocation freed afterwards."""
    from ferry import _ferry

    pool = ferry.PinnedPool(device=0, zero_recycled=False)
    made = []

    def device(n):
        made.append(_ferry.cuda_malloc(n))
        return made[-1]

    yield pool, device
    for p in made:
        _ferry.cuda_free(p)


def _host(buf):
    np = pytest.importorskip("numpy")
    return np.frombuffer(memoryview(buf), dtype=np.uint8)


def _device_bytes(dev, n):
    """The device's n bytes at dev, through a plain copy."""
    np = pytest.importorskip("numpy")
    out = np.empty(n, dtype=np.uint8)
    ferry.copy(out, dev, n)
    return out


@pytest.mark.parametrize("strategy", [None, "direct", "sm"])
def test_copy_many_address_arrays_every_path_bit_exact(mem, seed, strategy):
    np = pytest.importorskip("numpy")
    pool, device = mem
    rng = np.random.default_rng(seed)
    for round_ in range(6):
        size = int(rng.choice([4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 2 * MiB, int(rng.integers(1, 100_000))]))
        count = int(rng.integers(1, max(2, min(20_000, (32 * MiB) // size))))
        slot = size + int(rng.integers(0, 40))  # odd gaps and offsets
        nbytes = slot * count + 64
        src, back = pool.alloc(nbytes), pool.alloc(nbytes)
        dev = device(nbytes)
        hs, hb = _host(src), _host(back)
        hs[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
        hb[:] = POISON
        ferry.copy(dev, bytes([0xCD]) * nbytes, nbytes)
        host_slots = rng.permutation(count).astype(np.int64)
        dev_slots = rng.permutation(count).astype(np.int64)
        if round_ % 3 == 2:  # adjacent on both sides: merged into one copy
            host_slots = dev_slots = np.arange(count, dtype=np.int64)
            slot = size
        h = src.ptr + 3 + host_slots * slot
        d = dev + 5 + dev_slots * slot
        b = back.ptr + 3 + host_slots * slot
        ferry.copy_many_async(d, h, size, strategy=strategy).wait()
        ferry.copy_many(b, d, size, strategy=strategy)
        written = np.zeros(nbytes, dtype=bool)
        for k in range(count):
            o = 3 + int(host_slots[k]) * slot
            assert np.array_equal(hb[o:o + size], hs[o:o + size]), (round_, k, size)
            written[o:o + size] = True
        assert (hb[~written] == POISON).all(), f"round {round_}: host bytes outside the blocks were written"
        dv = _device_bytes(dev, nbytes)
        dw = np.zeros(nbytes, dtype=bool)
        for k in range(count):
            o = 5 + int(dev_slots[k]) * slot
            dw[o:o + size] = True
        assert (dv[~dw] == 0xCD).all(), f"round {round_}: device bytes outside the blocks were written"
        del hs, hb  # views of the buffers: released first
        src.release()
        back.release()


def test_copy_blocks_paged_layout_over_layers(mem, seed):
    """A vLLM-like layout: device layer l holds (K, V) pairs of blocks; the host
    pool holds each layer's K blocks. Offload some blocks, bring them back
    elsewhere, compare with numpy's view of both."""
    np = pytest.importorskip("numpy")
    pool, device = mem
    rng = np.random.default_rng(seed)
    layers, blocks, block = 5, 300, 16 * KiB + 16
    dev_stride, dev_layer = 2 * block, 2 * block * blocks  # K and V interleaved per block
    host_layer = block * blocks
    dev = device(dev_layer * layers)
    pattern = rng.integers(0, 256, dev_layer * layers, dtype=np.uint8)
    ferry.copy(dev, pattern, pattern.size)
    host = pool.alloc(host_layer * layers)
    hv = _host(host)
    hv[:] = POISON
    dev_ids = rng.choice(blocks, 120, replace=False)
    host_ids = rng.choice(blocks, 120, replace=False).astype(np.int32)  # int32 ids work too
    ferry.copy_blocks(host.ptr, dev, host_ids, dev_ids, block, layers=layers, dst_layer_stride=host_layer,
                      src_block_stride=dev_stride, src_layer_stride=dev_layer)
    written = np.zeros(hv.size, dtype=bool)
    for layer in range(layers):
        for h, d in zip(host_ids, dev_ids):
            o, s = layer * host_layer + int(h) * block, layer * dev_layer + int(d) * dev_stride
            assert np.array_equal(hv[o:o + block], pattern[s:s + block]), (layer, h, d)
            written[o:o + block] = True
    assert (hv[~written] == POISON).all()
    # And back up into the V halves of other blocks, as a list of ids, async.
    back_ids = list(rng.choice(blocks, 120, replace=False))
    ferry.copy_blocks_async(dev + block, host.ptr, back_ids, host_ids.tolist(), block, layers=layers,
                            dst_block_stride=dev_stride, dst_layer_stride=dev_layer,
                            src_layer_stride=host_layer).wait()
    got = _device_bytes(dev, dev_layer * layers)
    for layer in range(layers):
        for b, h in zip(back_ids, host_ids):
            o, s = layer * dev_layer + int(b) * dev_stride + block, layer * host_layer + int(h) * block
            assert np.array_equal(got[o:o + block], hv[s:s + block]), (layer, b, h)
    del hv
    host.release()


def test_both_directions_at_once_from_two_threads(mem, seed):
    np = pytest.importorskip("numpy")
    pool, device = mem
    rng = np.random.default_rng(seed)
    for size in (4 * KiB, 64 * KiB, 512 * KiB):
        count = (32 * MiB) // size
        up_src, down_dst = pool.alloc(count * size), pool.alloc(count * size)
        up_dev, down_dev = device(count * size), device(count * size)
        us, dd = _host(up_src), _host(down_dst)
        us[:] = rng.integers(0, 256, us.size, dtype=np.uint8)
        expect = rng.integers(0, 256, us.size, dtype=np.uint8)
        ferry.copy(down_dev, expect, expect.size)
        order = rng.permutation(count).astype(np.int64)
        errors = []

        def up():
            try:
                for _ in range(5):
                    ferry.copy_many(up_dev + order * size, up_src.ptr + np.arange(count) * size, size)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        t = threading.Thread(target=up)
        t.start()
        for _ in range(5):
            dd[:] = POISON
            ferry.copy_many(down_dst.ptr + np.arange(count) * size, down_dev + order * size, size)
            got = dd.reshape(count, size)
            want = expect.reshape(count, size)[order]
            assert np.array_equal(got, want), size
        t.join()
        assert not errors, errors
        on_dev = _device_bytes(up_dev, count * size).reshape(count, size)
        assert np.array_equal(on_dev[order], us.reshape(count, size)), size
        del us, dd, got
        up_src.release()
        down_dst.release()


def test_block_plan_replays_in_a_torch_cuda_graph(mem, seed):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    pool, device = mem
    rng = np.random.default_rng(seed)
    size, count = 16 * KiB, 500
    src, back = pool.alloc(size * count), pool.alloc(size * count)
    dev = device(size * count * 2)
    slots = rng.permutation(2 * count)[:count].astype(np.int64)
    up = ferry.BlockPlan(dev + slots * size, src.ptr + np.arange(count) * size, size)
    down = ferry.BlockPlan(back.ptr + np.arange(count) * size, dev + slots * size, size, max_sms=2)
    assert up.items == count and up.nbytes == size * count
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        up.launch(stream)
        down.launch(stream)
    hs, hb = _host(src), _host(back)
    for _ in range(3):
        hs[:] = rng.integers(0, 256, hs.size, dtype=np.uint8)
        hb[:] = POISON
        graph.replay()
        torch.cuda.synchronize()
        assert np.array_equal(hb, hs)
    del hs, hb
    src.release()
    back.release()


@pytest.mark.parametrize("kwargs, why", [
    (dict(dst_ids=[0, -1], src_ids=[0, 1]), "dst_ids[1]=-1"),
    (dict(dst_ids=[0, 1, 2], src_ids=[0, 1]), "dst_ids has 3 block ids and src_ids 2"),
    (dict(dst_ids=[], src_ids=[]), "no block ids"),
    (dict(block_bytes=0), "block_bytes must be > 0"),
    (dict(layers=3), "needs dst_layer_stride and src_layer_stride"),
    (dict(dst_block_stride=100), "dst_block_stride=100 is below block_bytes=4096"),
    (dict(dst_ids=[0, "x"], src_ids=[0, 1]), "dst_ids[1]='x'"),
    (dict(dst_ids=[0.5], src_ids=[0]), "dst_ids[0]=0.5"),
])
def test_bad_block_tables_are_refused_before_any_work(kwargs, why):
    args = dict(dst_base=0x10000, src_base=0x7f0000000000, dst_ids=[0, 1], src_ids=[3, 4], block_bytes=4096)
    args.update(kwargs)
    with pytest.raises(ferry.InvalidArgumentError) as e:
        ferry.copy_blocks(args.pop("dst_base"), args.pop("src_base"), args.pop("dst_ids"), args.pop("src_ids"),
                          args.pop("block_bytes"), **args)
    assert why in str(e.value)
