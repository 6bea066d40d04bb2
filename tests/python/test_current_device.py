"""No ferry call changes the calling thread's current CUDA device: with the last GPU
current, work on GPU 0 through every Python entry point leaves the last one current,
so PyTorch's next `.cuda()` still goes where the user said. (On the 2-GPU machine,
reading device facts once left the last GPU current and tensors went astray.)
Needs two GPUs; skips, saying so, elsewhere."""

import pytest

import ferry

MiB = 1 << 20


@pytest.fixture
def two_gpus(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices (PyTorch sees {torch.cuda.device_count()})")
    return torch


@pytest.fixture
def last_gpu_current(two_gpus):
    """Makes the last GPU current for the test, then gives back the one that was."""
    torch = two_gpus
    before = torch.cuda.current_device()
    torch.cuda.set_device(torch.cuda.device_count() - 1)
    yield torch
    torch.cuda.set_device(before)


def test_calls_on_gpu_zero_leave_the_callers_gpu_current(last_gpu_current, tmp_path):
    torch = last_gpu_current
    mine = torch.cuda.device_count() - 1
    g = torch.Generator().manual_seed(3)
    host = torch.randint(0, 256, (5 * MiB + 3,), dtype=torch.uint8, generator=g)

    def still_mine(what):
        assert torch.cuda.current_device() == mine, f"{what} left GPU {torch.cuda.current_device()} current"

    ferry.cuda_info()
    still_mine("ferry.cuda_info()")
    pool = ferry.PinnedPool(device=0)
    buf = pool.alloc(3 * MiB)
    still_mine("PinnedPool(device=0).alloc")
    del buf
    pool.trim()
    still_mine("PinnedPool(device=0).trim")
    with ferry.register(host, device=0):
        still_mine("ferry.register(device=0)")
    still_mine("a registration for GPU 0 released")

    dev = torch.full((host.numel(),), 0xEE, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize(0)
    ferry.copy(dev, host)
    back = torch.full_like(host, 0x11)
    ferry.copy(back, dev)
    still_mine("ferry.copy to and from GPU 0")
    assert torch.equal(back, host)

    from ferry.torch import to_device

    moved = to_device({"a": host[:1000], "b": host[7:7 + MiB]}, "cuda:0")
    still_mine("ferry.torch.to_device(..., 'cuda:0')")
    assert moved["a"].device.index == 0 and torch.equal(moved["b"].cpu(), host[7:7 + MiB])

    with ferry.Channel(device=0) as ch:
        ch.write(dev[5:], b"\x01\x02\x03")
        still_mine("Channel(device=0).write")
    torch.cuda.synchronize(0)
    assert dev[5:8].tolist() == [1, 2, 3]

    save_file = pytest.importorskip("safetensors.torch").save_file
    from ferry.torch import load_safetensors

    path = tmp_path / "w.safetensors"
    save_file({"w": host[:4096].view(torch.float32).reshape(32, 32)}, str(path))
    loaded = load_safetensors(path, device="cuda:0")
    still_mine("load_safetensors(..., device='cuda:0')")
    assert torch.equal(loaded["w"].cpu().view(torch.uint8).flatten(), host[:4096])
