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
import threading
import traceback

from .. import _ferry
from ..errors import CheckpointChangedError, InvalidArgumentError, NoDeviceError
from ..load import Loader, default_loader, read_catalog, read_shard_index
from ..gpu_check import gpu_absent_reason
from ._torch import torch_module as _torch
from . import node_load, node_plan
from . import slices as _slices
from .devices import cuda_device, with_index

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
# New tensors are one torch.empty each (a few us): with this many or more,
# the first tensors' load (_OVERLAP_HEAD_SHARE of the bytes) runs on a thread
# while the others are allocated, and the second load takes the rest. Below
# it, allocating costs less than the second load call's set-up.
_OVERLAP_MIN_TENSORS = 256
_OVERLAP_HEAD_SHARE = 0.125


class _Catalog:
    """The checkpoint's tensors as columns (``ferry.load.read_catalog``):
    tensor i is ``names[i]``, in ``files[file[i]]`` at ``offset[i]``
    (``nbytes[i]`` bytes), of safetensors dtype ``dtype[i]`` and shape
    ``shape[i]``; ``index`` maps a name to its i. Columns, not an object per
    tensor: a checkpoint of thousands of tensors costs a few list passes."""

    __slots__ = ("files", "names", "file", "dtype", "shape", "offset", "nbytes", "index", "identity")

    def __init__(self, files, names, file, dtype, shape, offset, nbytes, identity=None):
        self.files, self.names, self.file, self.dtype = files, names, file, dtype
        self.shape, self.offset, self.nbytes = shape, offset, nbytes
        self.identity = identity  # per file: (device, inode, size, mtime_ns) its header was read from
        self.index = dict(zip(names, range(len(names))))

    @classmethod
    def of(cls, files, entries):
        """From [(name, file, dtype, shape, offset, nbytes)] (tests, small sets)."""
        cols = [list(c) for c in zip(*entries)] or [[] for _ in range(6)]
        cols[3] = [tuple(x) for x in cols[3]]
        return cls(files, *cols)

    def where(self, i) -> str:
        return f"{self.files[self.file[i]]}: tensor {self.names[i]!r}"


def _as_list(paths) -> list:
    if isinstance(paths, (str, bytes, os.PathLike)):
        return [paths]
    try:
        return list(paths)
    except TypeError:
        raise InvalidArgumentError(f"paths: expected a path or a list of paths, got {type(paths).__name__}") from None


def _resolve(paths) -> tuple[list[str], list[str], list[int]]:
    """(safetensors files in order, index tensors, index files): the indexes'
    weight_map as two columns, index_tensors[k] in files[index_files[k]]."""
    files: dict[str, int] = {}  # path -> its index, in order
    tensors: list[str] = []
    shard_of: list[int] = []
    indexes = 0

    def add_file(path: str) -> int:
        return files.setdefault(path, len(files))

    def add_index(path: str) -> None:
        nonlocal indexes, tensors, shard_of
        shards, names, of = read_shard_index(path)
        base = os.path.dirname(path)
        at = [add_file(os.path.join(base, s)) for s in shards]
        indexes += 1
        if indexes == 1:
            tensors, shard_of = names, [at[k] for k in of]
            return
        seen = dict(zip(tensors, shard_of))  # several indexes (rare): one map, conflicts refused
        for name, k in zip(names, of):
            f = seen.setdefault(name, at[k])
            if f != at[k]:
                paths_ = list(files)
                raise InvalidArgumentError(
                    f"{path}: tensor {name!r} is mapped to {paths_[at[k]]} and, by another index, to {paths_[f]}"
                )
        tensors, shard_of = list(seen), list(seen.values())

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
            for n in found:
                add_file(os.path.join(p, n))
        elif p.endswith(".json"):
            add_index(p)
        else:
            add_file(p)
    if not files:
        raise InvalidArgumentError("load_safetensors: no file given")
    return list(files), tensors, shard_of


def _catalog(files: list[str], index_tensors=(), index_files=()) -> _Catalog:
    """Every tensor of `files`, checked against the index (one native call)."""
    c = read_catalog(files, index_tensors, index_files)
    return _Catalog(files, c["names"], c["file"], c["dtype"], c["shape"], c["offset"], c["nbytes"], c["identity"])


def _torch_dtype(torch, cat: _Catalog, i: int):
    name = _TORCH_DTYPE_NAMES.get(cat.dtype[i])
    dt = getattr(torch, name, None) if name else None
    if dt is None:
        raise InvalidArgumentError(
            f"{cat.where(i)}: safetensors dtype {cat.dtype[i]} has no dtype in PyTorch {torch.__version__}"
        )
    return dt


def _storage_shape(cat: _Catalog, i: int) -> tuple:
    shape = tuple(cat.shape[i])
    if cat.dtype[i] == "F4":  # float4_e2m1fn_x2 holds two values per element
        if not shape or shape[-1] % 2:
            raise InvalidArgumentError(f"{cat.where(i)}: F4 shape {list(shape)} needs an even last dimension in PyTorch")
        shape = shape[:-1] + (shape[-1] // 2,)
    return shape


def _castable(torch, dt) -> bool:
    """Floating-point dtypes of 2 bytes and more follow `dtype=`; 8- and 4-bit
    floats (quantized storage) and integers keep their own."""
    size = getattr(dt, "itemsize", None) or torch.empty((), dtype=dt).element_size()
    return dt.is_floating_point and size >= 2


def _select(cat: _Catalog, keys, out, strict: bool) -> list[int]:
    """The tensors to load, as indexes into the catalog."""
    def listed(names, what, limit=5):
        shown = ", ".join(repr(n) for n in names[:limit])
        return f"{len(names)} {what}: {shown}{', ...' if len(names) > limit else ''}"

    index = cat.index
    if keys is not None:
        names = list(dict.fromkeys([keys] if isinstance(keys, str) else keys))
        missing = [k for k in names if k not in index]
        if missing:
            raise InvalidArgumentError(listed(missing, "key(s) not in the checkpoint"))
        if out is not None:
            absent = [k for k in names if k not in out]
            if absent:
                raise InvalidArgumentError(listed(absent, "key(s) not in out"))
        return [index[k] for k in names]
    if out is None:
        return list(range(len(cat.names)))
    names = [k for k in out if k in index]
    if strict:
        unexpected = [k for k in cat.names if k not in out]
        if unexpected:
            raise InvalidArgumentError(
                listed(unexpected, "tensor(s) of the checkpoint not in out") + " (strict=False skips them)"
            )
        absent = [k for k in out if k not in index]
        if absent:  # a tied weight (same storage as a loaded one) is not missing
            loaded = {_storage_key(out[k]) for k in names}  # only then: a storage key costs a few us
            absent = [k for k in absent if _storage_key(out[k]) not in loaded]
        missing = absent
        if missing:
            raise InvalidArgumentError(
                listed(missing, "tensor(s) of out not in the checkpoint") + " (strict=False leaves them as they are)"
            )
    return [index[k] for k in names]


def _storage_key(t):
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
    except Exception:  # noqa: BLE001 - not a tensor: reported by _targets
        return id(t)


def _device(torch, device, out):
    dev = cuda_device(device, "load_safetensors",
                      "load_safetensors loads to CUDA devices (for the CPU: safetensors.torch.load_file)")
    absent = gpu_absent_reason(_ferry.cuda_info())  # ferry's check, before torch.cuda is touched
    if absent is not None:
        raise NoDeviceError(f"load_safetensors(device={device!r}): {absent}; it loads to a CUDA device "
                            "(for the CPU: safetensors.torch.load_file)")
    if out is not None and dev.index is None:
        devices = {t.device for t in out.values() if isinstance(t, torch.Tensor) and t.is_cuda}
        if len(devices) == 1:
            return devices.pop()
    return with_index(dev, "load_safetensors")


def _dtypes(torch, cat: _Catalog, sel, dtype) -> dict:
    """{safetensors dtype: (its torch dtype, the dtype it loads as)} of the
    selected tensors: one lookup per dtype, not per tensor."""
    first = {}
    for i in sel:
        first.setdefault(cat.dtype[i], i)
    out = {}
    for name, i in first.items():
        file_dt = _torch_dtype(torch, cat, i)
        out[name] = (file_dt, dtype if dtype is not None and _castable(torch, file_dt) else file_dt)
    return out


def _shape_of(cat: _Catalog, sel, dts):
    """i -> the shape tensor i is allocated with (F4: the last dimension halved)."""
    if "F4" not in dts:
        return cat.shape.__getitem__
    f4 = {i: _storage_shape(cat, i) for i in sel if cat.dtype[i] == "F4"}
    return lambda i: f4[i] if i in f4 else cat.shape[i]


def _allocate(torch, sel, cat: _Catalog, dts, shape_of, device) -> dict:
    empty, names, kinds = torch.empty, cat.names, cat.dtype
    return {names[i]: empty(shape_of(i), dtype=dts[kinds[i]][1], device=device) for i in sel}


def _targets(torch, sel, cat: _Catalog, dtype, out, device) -> dict:
    """{name: destination tensor}, checked (shape, dtype, device) or allocated."""
    dts = _dtypes(torch, cat, sel, dtype)
    names, kinds = cat.names, cat.dtype
    shape_of = _shape_of(cat, sel, dts)
    if out is None:
        return _allocate(torch, sel, cat, dts, shape_of, device)
    result = {}
    for i in sel:
        name, shape = names[i], shape_of(i)
        file_dt, want = dts[kinds[i]]
        t = out[name]
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"out[{name!r}] is a {type(t).__name__}, not a tensor")
        if t.shape != shape:
            raise InvalidArgumentError(f"{cat.where(i)} has shape {list(shape)} but out[{name!r}] has {list(t.shape)}")
        if t.dtype != want:
            hint = f" (dtype={t.dtype} casts floating-point tensors)" if dtype is None and _castable(torch, file_dt) else ""
            raise InvalidArgumentError(f"{cat.where(i)} loads as {want} but out[{name!r}] is {t.dtype}{hint}")
        if t.device != device:
            raise InvalidArgumentError(f"out[{name!r}] is on {t.device}, the load goes to {device}")
        result[name] = t
    return result


def _run(loader, cat: _Catalog, file_index, offsets, sizes, addresses, stream) -> None:
    """Loads the ranges (four columns) of cat's files with only the files they use;
    CheckpointChangedError where a file the loader opened is not the one whose header
    the catalog read (renamed over since), or changed while it was read."""
    files, used = cat.files, sorted(set(file_index))
    if len(used) < len(files):
        remap = {f: k for k, f in enumerate(used)}
        files, file_index = [files[f] for f in used], [remap[f] for f in file_index]
    stats = loader.load_ranges(files, file_index, offsets, sizes, addresses, stream)
    if stats.get("changed"):
        raise CheckpointChangedError("; ".join(stats["changed"]))
    if cat.identity is not None:
        for f, opened in zip(used, stats.get("identities", ())):
            if tuple(opened) != tuple(cat.identity[f]):
                raise CheckpointChangedError(
                    f"{cat.files[f]}: not the file whose header was read (device, inode, size, mtime "
                    f"{tuple(cat.identity[f])} then {tuple(opened)}): it was replaced or written during the load")


def _cast_batches(cat: _Catalog, sel, limit):
    batch, size = [], 0
    for i in sel:
        padded = (cat.nbytes[i] + _ALIGN - 1) // _ALIGN * _ALIGN
        if batch and size + padded > limit:
            yield batch, size
            batch, size = [], 0
        batch.append(i)
        size += padded
    if batch:
        yield batch, size


def load_safetensors(
    paths,
    device=None,
    *,
    keys=None,
    slices=None,
    dtype=None,
    out=None,
    strict: bool = True,
    loader: Loader | None = None,
    node=None,
    rank: int | None = None,
    ranks: int | None = None,
    timeout: float = node_load.DEFAULT_TIMEOUT,
) -> dict:
    """Load safetensors tensors to a GPU; returns {name: tensor}.

    paths: a .safetensors file, a shard index (.json), a directory holding
    either, or a list of these. device: "cuda:N", N or a torch.device; None
    or "cuda": the current CUDA device, or with ``out`` the one GPU its
    tensors sit on (ferry.torch's one rule for ``device``). keys: only these tensors (else all, or with
    ``out`` those of ``out``). slices: {name: (dim, start, stop)}, for
    tensor parallelism: those tensors load only indexes [start, stop) of
    dimension dim (the file's bytes of that part, nothing else; see
    ``ferry.torch.slices``), also with node=. dtype: floating-point tensors of 16 bits and
    more are cast to it on the GPU (8- and 4-bit floats and integers keep
    theirs). out: {name: tensor} (e.g. ``model.state_dict()``) filled in place;
    each tensor must have the file's shape, the dtype it loads as and sit on
    the device. With ``out`` and ``strict`` (the default), a checkpoint tensor
    not in ``out`` or an ``out`` tensor not in the checkpoint is an error
    (except a tied weight whose storage is loaded under another name).
    loader: a ``ferry.load.Loader`` (staging size, threads, O_DIRECT);
    default: the process's loader for the device.

    A file replaced while it loads (a new checkpoint renamed over it after its
    header was read) or written, truncated or extended while it is read: the
    load starts once more from the headers, so each tensor is of one version
    of its file; a second change raises CheckpointChangedError. (A write that
    keeps the size and lands within the file system's timestamp granularity of
    the first cannot be told apart: write checkpoints to a new name, then
    rename, as ferry's save does.)

    node: a ``ferry.node.NodePool`` (opened with ``device=`` this rank's GPU)
    to read each file once per node: collective, every one of the node's
    ``ranks`` processes calls it with the same paths; each reads its part of
    every file into the pool, then copies what it selected from there (see
    ``ferry.torch.node_load``). A file already in the page cache is read by
    each rank alone instead (faster than through the pool; the ranks agree on
    each file's route, ``ferry.torch.node_plan``); the result is then a
    ``NodeLoadResult``, a dict whose ``routes`` says which route each file
    took and why. rank, ranks: this process's index and how many
    load (default: LOCAL_RANK and LOCAL_WORLD_SIZE, which torchrun sets).
    timeout: seconds a rank waits for the others (NodeLoadTimeout after; None or
    math.inf: no limit; negative or NaN: InvalidArgumentError).
    """
    try:
        try:
            return _load(paths, device, (keys, slices), dtype, out, strict, loader, (node, rank, ranks, timeout))
        except CheckpointChangedError:
            # A file was replaced (a new checkpoint renamed over it) or written
            # during the load: load once more, headers included, so every tensor
            # is of one version of its file; a second change is the caller's.
            return _load(paths, device, (keys, slices), dtype, out, strict, loader, (node, rank, ranks, timeout))
    except BaseException as err:
        # The traceback's frames hold the tensors allocated so far: free them
        # now, not when the caller drops the exception.
        traceback.clear_frames(err.__traceback__)
        raise


def _load(paths, device, selection, dtype, out, strict, loader, node_args) -> dict:
    (keys, slices), (node, rank, ranks, timeout) = selection, node_args
    if node is not None:  # checked first: bad node arguments are reported with or without a GPU
        timeout = node_load.check_node(node, timeout)
        rank, ranks = node_load.node_ranks(rank, ranks)
        if loader is not None:
            raise InvalidArgumentError("loader= and node= together: a node load reads into the node pool, not "
                                       "through a Loader; pass one of them")
    torch = _torch()
    files, index_tensors, index_files = _resolve(paths)
    cat = _catalog(files, index_tensors, index_files)
    sel = _select(cat, keys, out, strict)
    sliced = _slices.check(slices, cat, sel)
    if sliced:
        sel = [i for i in sel if i not in sliced]
    dev = _device(torch, device, out)
    if loader is not None and loader.device != dev.index:
        raise InvalidArgumentError(f"loader is for cuda:{loader.device}, the load goes to {dev}")
    if node is not None and node.device is not None and node.device != dev.index:
        raise InvalidArgumentError(f"node={node!r} pins for cuda:{node.device}, the load goes to {dev}; open "
                                   "the pool with device= the GPU this rank loads to")
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        if node is not None:
            return _load_planned(torch, node, rank, ranks, timeout, files, cat, (sel, sliced), dtype, out, dev, stream)
        ld = loader if loader is not None else default_loader(dev.index)
        return _load_alone(torch, ld, files, cat, (sel, sliced), dtype, out, dev, stream)


def _load_alone(torch, ld, files, cat: _Catalog, selection, dtype, out, dev, stream) -> dict:
    """This process's own loader reads the selected tensors (and slices) of `files`."""
    sel, sliced = selection
    dts = _dtypes(torch, cat, sel, dtype)
    if out is None and all(a == b for a, b in dts.values()) and len(sel) >= _OVERLAP_MIN_TENSORS:
        result = _load_new_overlapped(torch, ld, files, cat, sel, dts, dev, stream)
    else:
        result = _targets(torch, sel, cat, dtype, out, dev)
        direct, cast = _split(torch, sel, cat, result, dtype, out)
        if direct:
            tensors = [result[cat.names[i]] for i in direct]
            _run(ld, cat, [cat.file[i] for i in direct], [cat.offset[i] for i in direct],
                 [cat.nbytes[i] for i in direct], [t.data_ptr() for t in tensors], stream)
        _load_cast(torch, _loader_fill(ld, files, cat, stream), cat, cast, result, dev)
    if sliced:
        def fetch(idx, offsets, sizes, addresses):
            _run(ld, cat, [cat.file[i] for i in idx], offsets, sizes, addresses, stream)
        result.update(_slices.load(torch, fetch, cat, sliced, _dtypes(torch, cat, list(sliced), dtype), out, dev))
    return result


class NodeLoadResult(dict):
    """What ``load_safetensors(node=)`` returns: {name: tensor}, and ``routes``:
    {file path: (route, why)}, route "pool" (read once for the node) or
    "alone" (this rank read it itself: it was in the page cache; see
    ``ferry.torch.node_plan``)."""

    routes: dict


def _load_planned(torch, node, rank, ranks, timeout, files, cat: _Catalog, selection, dtype, out, dev, stream):
    """A node load: the ranks agree on a route per file (node_plan), then load
    the "alone" files each through its own loader and the "pool" ones
    through the node pool."""
    sel, sliced = selection
    plan = node_plan.plan(node, files, rank, ranks, timeout)
    try:
        alone = {f for f, (route, _) in enumerate(plan.routes) if route == "alone"}
        result = NodeLoadResult()
        if alone:
            part = ([i for i in sel if cat.file[i] in alone], {i: s for i, s in sliced.items() if cat.file[i] in alone})
            result.update(_load_alone(torch, default_loader(dev.index), files, cat, part, dtype, out, dev, stream))
        if len(alone) < len(files):
            part = ([i for i in sel if cat.file[i] not in alone],
                    {i: s for i, s in sliced.items() if cat.file[i] not in alone})
            pooled = [f for f in range(len(files)) if f not in alone]
            result.update(_load_node(torch, node, rank, ranks, timeout, files, cat, part, dtype, out, dev, stream,
                                     pooled))
    finally:
        plan.close()
    result.routes = {files[f]: plan.routes[f] for f in range(len(files))}
    return result


def _loader_fill(ld, files, cat: _Catalog, stream):
    """fill(batch, addresses) for _load_cast: the loader reads the tensors' bytes."""
    def fill(batch, addresses):
        _run(ld, cat, [cat.file[i] for i in batch], [cat.offset[i] for i in batch],
             [cat.nbytes[i] for i in batch], addresses, stream)
    return fill


def _load_node(torch, node, rank, ranks, timeout, files, cat: _Catalog, selection, dtype, out, dev, stream,
               pooled) -> dict:
    """The node path: file by file, every rank reads its part into the node
    pool (node_load.open_file_once) and copies its tensors from there piece by
    piece as the pieces come in (the copies run while the file is read); then
    the tensors it casts and the slices it takes of others."""
    sel, sliced = selection
    result = _targets(torch, sel, cat, dtype, out, dev)
    slice_dts = _dtypes(torch, cat, list(sliced), dtype)
    direct, cast = _split(torch, sel, cat, result, dtype, out)
    names = cat.names
    for f in pooled:  # every pooled file, whatever this rank selected: the call is collective
        path = files[f]
        nf = node_load.open_file_once(node, path, rank, ranks, timeout=timeout)
        try:
            mine = sorted((cat.offset[i], cat.nbytes[i], result[names[i]].data_ptr())
                          for i in direct if cat.file[i] == f and cat.nbytes[i])
            at = 0
            for lo, hi in nf.pieces():
                offsets, sizes, addresses, at = node_load.piece_items(mine, lo, hi, at)
                node_load.copy_from_block(nf, offsets, sizes, addresses, stream, dev.index)
            nf.finish()

            def fill(batch, addresses, nf=nf):
                node_load.copy_from_block(nf, [cat.offset[i] for i in batch], [cat.nbytes[i] for i in batch],
                                          addresses, stream, dev.index)
            _load_cast(torch, fill, cat, [i for i in cast if cat.file[i] == f], result, dev)
            here = {i: s for i, s in sliced.items() if cat.file[i] == f}
            if here:
                def fetch(idx, offsets, sizes, addresses, nf=nf):
                    node_load.copy_from_block(nf, offsets, sizes, addresses, stream, dev.index)
                result.update(_slices.load(torch, fetch, cat, here, slice_dts, out, dev))
        finally:
            nf.release()
    return result


def _overlap_head(cat: _Catalog, sel) -> int:
    """How many of `sel` (in order) the first load takes: the fewest whose
    bytes reach _OVERLAP_HEAD_SHARE of the selection's, at least one, never
    all."""
    nbytes = cat.nbytes
    goal, got = _OVERLAP_HEAD_SHARE * sum(nbytes[i] for i in sel), 0
    for k, i in enumerate(sel):
        got += nbytes[i]
        if got >= goal:
            return max(1, min(k + 1, len(sel) - 1))
    return max(1, len(sel) - 1)


def _load_new_overlapped(torch, ld, files, cat: _Catalog, sel, dts, dev, stream) -> dict:
    """New tensors of the files' dtypes: the first ones are allocated and
    their load starts on a thread; the others are allocated meanwhile (the
    native load releases the GIL), then loaded. Nothing returns before the
    thread's load has ended, whatever happens here (its DMAs write into
    tensors this call owns)."""
    shape_of = _shape_of(cat, sel, dts)
    k = _overlap_head(cat, sel)
    head, rest = sel[:k], sel[k:]

    def ranges(part, tensors):
        return ([cat.file[i] for i in part], [cat.offset[i] for i in part], [cat.nbytes[i] for i in part],
                [t.data_ptr() for t in tensors])

    result = _allocate(torch, head, cat, dts, shape_of, dev)
    head_ranges = ranges(head, result.values())  # built here: the thread only waits in the native load
    failed = []

    def load_head():
        try:
            _run(ld, cat, *head_ranges, stream)
        except BaseException as err:  # noqa: BLE001 - re-raised by the caller's thread
            failed.append(err)

    worker = threading.Thread(target=load_head, name="ferry-load-head", daemon=True)
    worker.start()
    try:
        others = _allocate(torch, rest, cat, dts, shape_of, dev)
    finally:
        _join(worker)
    if failed:
        raise failed[0]
    _run(ld, cat, *ranges(rest, others.values()), stream)
    result.update(others)
    return result


def _join(thread) -> None:
    """Joins `thread`, even across Ctrl-C (re-raised once it has ended)."""
    interrupted = None
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt as err:
            interrupted = err
    if interrupted is not None:
        raise interrupted


def _split(torch, sel, cat: _Catalog, result, dtype, out) -> tuple[list, list]:
    """(tensors loaded in place, tensors loaded raw and cast), as catalog
    indexes. Newly allocated tensors of the file's dtype all load in place;
    with ``out``, a tied weight (storage another name loads) is skipped and a
    non-contiguous or other-dtype tensor goes through the cast."""
    names, nbytes = cat.names, cat.nbytes
    if out is None:
        if dtype is None:
            return sel, []
        dts = _dtypes(torch, cat, sel, dtype)
        direct = [i for i in sel if dts[cat.dtype[i]][0] == dts[cat.dtype[i]][1]]
        return direct, [i for i in sel if dts[cat.dtype[i]][0] != dts[cat.dtype[i]][1]]
    dts = _dtypes(torch, cat, sel, dtype)
    direct, cast, seen = [], [], set()
    for i in sel:
        t = result[names[i]]
        key = (t.data_ptr(), nbytes[i])
        if nbytes[i] == 0 or key in seen:
            continue  # empty, or a tied weight whose storage another name loads
        seen.add(key)
        if t.dtype == dts[cat.dtype[i]][0] and t.is_contiguous():
            direct.append(i)
        else:
            cast.append(i)
    return direct, cast


def _load_cast(torch, fill, cat: _Catalog, cast, result, dev) -> None:
    """Loads `cast` raw into device batches of at most _CAST_BATCH_BYTES
    (``fill(batch, addresses)`` puts the bytes there), then copies each tensor
    into its destination (casting its dtype)."""
    if not cast:
        return
    limit = max(_CAST_BATCH_BYTES, max(cat.nbytes[i] for i in cast))
    for batch, size in _cast_batches(cat, cast, limit):
        raw = torch.empty(size, dtype=torch.uint8, device=dev)
        at, addresses = 0, []
        for i in batch:
            addresses.append(raw.data_ptr() + at)
            at += (cat.nbytes[i] + _ALIGN - 1) // _ALIGN * _ALIGN
        fill(batch, addresses)
        at = 0
        for i in batch:
            n = cat.nbytes[i]
            src = raw[at : at + n].view(_torch_dtype(torch, cat, i)).view(_storage_shape(cat, i))
            dst = result[cat.names[i]]
            try:
                dst.copy_(src)
            except (RuntimeError, TypeError) as err:
                raise InvalidArgumentError(f"{cat.where(i)}: cannot cast {cat.dtype[i]} to {dst.dtype}: {err}") from err
            at += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        del raw
