"""ferry.load and ferry.torch.load_safetensors.

CPU: ferry's header parser against files safetensors itself wrote (every dtype
it writes; offsets checked against the bytes), hand-written damaged files and
indexes (each error names the file and the tensor), path resolution (files,
shards, index, directory), key selection and the checks of ``out``.
GPU (skipped without a device): random checkpoints (odd shapes, every dtype,
empty and 0-d tensors, many shards, an index, subsets of keys, ``out=`` in
place, dtype casts, O_DIRECT, thousands of small tensors in shards)
compared bit for bit with
safetensors' own CPU loader; a damaged shard fails the whole load and leaves
nothing allocated; a transformers model loads through ``out=state_dict()``.
"""

from __future__ import annotations

import errno
import json
import os
import struct

import pytest

np = pytest.importorskip("numpy")

import ferry  # noqa: E402
import ferry.load as fl  # noqa: E402
from ferry.errors import InvalidArgumentError  # noqa: E402

# ---- files written by hand ---------------------------------------------------


def _file(header: dict | str, data: bytes) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw + data


def _t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def test_parser_reads_a_hand_written_file(tmp_path):
    data = bytes(range(30))
    h = {"__metadata__": {"format": "pt"}, "b": _t("F32", [2], 8, 16), "a": _t("I64", [], 0, 8),
         "e": _t("BF16", [0, 3], 16, 16), "c": _t("F8_E4M3", [2, 7], 16, 30)}
    p = tmp_path / "m.safetensors"
    p.write_bytes(_file(h, data))
    got = fl.read_safetensors_header(p)
    assert got["metadata"] == {"format": "pt"}
    assert [t[0] for t in got["tensors"]] == ["a", "b", "e", "c"]  # file order
    assert got["tensors"][1] == ("b", "F32", [2], 8, 16)
    assert got["data_offset"] == 8 + got["header_bytes"]
    assert got["file_bytes"] == p.stat().st_size
    assert fl.parse_safetensors_header(p.read_bytes())["tensors"] == got["tensors"]


DAMAGED = [
    ("truncated", b"\x01\x02\x03", "truncated: 3 bytes"),
    ("length past end", struct.pack("<Q", 999) + b"{}", "header length 999 runs past the end"),
    ("bad json", _file('{"a":', b""), "invalid JSON"),
    ("unknown dtype", _file({"w": _t("F12", [1], 0, 1)}, b"\0"), "tensor 'w': unknown dtype 'F12'"),
    ("size mismatch", _file({"w": _t("F32", [2], 0, 6)}, b"\0" * 6), "tensor 'w': shape [2] of F32 is 8 bytes"),
    ("past the end", _file({"w": _t("F32", [2], 0, 8)}, b"\0" * 4), "tensor 'w': data_offsets [0, 8] run past the end"),
    ("overlap", _file({"a": _t("U8", [4], 0, 4), "b": _t("U8", [4], 2, 6)}, b"\0" * 6), "tensor 'b': data_offsets [2, 6] overlap tensor 'a'"),
    ("gap", _file({"a": _t("U8", [4], 0, 4), "b": _t("U8", [4], 6, 10)}, b"\0" * 10), "leave a gap of 2 bytes"),
    ("end before begin", _file({"a": _t("U8", [0], 3, 2)}, b"\0" * 3), "end before begin"),
    ("duplicate key", _file('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"), "duplicate key 'a'"),
    ("trailing bytes", _file({"a": _t("U8", [1], 0, 1)}, b"\0\0"), "1 bytes no tensor describes"),
    ("metadata not strings", _file({"__metadata__": {"k": 1}}, b""), "'k': expected a string"),
]


@pytest.mark.parametrize("what,blob,expect", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_headers_name_file_and_tensor(tmp_path, what, blob, expect):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(blob)
    with pytest.raises(InvalidArgumentError) as e:
        fl.read_safetensors_header(p)
    assert str(e.value).startswith(str(p) + ": "), str(e.value)
    assert expect in str(e.value)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        fl.parse_safetensors_header(blob, "x")


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError) as e:
        fl.read_safetensors_header(tmp_path / "nope.safetensors")
    assert "nope.safetensors" in str(e.value)
    assert e.value.errno == errno.ENOENT  # every OS error from the native layer carries its errno


def test_shard_index_parser():
    pairs = fl.parse_shard_index('{"metadata":{"total_size":3},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}')
    assert pairs == [("a", "s1.safetensors"), ("b", "s2.safetensors")]
    for bad, msg in [('{"weight_map":{"a":"/abs"}}', "absolute path"), ('{"weight_map":{"a":"../x"}}', "'..'"),
                     ('{"metadata":{}}', 'no "weight_map"'), ('{"weight_map":{"a":3}}', "expected a file name")]:
        with pytest.raises(InvalidArgumentError, match="i.json: ") as e:
            fl.parse_shard_index(bad, "i.json")
        assert msg in str(e.value)


# ---- against files safetensors wrote -------------------------------------------


def test_parser_agrees_with_safetensors_on_every_numpy_dtype(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    rng = np.random.default_rng(5)
    arrays = {}
    for i, dt in enumerate([np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.float16, np.int32, np.uint32,
                            np.float32, np.float64, np.int64, np.uint64]):
        shape = [(), (0,), (7,), (3, 5), (2, 0, 4), (1, 3, 1, 9)][i % 6]
        a = rng.integers(0, 256, size=int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize, dtype=np.uint8)
        arrays[f"t{i}.{np.dtype(dt).name}"] = a.view(dt).reshape(shape) if dt is not np.bool_ else (a % 2).astype(np.bool_).reshape(shape)
    p = tmp_path / "np.safetensors"
    st_numpy.save_file(arrays, str(p), metadata={"who": "numpy"})
    h = fl.read_safetensors_header(p)
    raw = p.read_bytes()
    assert h["metadata"] == {"who": "numpy"}
    assert {t[0] for t in h["tensors"]} == set(arrays)
    for name, dtype, shape, b, e in h["tensors"]:
        a = arrays[name]
        assert shape == list(a.shape), name
        assert raw[h["data_offset"] + b : h["data_offset"] + e] == a.tobytes(), name


# ---- path resolution, selection, out checks (no GPU) --------------------------

def _write(path, tensors: dict, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} in that order."""
    h, data = {}, b""
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, (dt, shape, blob) in tensors.items():
        h[name] = _t(dt, shape, len(data), len(data) + len(blob))
        data += blob
    path.write_bytes(_file(h, data))
    return str(path)


def test_paths_shards_index_and_directory(tmp_path):
    from ferry.torch.safetensors import _catalog, _resolve

    s1 = _write(tmp_path / "m-1.safetensors", {"a": ("U8", [2], b"ab"), "b": ("U8", [1], b"c")})
    s2 = _write(tmp_path / "m-2.safetensors", {"c": ("I16", [2], b"wxyz")})
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "m-1.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}))
    for given in ([s1, s2], str(idx), str(tmp_path)):
        files, tensors, shard_of = _resolve(given)
        assert files == [s1, s2], given
        cat = _catalog(files, tensors, shard_of)
        assert cat.names == ["a", "b", "c"]
        c = cat.index["c"]
        assert cat.file[c] == 1 and cat.nbytes[c] == 4 and cat.shape[c] == (2,) and cat.dtype[c] == "I16"
    idx.write_text(json.dumps({"weight_map": {"a": "m-2.safetensors", "c": "m-2.safetensors"}}))
    files, tensors, shard_of = _resolve(str(idx))
    with pytest.raises(InvalidArgumentError, match="maps tensor 'a' to .*m-2.safetensors, but it is in .*m-1"):
        _catalog(files + [s1], tensors, shard_of)
    other = tmp_path / "other.index.json"
    other.write_text(json.dumps({"weight_map": {"a": "m-1.safetensors"}}))
    with pytest.raises(InvalidArgumentError, match="tensor 'a' is mapped to .*m-1.safetensors and, by another index"):
        _resolve([str(idx), str(other)])
    _write(tmp_path / "m-3.safetensors", {"a": ("U8", [2], b"zz")})
    with pytest.raises(InvalidArgumentError, match="tensor 'a' is in two files"):
        _catalog([s1, str(tmp_path / "m-3.safetensors")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgumentError, match="no model.safetensors.index.json and no"):
        _resolve(str(empty))


def test_catalog_of_thousands_of_tensors_is_columns(tmp_path):
    """5,000 tensors in 3 shards and an index: one native call, every column
    right (offsets from the file's start: the bytes there are the tensor's)."""
    from ferry.load import read_shard_index
    from ferry.torch.safetensors import _catalog, _resolve

    rng = np.random.default_rng(5)
    weight_map, blobs = {}, {}
    for s in range(3):
        tensors = {}
        for k in range(s, 5000, 3):
            n = int(rng.integers(1, 40))
            blob = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            tensors[f"t{k}"] = ("U8", [n], blob)
            blobs[f"t{k}"] = blob
            weight_map[f"t{k}"] = f"m-{s}.safetensors"
        _write(tmp_path / f"m-{s}.safetensors", tensors)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shards, names, of = read_shard_index(tmp_path / "model.safetensors.index.json")
    assert shards == ["m-0.safetensors", "m-1.safetensors", "m-2.safetensors"]
    assert [shards[k] for k in of] == [weight_map[n] for n in names]
    files, tensors, shard_of = _resolve(str(tmp_path))
    cat = _catalog(files, tensors, shard_of)
    assert sorted(cat.names) == sorted(blobs) and len(cat.index) == 5000
    data = [open(f, "rb").read() for f in files]
    for i, name in enumerate(cat.names):
        assert data[cat.file[i]][cat.offset[i] : cat.offset[i] + cat.nbytes[i]] == blobs[name]
        assert cat.shape[i] == (len(blobs[name]),)


def _cat(files, entries):
    from ferry.torch.safetensors import _Catalog

    return _Catalog.of(files, entries)


def test_selection_and_strictness():
    from ferry.torch.safetensors import _select

    def cat_of(names):
        return _cat(["f"], [(n, 0, "U8", [1], 0, 1) for n in names])

    def sel(cat, *a):
        return [cat.names[i] for i in _select(cat, *a)]

    cat = cat_of("abc")
    assert sel(cat, None, None, True) == ["a", "b", "c"]
    assert sel(cat, ["c", "a", "c"], None, True) == ["c", "a"]
    assert sel(cat, "b", None, True) == ["b"]
    with pytest.raises(InvalidArgumentError, match="1 key\\(s\\) not in the checkpoint: 'zz'"):
        _select(cat, ["a", "zz"], None, True)
    torch = pytest.importorskip("torch")
    out = {"a": torch.zeros(1, dtype=torch.uint8), "b": torch.zeros(1, dtype=torch.uint8)}
    with pytest.raises(InvalidArgumentError, match="checkpoint not in out: 'c'"):
        _select(cat, None, out, True)
    assert sel(cat, None, out, False) == ["a", "b"]
    out["d"] = torch.zeros(1)
    with pytest.raises(InvalidArgumentError, match="1 tensor\\(s\\) of out not in the checkpoint: 'd'"):
        _select(cat_of("ab"), None, out, True)
    out["d"] = out["a"]  # a tied weight: same storage as a loaded tensor
    assert sel(cat_of("ab"), None, out, True) == ["a", "b", ]


def test_out_checks_shape_dtype_and_casts():
    torch = pytest.importorskip("torch")
    from ferry.torch.safetensors import _targets

    files = ["f.safetensors"]
    cat = _cat(files, [("w", 0, "BF16", [2, 3], 0, 12), ("i", 0, "I64", [4], 12, 44),
                       ("q", 0, "F8_E4M3", [8], 44, 52), ("f4", 0, "F4", [2, 6], 52, 58)])
    cpu = torch.device("cpu")
    has_f4 = hasattr(torch, "float4_e2m1fn_x2")  # PyTorch 2.6 has none: F4 is refused, saying so
    if not has_f4:
        with pytest.raises(InvalidArgumentError, match="tensor 'f4': safetensors dtype F4 has no dtype in PyTorch"):
            _targets(torch, range(4), cat, torch.float32, None, cpu)
    got = _targets(torch, range(4 if has_f4 else 3), cat, torch.float32, None, cpu)
    assert got["w"].dtype == torch.float32  # cast
    assert got["i"].dtype == torch.int64  # integers keep theirs
    assert got["q"].dtype == torch.float8_e4m3fn  # 8-bit floats too
    assert not has_f4 or list(got["f4"].shape) == [2, 3]  # two F4 values per element
    w = [cat.index["w"]]
    out = {"w": torch.empty(3, 2, dtype=torch.bfloat16)}
    with pytest.raises(InvalidArgumentError, match="tensor 'w' has shape \\[2, 3\\] but out\\['w'\\] has \\[3, 2\\]"):
        _targets(torch, w, cat, None, out, cpu)
    out = {"w": torch.empty(2, 3, dtype=torch.float16)}
    with pytest.raises(InvalidArgumentError, match="loads as torch.bfloat16 but out\\['w'\\] is torch.float16 \\(dtype=torch.float16 casts"):
        _targets(torch, w, cat, None, out, cpu)
    assert _targets(torch, w, cat, torch.float16, out, cpu)["w"] is out["w"]
    with pytest.raises(InvalidArgumentError, match="is on cpu, the load goes to meta"):
        _targets(torch, w, cat, torch.float16, out, torch.device("meta"))
    bad = _cat(files, [("x", 0, "F6_E2M3", [4], 0, 3)])
    with pytest.raises(InvalidArgumentError, match="tensor 'x': safetensors dtype F6_E2M3 has no dtype in PyTorch"):
        _targets(torch, [0], bad, None, None, cpu)
    odd = _cat(files, [("x", 0, "F4", [3, 3], 0, 5)])
    with pytest.raises(InvalidArgumentError, match="F4 shape \\[3, 3\\] needs an even last dimension" if has_f4
                       else "safetensors dtype F4 has no dtype in PyTorch"):
        _targets(torch, [0], odd, None, None, cpu)


def test_the_first_load_of_many_new_tensors_takes_an_eighth_of_the_bytes():
    from ferry.torch import safetensors as fs

    def head(sizes):
        cat = _cat(["f"], [(f"t{i}", 0, "U8", [n], 0, n) for i, n in enumerate(sizes)])
        return fs._overlap_head(cat, list(range(len(sizes))))

    assert head([1] * 800) == 100
    assert head([1000] + [1] * 400) == 1  # one large first tensor: it alone
    assert head([0] * 399 + [5]) == 399  # never all: the allocation of the rest must overlap something
    assert head([1] * 2) == 1
    assert head([3, 0, 0, 0]) == 1


def test_load_refuses_a_cpu_device(tmp_path):
    pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    p = _write(tmp_path / "m.safetensors", {"a": ("U8", [2], b"ab")})
    with pytest.raises(InvalidArgumentError, match="loads to CUDA devices"):
        load_safetensors(p, device="cpu")
    with pytest.raises(InvalidArgumentError, match="not in the checkpoint"):
        load_safetensors(p, keys=["nope"])


def test_the_mapped_share_is_gone():
    # issue 24 item 8: slower than staging at every share measured; removed
    with pytest.raises(TypeError):
        fl.Loader(0, mapped_share=0.5)
    assert "mapped_share" not in fl.Loader.__init__.__code__.co_varnames


def test_loader_without_a_device_says_so():
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present (GPU tests below load)")
    with pytest.raises(ferry.NoDeviceError):
        fl.Loader(0)
    with pytest.raises(InvalidArgumentError, match="slot_bytes=5000"):
        fl.Loader(0, slot_bytes=5000)  # options are checked before the device


# ---- GPU: bit for bit against safetensors --------------------------------------

ALL_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32", "uint32", "float32",
              "float64", "int64", "uint64", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
              "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn_x2"]


def _random_tensors(torch, rng, count, names_prefix="t"):
    """Random bytes viewed as each dtype, odd shapes, 0-d and empty tensors."""
    dtypes = [getattr(torch, d) for d in ALL_DTYPES if hasattr(torch, d)]
    shapes = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (33, 17), (1, 3, 1, 9), (1000, 129), (4097,)]
    out = {}
    for i in range(count):
        dt = dtypes[i % len(dtypes)]
        shape = shapes[int(rng.integers(len(shapes)))]
        if str(dt).startswith("torch.float4"):
            # safetensors 0.8 refuses to write packed 4-bit tensors of some shapes (0-d,
            # odd last dimensions: "does not end up at a byte boundary", H200 run).
            shape = (2, 16)
        n = 1
        for s in shape:
            n *= s
        size = torch.empty((), dtype=dt).element_size()
        raw = torch.from_numpy(rng.integers(0, 256, size=n * size, dtype=np.uint8))
        if n == 0:
            t = torch.empty(shape, dtype=dt)
        elif dt == torch.bool:
            t = (raw % 2).bool().reshape(shape)
        else:
            t = raw.view(dt).reshape(shape)
        out[f"{names_prefix}{i}.{str(dt).removeprefix('torch.')}"] = t
    return out


def _bytes_view(t):
    torch = pytest.importorskip("torch")
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.fixture
def st_torch():
    return pytest.importorskip("safetensors.torch", reason="safetensors is not installed")


@pytest.mark.parametrize("threads,direct", [(6, "never"), (6, "always"), (1, "never"), (16, "auto")])
def test_random_checkpoint_bit_for_bit(gpu, tmp_path, st_torch, threads, direct):
    torch = pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(threads + len(direct))
    tensors = _random_tensors(torch, rng, 60)
    p = tmp_path / "r.safetensors"
    st_torch.save_file(tensors, str(p))
    ref = st_torch.load_file(str(p))
    loader = fl.Loader(0, staging_bytes=8 << 20, slot_bytes=1 << 20, threads=threads, direct_io=direct)
    got = load_safetensors(str(p), loader=loader)
    assert list(got) == list(ref) or set(got) == set(ref)
    for name, t in ref.items():
        g = got[name]
        assert g.is_cuda and g.dtype == t.dtype and g.shape == t.shape, name
        assert torch.equal(_bytes_view(g).cpu(), _bytes_view(t)), name


def test_thousands_of_small_tensors_in_shards(gpu, tmp_path, st_torch):
    """A MoE-like checkpoint: 4,000 small tensors of mixed dtypes and odd
    shapes in 4 shards with an index; all of it, a subset of keys, and
    ``out=`` in place (poisoned), each bit for bit."""
    torch = pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(17)
    dtypes = [torch.bfloat16, torch.float32, torch.float16, torch.int8]
    weight_map, ref = {}, {}
    for s in range(4):
        part = {}
        for k in range(s, 4000, 4):
            shape = (int(rng.integers(1, 40)), int(rng.integers(1, 70)))
            dt = dtypes[k % len(dtypes)]
            t = torch.from_numpy(rng.integers(-100, 100, shape, dtype=np.int8)).to(dt) if dt == torch.int8 else \
                torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dt)
            part[f"model.layers.{k // 200}.mlp.experts.{k % 200}.w"] = t
        name = f"model-{s + 1:05d}-of-00004.safetensors"
        st_torch.save_file(part, str(tmp_path / name))
        weight_map.update({n: name for n in part})
        ref.update(part)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = load_safetensors(str(tmp_path))
    assert set(got) == set(ref)
    for name, t in ref.items():
        assert got[name].dtype == t.dtype and torch.equal(_bytes_view(got[name]).cpu(), _bytes_view(t)), name
    keys = sorted(ref)[::7]
    sub = load_safetensors(str(tmp_path), keys=keys)
    assert list(sub) == keys
    out = {n: torch.full_like(t, 7, device="cuda") for n, t in ref.items()}
    load_safetensors(str(tmp_path), out=out)
    for name, t in ref.items():
        assert torch.equal(_bytes_view(out[name]).cpu(), _bytes_view(t)), name


def test_many_shards_index_keys_out_and_cast(gpu, tmp_path, st_torch):
    torch = pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(3)
    weight_map, ref = {}, {}
    for s in range(7):
        part = _random_tensors(torch, rng, 9, names_prefix=f"s{s}.")
        name = f"model-{s + 1:05d}-of-00007.safetensors"
        st_torch.save_file(part, str(tmp_path / name))
        ref.update(part)
        weight_map.update({k: name for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = load_safetensors(tmp_path / "model.safetensors.index.json")
    assert set(got) == set(ref)
    for k in ref:
        assert torch.equal(_bytes_view(got[k]).cpu(), _bytes_view(ref[k])), k
    # a subset of keys, from the directory
    keys = sorted(ref)[::5]
    sub = load_safetensors(tmp_path, keys=keys)
    assert list(sub) == keys
    for k in keys:
        assert torch.equal(_bytes_view(sub[k]).cpu(), _bytes_view(ref[k])), k
    # out= in place: poisoned tensors filled, the same objects returned
    out = {k: torch.empty_like(ref[k], device="cuda") for k in keys}
    for t in out.values():
        _bytes_view(t).fill_(0xA5)
    ids = {k: id(v) for k, v in out.items()}
    filled = load_safetensors(tmp_path, keys=keys, out=out)
    for k in keys:
        assert id(filled[k]) == ids[k]
        assert torch.equal(_bytes_view(out[k]).cpu(), _bytes_view(ref[k])), k
    # dtype casts on the GPU: 16-bit-and-wider floats follow dtype, the rest keep theirs
    cast = load_safetensors(tmp_path, dtype=torch.float64)
    for k, t in ref.items():
        if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            assert cast[k].dtype == torch.float64
            # exact, NaN where the bytes made a NaN
            assert torch.allclose(cast[k].cpu(), t.to(torch.float64), rtol=0, atol=0, equal_nan=True), k
        else:
            assert cast[k].dtype == t.dtype, k


def test_a_damaged_shard_fails_the_load_and_keeps_nothing(gpu, tmp_path, st_torch):
    torch = pytest.importorskip("torch")
    from ferry.torch import load_safetensors

    rng = np.random.default_rng(8)
    a = {"big": torch.from_numpy(rng.integers(0, 256, size=64 << 20, dtype=np.uint8))}
    st_torch.save_file(a, str(tmp_path / "a.safetensors"))
    b = {"w": torch.from_numpy(rng.integers(0, 256, size=1 << 20, dtype=np.uint8))}
    st_torch.save_file(b, str(tmp_path / "b.safetensors"))
    blob = (tmp_path / "b.safetensors").read_bytes()
    (tmp_path / "b.safetensors").write_bytes(blob[:-100])  # cut inside w's data
    # c: a dtype PyTorch lacks, found after a's tensor was allocated
    _write(tmp_path / "c.safetensors", {"x": ("F6_E2M3", [4], b"abc")})
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for second, expect in [("b", "b.safetensors: tensor 'w': data_offsets"), ("c", "c.safetensors: tensor 'x': safetensors dtype F6_E2M3")]:
        with pytest.raises(InvalidArgumentError) as e:
            load_safetensors([tmp_path / "a.safetensors", tmp_path / f"{second}.safetensors"])
        assert expect in str(e.value)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before, "a failed load kept device memory"
    assert torch.equal(load_safetensors(tmp_path / "a.safetensors")["big"].cpu(), a["big"])


def test_progress_and_stats_of_a_plain_loader(gpu, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    data = rng.integers(0, 256, size=(3 << 20) + 5, dtype=np.uint8).tobytes()
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    dst = torch.empty(len(data), dtype=torch.uint8, device="cuda")
    loader = fl.Loader(0, staging_bytes=2 << 20, slot_bytes=1 << 20, progress=False)
    st = loader.load([p], [(0, 0, len(data), dst.data_ptr())])
    assert st["bytes"] == len(data) and st["staged_bytes"] == st["read_bytes"]
    assert bytes(dst.cpu().numpy()) == data
    with pytest.raises(InvalidArgumentError, match="runs past the end of the file"):
        loader.load([p], [(0, 10, len(data), dst.data_ptr())])


def test_transformers_model_loads_through_out_state_dict(gpu, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ferry.torch import load_safetensors

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    src = transformers.AutoModelForCausalLM.from_config(cfg)
    src.save_pretrained(tmp_path, max_shard_size="2MB")  # safetensors shards and an index
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to("cuda")
    model = transformers.AutoModelForCausalLM.from_config(cfg).to("cuda")
    files = sorted(str(p) for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 1
    load_safetensors(files, out=model.state_dict())
    for (k, a), (k2, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.randint(0, 1000, (2, 16), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_threads_share_the_default_loader(gpu, tmp_path, st_torch):
    torch = pytest.importorskip("torch")
    import threading

    from ferry.torch import load_safetensors

    rng = np.random.default_rng(12)
    files = []
    for i in range(4):
        t = {f"w{i}": torch.from_numpy(rng.integers(0, 256, size=(5 << 20) + i, dtype=np.uint8))}
        st_torch.save_file(t, str(tmp_path / f"{i}.safetensors"))
        files.append((tmp_path / f"{i}.safetensors", t))
    errors, results = [], {}

    def work(i):
        try:
            for _ in range(3):
                results[i] = load_safetensors(files[i][0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (_, ref) in enumerate(files):
        assert torch.equal(results[i][f"w{i}"].cpu(), ref[f"w{i}"])


def test_catalog_records_each_files_identity(tmp_path):
    """The catalog keeps, per file, the (device, inode, size, mtime_ns) of the file its
    header was read from: what the load compares with the files it opens."""
    from ferry.torch.safetensors import _catalog

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    paths = []
    for k in range(3):
        p = tmp_path / f"i{k}.safetensors"
        n = int(rng.integers(1, 5000))
        _write(p, {f"t{k}": ("U8", [n], rng.integers(0, 256, n, dtype=np.uint8).tobytes())})
        paths.append(str(p))
    cat = _catalog(paths)
    for p, ident in zip(paths, cat.identity):
        st = os.stat(p)
        assert tuple(ident) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), p


def _two_versions(torch, st_torch, tmp_path, seed):
    """A checkpoint file and a replacement (other tensors: other dtypes, shapes, bytes)."""
    old = _random_tensors(torch, np.random.default_rng(seed), 20)
    new = _random_tensors(torch, np.random.default_rng(seed + 1), 20)
    p, q = tmp_path / "m.safetensors", tmp_path / "m.new"
    st_torch.save_file(old, str(p))
    st_torch.save_file(new, str(q))
    return p, q, new


def test_a_file_renamed_over_during_the_load_gives_the_new_files_tensors(gpu, tmp_path, st_torch, monkeypatch):
    """A new checkpoint renamed over the file after its header was read (the exact
    window a saver's atomic rename can hit): the load notices the other inode, loads
    again, and every tensor is the new file's, none the old one's."""
    torch = pytest.importorskip("torch")
    import ferry.torch.safetensors as sf

    seed = int.from_bytes(os.urandom(4), "little")
    p, q, new = _two_versions(torch, st_torch, tmp_path, seed)
    real, calls = sf._catalog, []

    def catalog_then_rename(*args, **kwargs):
        cat = real(*args, **kwargs)
        if not calls:
            os.rename(q, p)
        calls.append(1)
        return cat

    monkeypatch.setattr(sf, "_catalog", catalog_then_rename)
    got = sf.load_safetensors(str(p))
    assert len(calls) == 2, f"seed {seed}: the load did not start again"
    assert set(got) == set(new), f"seed {seed}"
    for name, t in new.items():
        assert torch.equal(_bytes_view(got[name]).cpu(), _bytes_view(t)), f"{name} (seed {seed})"


def test_a_file_replaced_at_every_try_is_a_clear_error(gpu, tmp_path, st_torch, monkeypatch):
    """Replaced after the header read of both tries: CheckpointChangedError naming the
    file, never tensors of two versions."""
    torch = pytest.importorskip("torch")
    import ferry.torch.safetensors as sf
    from ferry.errors import CheckpointChangedError

    seed = int.from_bytes(os.urandom(4), "little")
    p, q, _ = _two_versions(torch, st_torch, tmp_path, seed)
    real = sf._catalog

    def catalog_then_replace(*args, **kwargs):
        cat = real(*args, **kwargs)
        spare = tmp_path / "spare"
        os.link(p, spare)  # a copy of the current version, renamed over: another inode
        data = spare.read_bytes()
        os.unlink(spare)
        spare.write_bytes(data)
        os.rename(spare, p)
        return cat

    monkeypatch.setattr(sf, "_catalog", catalog_then_replace)
    with pytest.raises(CheckpointChangedError, match="m.safetensors: not the file whose header was read"):
        sf.load_safetensors(str(p))
