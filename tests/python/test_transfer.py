"""ferry.torch.to_host / to_device on what runs without a GPU: which `out=`
to_host takes (a structure of tensors, or a Snapshot, known by its class, not by
a `tensors` attribute). The GPU paths: test_copy.py."""

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
