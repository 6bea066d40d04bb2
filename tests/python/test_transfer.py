"""ferry.torch.to_host / to_device on what runs without a GPU: which `out=`
to_host takes (a structure of tensors, or a Snapshot, known by its class, not by
a `tensors` attribute). The GPU paths: test_copy.py."""

import importlib
import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(37, 13, generator=g), "b": torch.randint(-99, 99, (29,), generator=g, dtype=torch.int16),
            "e": torch.empty(0, 3)}


def test_a_snapshot_as_out_is_filled_in_place():
    snap = ft.snapshot(_state(1))
    sd = _state(2)
    back = ft.to_host(sd, out=snap)
    for k, v in sd.items():
        assert torch.equal(snap.tensors[k], v)
        assert back[k].data_ptr() == snap.tensors[k].data_ptr() or v.numel() == 0


class _LooksLikeASnapshot:
    """Any object with a `tensors` attribute: not a Snapshot."""

    def __init__(self, tensors):
        self.tensors = tensors


def test_an_object_with_a_tensors_attribute_is_not_taken_for_a_snapshot():
    sd = _state(3)
    fake = _LooksLikeASnapshot({k: torch.empty_like(v) for k, v in sd.items()})
    with pytest.raises(ferry.InvalidArgumentError, match="_LooksLikeASnapshot"):
        ft.to_host(sd, out=fake)


def test_out_of_another_kind_is_refused_with_its_type():
    with pytest.raises(ferry.InvalidArgumentError, match="out must be .*not int"):
        ft.to_host({"w": torch.ones(3)}, out=7)


# ---- GPU: one ferry copy_many per GPU ----------------------------------------------


def _count_calls(monkeypatch):
    """Counts the ferry copy_many calls (blocking and async) and their items, by
    wrapping the real functions (the copies still run)."""
    fc = importlib.import_module("ferry.copy")  # the module: ferry.copy, the attribute, is the function

    calls = []
    for name in ("copy_many", "copy_many_async"):
        real = getattr(fc, name)

        def spy(dsts, srcs, *a, _real=real, **kw):
            calls.append(len(dsts))
            return _real(dsts, srcs, *a, **kw)

        monkeypatch.setattr(fc, name, spy)
    return calls


def test_to_host_non_blocking_is_done_once_the_current_stream_is(gpu):
    """The copy runs on the tensor's current stream (torch's default stream here,
    handle 0), so synchronizing that stream waits for it, as after Tensor.to(
    non_blocking=True). A long kernel queued first keeps the copy in flight when
    the stream would be idle without it: a copy on a stream of its own (2026-11-28:
    ferry's per-direction stream) was still writing when the test read."""
    g = torch.Generator(device="cuda").manual_seed(11)
    t = torch.randint(0, 256, (256 << 20,), dtype=torch.uint8, device="cuda", generator=g)
    expected = t.cpu()
    torch.cuda._sleep(20_000_000)  # tens of ms of GPU time on the current stream
    back = ft.to_host({"t": t}, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(back["t"], expected)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_to_host_from_two_gpus_is_one_call_per_gpu(gpu, monkeypatch, non_blocking):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices (PyTorch sees {torch.cuda.device_count()})")
    g = torch.Generator().manual_seed(7)
    host = [torch.randn(1000 + 17 * i, generator=g) for i in range(6)]
    on_gpus = {f"t{i}": t.to(f"cuda:{i % 2}") for i, t in enumerate(host)}  # interleaved devices
    calls = _count_calls(monkeypatch)
    back = ft.to_host(on_gpus, non_blocking=non_blocking)
    for d in range(2):
        torch.cuda.current_stream(d).synchronize()
    assert calls == [3, 3]
    for i, t in enumerate(host):
        assert torch.equal(back[f"t{i}"], t)
