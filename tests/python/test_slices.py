"""load_safetensors(..., slices=): tensor-parallel parts of tensors.

CPU: the byte ranges of a slice (ferry.torch.slices.runs), gathered from a real
file safetensors wrote, equal numpy's slice of the tensor for every dimension,
odd shapes, 1-byte to 8-byte dtypes, empty and whole ranges; bad slices are
refused with what was wrong. GPU (skipped without a device): load_safetensors
with slices equals the torch slice of a plain load, bit for bit, with dtype=
casts, out= in place, keys=, and through a node pool on two ranks (each rank its
half of every sliced weight, test_node_load.py's rank helper).
"""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ferry.errors import InvalidArgumentError  # noqa: E402
from ferry.torch import slices  # noqa: E402
from ferry.torch.safetensors import _catalog, _resolve  # noqa: E402

DTYPES = [torch.uint8, torch.bfloat16, torch.float32, torch.int64]


def _random(rng, shape, dt):
    n = int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
    if n == 0:
        return torch.empty(shape, dtype=dt)
    return torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8)).view(dt).reshape(shape)


def _cat(path):
    files, it, ifl = _resolve(str(path))
    return _catalog(files, it, ifl)


def _specs(shape, rng):
    out = []
    for dim in range(len(shape)):
        n = shape[dim]
        a = int(rng.integers(0, n + 1))
        b = int(rng.integers(a, n + 1))
        out += [(dim, a, b), (dim - len(shape), 0, n), (dim, n // 3, n - n // 3 if n - n // 3 >= n // 3 else n // 3)]
    return out


def test_the_runs_of_a_slice_are_its_bytes_in_the_file(tmp_path):
    rng = np.random.default_rng(11)
    shapes = [(7,), (5, 3), (4, 9, 6), (2, 3, 5, 7), (1, 1, 13), (3, 0, 4)]
    tensors = {f"t{k}.{str(dt)[6:]}": _random(rng, shape, dt)
               for k, shape in enumerate(shapes) for dt in DTYPES}
    p = tmp_path / "m.safetensors"
    st.save_file(tensors, str(p))
    raw = p.read_bytes()
    cat = _cat(p)
    checked = 0
    for name, t in tensors.items():
        i = cat.index[name]
        for spec in _specs(tuple(t.shape), rng):
            got = slices.check({name: spec}, cat, [i])[i]
            starts, run = slices.runs(cat, i, got)
            data = b"".join(raw[s:s + run] for s in starts)
            want = t.narrow(got[0], got[1], got[2] - got[1]).contiguous()
            assert tuple(want.shape) == slices.shape(cat.shape[i], got), (name, spec)
            assert data == want.reshape(-1).view(torch.uint8).numpy().tobytes(), (name, spec)
            checked += 1
    assert checked > 150


def test_a_row_slice_is_one_range_and_a_column_slice_one_per_row(tmp_path):
    p = tmp_path / "w.safetensors"
    st.save_file({"w": torch.zeros(64, 48, dtype=torch.bfloat16)}, str(p))
    cat = _cat(p)
    i = cat.index["w"]
    starts, run = slices.runs(cat, i, (0, 16, 48))
    assert len(starts) == 1 and run == 32 * 48 * 2
    starts, run = slices.runs(cat, i, (1, 24, 48))
    assert len(starts) == 64 and run == 24 * 2 and starts[1] - starts[0] == 48 * 2


def test_numpy_and_other_index_integers_are_ints(tmp_path):
    """Issue 38 item 12: slices= took only int, against _args' rule (anything with
    __index__ is an integer). numpy integers of every width give the same ranges."""

    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    p = tmp_path / "w.safetensors"
    st.save_file({"w": torch.zeros(64, 48, dtype=torch.bfloat16)}, str(p))
    cat = _cat(p)
    i = cat.index["w"]
    for spec in [(np.int64(1), np.int32(24), np.uint16(48)), (np.int8(-1), np.uint64(24), np.int16(48)),
                 (Index(1), Index(24), Index(48)), [np.intp(1), 24, np.array(48)]]:
        got = slices.check({"w": spec}, cat, [i])[i]
        assert got == (1, 24, 48) and all(type(v) is int for v in got), spec
        assert slices.runs(cat, i, got) == slices.runs(cat, i, (1, 24, 48))


@pytest.mark.parametrize("spec, message", [
    ((0, 1), r"expected \(dim, start, stop\), three ints"),
    ((0, 1.0, 2), r"slices\['w'\] start=1.0: expected an integer \(dim, start, stop: three ints\)"),
    ((True, 0, 1), r"slices\['w'\] dim=True: expected .*three ints.* \(a bool is not a number\)"),
    ((0, np.float64(1), 2), "three ints"),
    ((0, 1, "2"), "stop='2'"),
    ((2, 0, 1), "dim 2 is outside the tensor's 2 dimensions"),
    ((-3, 0, 1), "dim -3 is outside"),
    ((0, 3, 2), r"\[3, 2\) is not a range of dimension 0"),
    ((1, 0, 49), r"\[0, 49\) is not a range of dimension 1 \(size 48"),
    ((0, -1, 2), "not a range"),
])
def test_bad_slices_are_refused_with_what_was_wrong(tmp_path, spec, message):
    p = tmp_path / "w.safetensors"
    st.save_file({"w": torch.zeros(64, 48), "s": torch.zeros(())}, str(p))
    cat = _cat(p)
    with pytest.raises(InvalidArgumentError, match=message):
        slices.check({"w": spec}, cat, [0, 1])


def test_slices_name_loaded_tensors_only(tmp_path):
    p = tmp_path / "w.safetensors"
    st.save_file({"w": torch.zeros(4, 4), "s": torch.zeros(())}, str(p))
    cat = _cat(p)
    with pytest.raises(InvalidArgumentError, match="no tensor of that name"):
        slices.check({"v": (0, 0, 1)}, cat, [0, 1])
    with pytest.raises(InvalidArgumentError, match="not among those loaded"):
        slices.check({"w": (0, 0, 1)}, cat, [cat.index["s"]])
    with pytest.raises(InvalidArgumentError, match="a scalar"):
        slices.check({"s": (0, 0, 1)}, cat, [0, 1])
    with pytest.raises(InvalidArgumentError, match="expected a dict"):
        slices.check([("w", (0, 0, 1))], cat, [0, 1])
    assert slices.check(None, cat, [0, 1]) == {}


# ---- GPU -------------------------------------------------------------------------------------


def _checkpoint(tmp_path, rng, shards=1):
    tensors = {
        "q.weight": _random(rng, (96, 80), torch.bfloat16),
        "mlp.up": torch.from_numpy(rng.standard_normal((37, 64), dtype=np.float32)),  # finite: cast and compared
        "mlp.down": _random(rng, (64, 37), torch.float32),
        "conv": _random(rng, (6, 5, 7, 3), torch.float16),
        "ids": _random(rng, (1001,), torch.int64),
        "norm": _random(rng, (80,), torch.float32),
    }
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, str(path))
    return str(path), tensors


def _part(t, spec):
    dim, a, b = spec
    return t.narrow(dim, a, b - a)


def _same_bytes(got, want):
    """Bit for bit (random bytes hold NaNs, which torch.equal never calls equal)."""
    return got.shape == want.shape and got.dtype == want.dtype and torch.equal(
        got.cpu().contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))


def test_slices_load_bit_equal_to_the_torch_slice(gpu, tmp_path):
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(3)
    path, ref = _checkpoint(tmp_path, rng)
    specs = {"q.weight": (1, 40, 80), "mlp.up": (0, 5, 23), "mlp.down": (-1, 0, 19), "conv": (2, 1, 6),
             "ids": (0, 999, 1001)}
    got = load_safetensors(path, device=0, slices=specs)
    assert set(got) == set(ref)
    for name, t in ref.items():
        want = _part(t, specs[name]) if name in specs else t
        assert got[name].is_cuda and got[name].dtype == t.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name].cpu().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))
    # dtype= casts the slice; keys= with slices; an empty slice
    half = load_safetensors(path, device=0, keys=["q.weight", "ids"], slices={"q.weight": (0, 7, 7)},
                            dtype=torch.float16)
    assert half["q.weight"].shape == (0, 80) and half["q.weight"].dtype == torch.float16
    assert _same_bytes(half["ids"], ref["ids"])
    cast = load_safetensors(path, device=0, keys=["mlp.up"], slices={"mlp.up": (1, 3, 50)}, dtype=torch.bfloat16)
    assert torch.equal(cast["mlp.up"].cpu(), _part(ref["mlp.up"], (1, 3, 50)).to(torch.bfloat16))


def test_slices_into_out_in_place_and_a_wrong_shape_refused(gpu, tmp_path):
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(4)
    path, ref = _checkpoint(tmp_path, rng)
    out = {n: torch.full_like(t, 7).cuda() for n, t in ref.items() if n != "q.weight"}
    out["q.weight"] = torch.full((96, 40), 7, dtype=torch.bfloat16, device="cuda")
    keep = out["q.weight"].data_ptr()
    load_safetensors(path, out=out, slices={"q.weight": (1, 0, 40)})
    assert out["q.weight"].data_ptr() == keep
    assert _same_bytes(out["q.weight"], _part(ref["q.weight"], (1, 0, 40)))
    assert _same_bytes(out["norm"], ref["norm"])
    with pytest.raises(InvalidArgumentError, match=r"sliced by \(1, 0, 41\) has shape \[96, 41\]"):
        load_safetensors(path, out=out, slices={"q.weight": (1, 0, 41)})
