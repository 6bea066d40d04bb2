"""ferry._resolve: copy and channel arguments read one way (the native
resolve_copy_arg: address, size, device), with the same errors, on device-array
stand-ins, real buffers and (with torch) real tensors; the channel refuses host
memory."""

import ctypes
import random

import pytest

import ferry
from ferry._resolve import device_address, resolve


class FakeArray:
    def __init__(self, ptr, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def test_copy_and_channel_read_device_arrays_alike():
    rng = random.Random(7)
    for _ in range(100):
        ptr = rng.randrange(1, 1 << 47)
        shape = tuple(rng.randrange(1, 9) for _ in range(rng.randrange(1, 4)))
        typestr = rng.choice(("<f4", "<f8", "|u1", "<c16", "|b1", "<i2"))
        n = int(typestr[2:])
        for s in shape:
            n *= s
        a = FakeArray(ptr, shape, typestr)
        assert resolve(a, writable=False) == (ptr, n, None)
        assert device_address(a, "dev_ptr") == (ptr, n)
    bad = FakeArray(4096, (3, 5), "<f4", strides=(40, 8))
    for call in (lambda: resolve(bad, writable=True), lambda: device_address(bad, "dev_ptr")):
        with pytest.raises(ferry.InvalidArgumentError, match="C-contiguous"):
            call()


def test_host_memory_is_for_copies_only():
    data = bytearray(random.randbytes(random.randrange(1, 4096)))
    address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    assert resolve(data, writable=True) == (address, len(data), None)
    with pytest.raises(ferry.InvalidArgumentError, match="expected an int address"):
        device_address(data, "dev_ptr")
    with pytest.raises(ferry.InvalidArgumentError, match="not a writable contiguous buffer"):
        resolve(bytes(data), writable=True)

    class FakeCpuTensor:
        is_cuda = False

    with pytest.raises(ferry.InvalidArgumentError, match="CPU tensor"):
        device_address(FakeCpuTensor(), "dev_ptr")


def test_int_addresses_and_what_is_not_an_address():
    assert device_address(1234, "dev_ptr") == (1234, None)
    assert resolve(1234) == (1234, None, None)
    for bad in (True, "0x1000", 1.5, None):
        with pytest.raises(ferry.InvalidArgumentError):
            device_address(bad, "dev_ptr")
        with pytest.raises(ferry.InvalidArgumentError):
            resolve(bad)


def test_torch_tensors_are_read_alike():
    torch = pytest.importorskip("torch")
    t = torch.randn(37, 3, dtype=torch.float64)
    assert resolve(t) == (t.data_ptr(), 37 * 3 * 8, None)
    with pytest.raises(ferry.InvalidArgumentError, match="CPU tensor"):
        device_address(t, "dev_ptr")
    with pytest.raises(ferry.InvalidArgumentError, match="contiguous"):
        resolve(t.t())
