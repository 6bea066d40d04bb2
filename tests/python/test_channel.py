"""ferry.Channel from Python: errors and the GDRCopy probe everywhere; on a GPU,
ping/stats/close, and (with torch) writes, reads, fills, signal/wait on CUDA
tensors at odd sizes and offsets, thread order, and torch.cuda.synchronize()."""

import ctypes
import random
import threading
import time

import pytest

import ferry
from ferry._resolve import device_address
from ferry.channel import MAX_PAYLOAD, gdrcopy_status


def test_max_payload_is_64_kib():
    assert MAX_PAYLOAD == 64 * 1024


def test_gdrcopy_status_always_gives_a_reason():
    available, reason = gdrcopy_status()
    assert isinstance(available, bool)
    assert reason
    if not available:
        assert "/dev/gdrdrv" in reason or "libgdrapi.so.2" in reason or "gdr_open" in reason


def test_use_gdrcopy_without_gdrcopy_is_not_supported():
    available, reason = gdrcopy_status()
    if available:
        pytest.skip("GDRCopy is available here")
    with pytest.raises(ferry.NotSupportedError, match="GDRCopy is not available") as e:
        ferry.Channel(use_gdrcopy=True)
    assert reason in str(e.value)
    assert isinstance(e.value, NotImplementedError)


@pytest.mark.parametrize(
    "options, quoted",
    [({"idle_us": 0}, "idle_us=0"), ({"slots": 65}, "slots=65"), ({"timeout_ms": 0}, "timeout_ms=0")],
)
def test_bad_options_are_value_errors(options, quoted):
    with pytest.raises(ValueError, match=quoted):
        ferry.Channel(**options)


def test_without_a_device_creation_is_no_device_error():
    info = ferry.cuda_info()
    if info is not None and info.get("devices"):
        pytest.skip("a CUDA device is present")
    with pytest.raises(ferry.NoDeviceError, match="CUDA"):
        ferry.Channel()


def test_device_arguments_resolve_to_addresses():
    # The copy calls' reading (tests/python/test_resolve.py), GPU memory only.
    assert device_address(1234, "dev_ptr") == (1234, None)

    class FakeCpuTensor:
        is_cuda = False

    with pytest.raises(ferry.InvalidArgumentError, match="CPU tensor"):
        device_address(FakeCpuTensor(), "dev_ptr")

    class FakeArray:
        __cuda_array_interface__ = {"data": (8192, False), "shape": (3, 5), "typestr": "<f8", "version": 3}

    assert device_address(FakeArray(), "dev_ptr") == (8192, 120)
    with pytest.raises(ferry.InvalidArgumentError, match="expected an int address"):
        device_address("0x1000", "dev_ptr")
    with pytest.raises(ferry.InvalidArgumentError):
        device_address(True, "dev_ptr")


def test_ping_stats_and_close(gpu):
    with ferry.Channel(idle_us=200) as ch:
        assert ch.ping() > 0
        s = ch.stats()
        assert s["requests"] == 1 and s["launches"] == 1
        assert "idle_us=200" in repr(ch)
        with pytest.raises(ferry.InvalidArgumentError, match="int address"):
            ch.read(0x1000)
    assert ch.closed
    with pytest.raises(ferry.InvalidArgumentError, match="closed"):
        ch.ping()
    ch.close()  # idempotent


def test_idle_exit_then_relaunch(gpu):
    with ferry.Channel(idle_us=100) as ch:
        ch.ping()
        deadline = time.monotonic() + 2
        while ch.stats()["idle_exits"] < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert ch.stats()["idle_exits"] >= 1
        ch.ping()
        assert ch.stats()["launches"] == 2


@pytest.fixture
def torch_cuda(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


SIZES = [1, 2, 3, 15, 16, 17, 103, 104, 105, 255, 4096, 4097, 65535, 65536]

# The channel is not ordered with CUDA streams: tensors made or changed by torch
# (asynchronous kernels and copies) are settled with torch.cuda.synchronize()
# before a channel request touches them.


def test_write_and_read_tensors_at_odd_sizes_and_offsets(torch_cuda):
    torch = torch_cuda
    rng = random.Random(1)
    image = bytearray(rng.randbytes(MAX_PAYLOAD + 64))
    t = torch.frombuffer(bytearray(image), dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    with ferry.Channel() as ch:
        for n in SIZES:
            off = rng.randrange(32)
            data = rng.randbytes(n)
            ch.write(t[off : off + n], data)
            image[off : off + n] = data
            assert bytes(t.cpu().tolist()) == bytes(image), f"write n={n} off={off}"
            assert ch.read(t[off : off + n]) == data
            assert ch.read(t.data_ptr() + off, n) == data
            out = bytearray(n)
            ch.read_into(t[off : off + n], out)
            assert out == data


def test_fill_signal_and_wait_on_tensors(torch_cuda):
    torch = torch_cuda
    t = torch.zeros(1000, dtype=torch.uint8, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with ferry.Channel() as ch:
        ch.fill(t.data_ptr() + 3, 7, 100)
        expected = torch.zeros(1000, dtype=torch.uint8)
        expected[3:103] = 7
        assert torch.equal(t.cpu(), expected)
        ch.fill(t, 0xFF)
        assert int(t.min()) == 0xFF
        ch.signal(flag, 5)
        torch.cuda.synchronize()
        assert int(flag.item()) == 5
        assert ch.wait(flag, 5) is True
        started = time.monotonic()
        assert ch.wait(flag, 6, timeout_ms=1) is False
        assert time.monotonic() - started < 1.0


def test_cuda_array_interface_objects_and_bounds(torch_cuda):
    torch = torch_cuda
    t = torch.zeros(16, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()

    class Wrapped:
        __cuda_array_interface__ = t.__cuda_array_interface__

    with ferry.Channel() as ch:
        ch.write(Wrapped(), b"\x01\x00\x00\x00" * 16)
        assert int(t.sum()) == 16
        with pytest.raises(ferry.InvalidArgumentError, match="do not fit"):
            ch.write(Wrapped(), bytes(65))
        with pytest.raises(ferry.InvalidArgumentError, match="CPU tensor"):
            ch.write(torch.zeros(4), b"abcd")


def test_too_large_requests_name_the_copy_engine(torch_cuda):
    torch = torch_cuda
    t = torch.zeros(2 * MAX_PAYLOAD, dtype=torch.uint8, device="cuda")
    with ferry.Channel() as ch:
        with pytest.raises(ferry.InvalidArgumentError, match=r"ferry\.copy"):
            ch.write(t, bytes(MAX_PAYLOAD + 1))
        with pytest.raises(ValueError, match="64 KiB"):
            ch.read(t, MAX_PAYLOAD + 1)
        host = (ctypes.c_char * 64)()
        with pytest.raises(ferry.InvalidArgumentError, match="not CUDA device memory"):
            ch.write(ctypes.addressof(host), b"x")


def test_threads_keep_their_own_order(torch_cuda):
    torch = torch_cuda
    slots = torch.zeros(4 * 16, dtype=torch.int32, device="cuda")  # one int32 per thread, 64 B apart
    torch.cuda.synchronize()
    errors = []
    with ferry.Channel() as ch:

        def worker(i):
            addr = slots.data_ptr() + i * 64
            for k in range(1, 201):
                ch.write(addr, k.to_bytes(4, "little"))
                seen = int.from_bytes(ch.read(addr, 4), "little")
                if seen != k:
                    errors.append(f"thread {i} wrote {k}, read {seen}")
                    return

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors[0]
        assert slots.view(4, 16)[:, 0].tolist() == [200] * 4
        assert ch.stats()["requests"] == 4 * 200 * 2


def test_torch_synchronize_returns_while_the_channel_is_open(torch_cuda):
    torch = torch_cuda
    with ferry.Channel() as ch:
        ch.ping()
        started = time.monotonic()
        torch.cuda.synchronize()
        assert time.monotonic() - started < 1.0


def test_timing_loop_for_benchmarks(torch_cuda):
    torch = torch_cuda
    t = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with ferry.Channel() as ch:
        for op in ("write", "read", "fill"):
            ns = ch.time_ns(op, t, 4096, iterations=10)
            assert len(ns) == 10 and min(ns) > 0
        assert len(ch.time_ns("ping", iterations=3)) == 3
        with pytest.raises(ferry.InvalidArgumentError, match="expected write, read, fill or ping"):
            ch.time_ns("copy", t, 4, iterations=1)
