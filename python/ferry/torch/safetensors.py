"""Safetensors checkpoints to the GPU through ferry's loader: ``load_safetensors``.

One call reads every tensor it is asked for from one file, a list of shards,
a shard index (``model.safetensors.index.json``) or a directory holding
either, with ferry's reader threads and pinned staging ring (see
``ferry.load``), straight into the GPU tensors it returns or into the
tensors of ``out`` (a model's ``state_dict()``), in place.

Checks before any byte moves: each file's header (strictly: a truncated file,
offsets past the end, overlapping tensors, an unknown dtype, a shape that does
not match its bytes, ... each an ``InvalidArgumentError`` naming the file and
the tensor), a tensor in two shards, an index that contradicts its shards, a
key that is not there, and with ``out`` each tensor's shape, dtype and device.
On any error nothing is returned; tensors this call allocated are freed. With
``out``, a failure during the load itself (a read error, a file that shrank)
leaves the ``out`` tensors partly written.
"""

from __future__ import annotations

import os
import traceback

from ..errors import InvalidArgumentError
from ..load import Loader, default_loader, parse_shard_index, read_safetensors_header
from ._torch import torch_module as _torch

# safetensors dtype -> name of the torch dtype (absent: PyTorch has none)
_TORCH_DTYPE_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",  # two values per byte: the last dimension halves
}
SAFETENSORS_TO_TORCH = _TORCH_DTYPE_NAMES  # the table the saver (ferry.torch.save) inverts

_INDEX_NAME = "model.safetensors.index.json"
_CAST_BATCH_BYTES = 1 << 30  # device memory a dtype cast borrows at a time
_ALIGN = 256  # byte alignment of each tensor in a cast batch (any dtype's view)


class _Entry:
    __slots__ = ("name", "file", "dtype", "shape", "offset", "nbytes")

    def __init__(self, name, file, dtype, shape, offset, nbytes):
        self.name, self.file, self.dtype, self.shape = name, file, dtype, shape
        self.offset, self.nbytes = offset, nbytes


def _as_list(paths) -> list:
    if isinstance(paths, (str, bytes, os.PathLike)):
        return [paths]
    try:
        return list(paths)
    except TypeError:
        raise InvalidArgumentError(f"paths: expected a path or a list of paths, got {type(paths).__name__}") from None


def _resolve(paths) -> tuple[list[str], dict]:
    """(safetensors files in order, weight_map {tensor: file} from indexes)."""
    files: list[str] = []
    weight_map: dict[str, str] = {}

    def add_index(path: str) -> None:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        base = os.path.dirname(path)
        for tensor, shard in parse_shard_index(text, path):
            shard_path = os.path.join(base, shard)
            if weight_map.get(tensor, shard_path) != shard_path:
                raise InvalidArgumentError(
                    f"{path}: tensor {tensor!r} is mapped to {shard_path} and, by another index, to {weight_map[tensor]}"
                )
            weight_map[tensor] = shard_path
            if shard_path not in files:
                files.append(shard_path)

    for p in _as_list(paths):
        p = os.path.abspath(os.fsdecode(os.fspath(p)))
        if os.path.isdir(p):
            index = os.path.join(p, _INDEX_NAME)
            if os.path.exists(index):
                add_index(index)
                continue
            found = sorted(n for n in os.listdir(p) if n.endswith(".safetensors"))
            if not found:
                raise InvalidArgumentError(f"{p}: no {_INDEX_NAME} and no *.safetensors file in this directory")
            files.extend(os.path.join(p, n) for n in found if os.path.join(p, n) not in files)
        elif p.endswith(".json"):
            add_index(p)
        elif p not in files:
            files.append(p)
    if not files:
        raise InvalidArgumentError("load_safetensors: no file given")
    return files, weight_map


def _catalog(files: list[str], weight_map: dict) -> dict:
    """{tensor name: _Entry}, in file order, checked against the indexes."""
    catalog: dict[str, _Entry] = {}
    for i, path in enumerate(files):
        h = read_safetensors_header(path)
        base = h["data_offset"]
        for name, dtype, shape, begin, end in h["tensors"]:
            if name in catalog:
                raise InvalidArgumentError(
                    f"tensor {name!r} is in two files: {files[catalog[name].file]} and {path}"
                )
            catalog[name] = _Entry(name, i, dtype, shape, base + begin, end - begin)
    for name, shard in weight_map.items():
        e = catalog.get(name)
        if e is None or files[e.file] != shard:
            where = f"it is in {files[e.file]}" if e is not None else "no file has it"
            raise InvalidArgumentError(f"the shard index maps tensor {name!r} to {shard}, but {where}")
    return catalog


def _torch_dtype(torch, e: _Entry, files: list[str]):
    name = _TORCH_DTYPE_NAMES.get(e.dtype)
    dt = getattr(torch, name, None) if name else None
    if dt is None:
        raise InvalidArgumentError(
            f"{files[e.file]}: tensor {e.name!r}: safetensors dtype {e.dtype} has no dtype in "
            f"PyTorch {torch.__version__}"
        )
    return dt


def _storage_shape(e: _Entry, files: list[str]) -> list:
    shape = list(e.shape)
    if e.dtype == "F4":  # float4_e2m1fn_x2 holds two values per element
        if not shape or shape[-1] % 2:
            raise InvalidArgumentError(
                f"{files[e.file]}: tensor {e.name!r}: F4 shape {shape} needs an even last dimension in PyTorch"
            )
        shape[-1] //= 2
    return shape


def _castable(torch, dt) -> bool:
    """Floating-point dtypes of 2 bytes and more follow `dtype=`; 8- and 4-bit
    floats (quantized storage) and integers keep their own."""
    size = getattr(dt, "itemsize", None) or torch.empty((), dtype=dt).element_size()
    return dt.is_floating_point and size >= 2


def _select(catalog: dict, keys, out, strict: bool) -> list[str]:
    def listed(names, what, limit=5):
        shown = ", ".join(repr(n) for n in names[:limit])
        return f"{len(names)} {what}: {shown}{', ...' if len(names) > limit else ''}"

    if keys is not None:
        names = list(dict.fromkeys([keys] if isinstance(keys, str) else keys))
        missing = [k for k in names if k not in catalog]
        if missing:
            raise InvalidArgumentError(listed(missing, "key(s) not in the checkpoint"))
        if out is not None:
            absent = [k for k in names if k not in out]
            if absent:
                raise InvalidArgumentError(listed(absent, "key(s) not in out"))
        return names
    if out is None:
        return list(catalog)
    names = [k for k in out if k in catalog]
    if strict:
        unexpected = [k for k in catalog if k not in out]
        if unexpected:
            raise InvalidArgumentError(
                listed(unexpected, "tensor(s) of the checkpoint not in out") + " (strict=False skips them)"
            )
        loaded = {_storage_key(out[k]) for k in names}
        missing = [k for k in out if k not in catalog and _storage_key(out[k]) not in loaded]
        if missing:  # a tied weight (same storage as a loaded one) is not missing
            raise InvalidArgumentError(
                listed(missing, "tensor(s) of out not in the checkpoint") + " (strict=False leaves them as they are)"
            )
    return names


def _storage_key(t):
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
    except Exception:  # noqa: BLE001 - not a tensor: reported by _targets
        return id(t)


def _device(torch, device, out):
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda":
        raise InvalidArgumentError(
            f"device={device!r}: load_safetensors loads to CUDA devices (for the CPU: safetensors.torch.load_file)"
        )
    if out is not None and dev.index is None:
        devices = {t.device for t in out.values() if isinstance(t, torch.Tensor) and t.is_cuda}
        if len(devices) == 1:
            return devices.pop()
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def _targets(torch, names, catalog, files, dtype, out, device) -> dict:
    """{name: destination tensor}, checked (shape, dtype, device) or allocated."""
    result = {}
    for name in names:
        e = catalog[name]
        file_dt = _torch_dtype(torch, e, files)
        shape = _storage_shape(e, files)
        want = dtype if dtype is not None and _castable(torch, file_dt) else file_dt
        if out is None:
            result[name] = torch.empty(shape, dtype=want, device=device)
            continue
        t = out[name]
        where = f"{files[e.file]}: tensor {name!r}"
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"out[{name!r}] is a {type(t).__name__}, not a tensor")
        if list(t.shape) != shape:
            raise InvalidArgumentError(f"{where} has shape {shape} but out[{name!r}] has {list(t.shape)}")
        if t.dtype != want:
            hint = f" (dtype={t.dtype} casts floating-point tensors)" if dtype is None and _castable(torch, file_dt) else ""
            raise InvalidArgumentError(
                f"{where} loads as {want} but out[{name!r}] is {t.dtype}{hint}"
            )
        if t.device != device:
            raise InvalidArgumentError(f"out[{name!r}] is on {t.device}, the load goes to {device}")
        result[name] = t
    return result


def _run(loader, files, ranges, stream) -> None:
    """Loads [(file, offset, nbytes, address)] with only the files they use."""
    used = sorted({r[0] for r in ranges})
    remap = {f: i for i, f in enumerate(used)}
    loader._load_lists(
        [files[f] for f in used],
        [remap[r[0]] for r in ranges],
        [r[1] for r in ranges],
        [r[2] for r in ranges],
        [r[3] for r in ranges],
        stream,
    )


def _cast_batches(entries, limit):
    batch, size = [], 0
    for e in entries:
        padded = (e.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        if batch and size + padded > limit:
            yield batch, size
            batch, size = [], 0
        batch.append(e)
        size += padded
    if batch:
        yield batch, size


def load_safetensors(
    paths,
    device="cuda",
    *,
    keys=None,
    dtype=None,
    out=None,
    strict: bool = True,
    loader: Loader | None = None,
) -> dict:
    """Load safetensors tensors to a GPU; returns {name: tensor}.

    paths: a .safetensors file, a shard index (.json), a directory holding
    either, or a list of these. keys: only these tensors (else all, or with
    ``out`` those of ``out``). dtype: floating-point tensors of 16 bits and
    more are cast to it on the GPU (8- and 4-bit floats and integers keep
    theirs). out: {name: tensor} (e.g. ``model.state_dict()``) filled in place;
    each tensor must have the file's shape, the dtype it loads as and sit on
    the device. With ``out`` and ``strict`` (the default), a checkpoint tensor
    not in ``out`` or an ``out`` tensor not in the checkpoint is an error
    (except a tied weight whose storage is loaded under another name).
    loader: a ``ferry.load.Loader`` (staging size, threads, O_DIRECT, mapped
    share); default: the process's loader for the device.
    """
    try:
        return _load(paths, device, keys, dtype, out, strict, loader)
    except BaseException as err:
        # The traceback's frames hold the tensors allocated so far: free them
        # now, not when the caller drops the exception.
        traceback.clear_frames(err.__traceback__)
        raise


def _load(paths, device, keys, dtype, out, strict, loader) -> dict:
    torch = _torch()
    files, weight_map = _resolve(paths)
    catalog = _catalog(files, weight_map)
    names = _select(catalog, keys, out, strict)
    dev = _device(torch, device, out)
    if loader is not None and loader.device != dev.index:
        raise InvalidArgumentError(f"loader is for cuda:{loader.device}, the load goes to {dev}")
    with torch.cuda.device(dev):
        result = _targets(torch, names, catalog, files, dtype, out, dev)
        ld = loader if loader is not None else default_loader(dev.index)
        stream = torch.cuda.current_stream(dev).cuda_stream
        direct, cast, seen = [], [], set()
        for name in names:
            e, t = catalog[name], result[name]
            if e.nbytes == 0 or (t.data_ptr(), e.nbytes) in seen:
                continue  # empty, or a tied weight whose storage another name loads
            seen.add((t.data_ptr(), e.nbytes))
            if t.dtype == _torch_dtype(torch, e, files) and t.is_contiguous():
                direct.append((e.file, e.offset, e.nbytes, t.data_ptr()))
            else:
                cast.append(e)
        if direct:
            _run(ld, files, direct, stream)
        for batch, size in _cast_batches(cast, max(_CAST_BATCH_BYTES, max((e.nbytes for e in cast), default=0))):
            raw = torch.empty(size, dtype=torch.uint8, device=dev)
            at, ranges = 0, []
            for e in batch:
                ranges.append((e.file, e.offset, e.nbytes, raw.data_ptr() + at))
                at += (e.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            _run(ld, files, ranges, stream)
            at = 0
            for e in batch:
                src = raw[at : at + e.nbytes].view(_torch_dtype(torch, e, files)).view(_storage_shape(e, files))
                try:
                    result[e.name].copy_(src)
                except (RuntimeError, TypeError) as err:
                    raise InvalidArgumentError(
                        f"{files[e.file]}: tensor {e.name!r}: cannot cast {e.dtype} to {result[e.name].dtype}: {err}"
                    ) from err
                at += (e.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            del raw
    return result
