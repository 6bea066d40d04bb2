"""What goes in a safetensors file that ferry writes: the layout that
``save_safetensors`` (``save``) and ``Snapshot`` (``snapshots``) share.

A state dict becomes ``Item``s (``collect``: name, tensor, safetensors dtype,
shape, bytes), checked before any byte is written. Tied weights (one tensor
under several names) are found by ``tied_names`` alone; ``resolve_shared``
refuses other memory sharing or drops the ties (``shared="keep_one"``).

File layout: the JSON header (``header``) is padded with spaces (which
safetensors readers accept) so the data starts on a 4 KiB boundary
(``DIRECT_ALIGN``), and the tensors are ordered by element size, largest first
(``file_order``, as ``safetensors.torch.save_file`` does), so every tensor sits
aligned to its element size in the file and in a memory map. A sharded save
cuts the items into files as Hugging Face does (``shard_plan``); ``Plan`` is
every file's path, items and header, decided before the first write. Which
files a save writes and how they replace the earlier checkpoint whole:
``ferry.torch.publish``. How the bytes get there: ``ferry.torch.save``.
"""

from __future__ import annotations

import json

from .. import units
from ..atomic_file import DIRECT_ALIGN, check_replaceable
from ..errors import InvalidArgumentError
from . import publish as _publish
from ._torch import torch_module as _torch
from .safetensors import SAFETENSORS_TO_TORCH

# The longest header safetensors reads (its MAX_HEADER_SIZE; ferry's loader has the
# same, kMaxHeaderBytes in src/load/safetensors.h): a longer one makes a file no one reads.
MAX_HEADER_BYTES = 100_000_000


def _torch_to_code(torch) -> dict:
    out = {}
    for code, name in SAFETENSORS_TO_TORCH.items():
        dt = getattr(torch, name, None)
        if dt is not None:
            out[dt] = code
    return out


class Item:
    """One tensor of one file: its name, tensor, safetensors dtype, shape and bytes."""

    __slots__ = ("name", "tensor", "code", "shape", "nbytes", "itemsize")

    def __init__(self, name, tensor, code):
        self.name, self.tensor, self.code = name, tensor, code
        self.itemsize = tensor.element_size()
        self.nbytes = tensor.numel() * self.itemsize
        shape = list(tensor.shape)
        if code == "F4":  # float4_e2m1fn_x2: two values per element, safetensors counts values
            shape[-1] *= 2
        self.shape = shape


def collect(obj, what: str = "save_safetensors") -> list[Item]:
    """The state dict's tensors as Items, in order; InvalidArgumentError on
    anything safetensors cannot hold."""
    torch = _torch()
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"{what}: expected a dict of tensors (a state dict), not {type(obj).__name__}")
    codes = _torch_to_code(torch)
    items = []
    for name, t in obj.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"{what}: key {name!r} is a {type(name).__name__}, not a str")
        if name == "__metadata__":
            raise InvalidArgumentError(f"{what}: '__metadata__' is reserved in safetensors (use metadata=)")
        check_text(name, f"{what}: key")
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{what}: {name!r} is a {type(t).__name__}, not a tensor")
        if t.layout != torch.strided:
            raise InvalidArgumentError(f"{what}: {name!r} is a {t.layout} tensor; safetensors holds dense tensors")
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"{what}: {name!r} is on {t.device}; CPU and CUDA tensors are saved")
        if not t.is_contiguous():
            raise InvalidArgumentError(f"{what}: {name!r} is not contiguous (call .contiguous() first)")
        code = codes.get(t.dtype)
        if code is None:
            raise InvalidArgumentError(f"{what}: {name!r} has dtype {t.dtype}, which safetensors has no code for")
        items.append(Item(name, t, code))
    return items


def check_text(text: str, where: str) -> None:
    """InvalidArgumentError unless text encodes as UTF-8 (safetensors' JSON):
    a lone surrogate (a file name decoded with surrogateescape) does not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{where} {text!r} is not valid Unicode text (a lone surrogate "
                                   f"{text[e.start]!r} at index {e.start}); safetensors stores names and "
                                   "metadata as UTF-8: give a name that is text") from None


def storage_span(it: Item):
    """(device, first byte, end) of the memory an item's tensor occupies."""
    t = it.tensor
    start = t.untyped_storage().data_ptr() + t.storage_offset() * it.itemsize
    return (t.device, start, start + it.nbytes)


def tie_key(it: Item) -> tuple:
    """Items with equal keys are one tensor under several names (tied weights):
    the same memory, dtype and shape, and the same conjugate and negative bits
    (x.conj() shares x's memory but holds other values)."""
    t = it.tensor
    return (storage_span(it), t.dtype, tuple(t.shape), t.is_conj(), t.is_neg())


def tied_names(items: list[Item]) -> dict[str, str]:
    """{name: the first name of the same tensor} for every tied weight after
    the first of its names (items in state-dict order; empty tensors tie to
    nothing). The one place ties are found: save drops them, a snapshot
    copies them once."""
    first: dict = {}
    ties: dict[str, str] = {}
    for it in items:
        if it.nbytes:
            kept = first.setdefault(tie_key(it), it.name)
            if kept != it.name:
                ties[it.name] = kept
    return ties


def _overlaps(items: list[Item]) -> list[list[Item]]:
    """Groups of two or more items whose bytes overlap (on one device)."""
    spans = sorted(((storage_span(it), it) for it in items if it.nbytes), key=lambda x: (str(x[0][0]), x[0][1], x[0][2]))
    groups: list[list] = []
    end = None
    for (dev, b, e), it in spans:
        if groups and end is not None and end[0] == dev and b < end[1]:
            groups[-1].append(it)
            end = (dev, max(end[1], e))
        else:
            groups.append([it])
            end = (dev, e)
    return [g for g in groups if len(g) > 1]


def resolve_shared(items: list[Item], shared: str, what: str = "save_safetensors") -> tuple[list[Item], dict]:
    """(items to write, metadata {dropped name: kept name}). Tensors whose
    bytes overlap are refused, unless they are the same tensor under several
    names (tied weights) and shared="keep_one": then the name that comes first
    in the state dict is kept (a transformers model's input embedding, as
    save_pretrained keeps it), the others recorded as safetensors' save_model
    does."""
    if shared not in ("error", "keep_one"):
        raise InvalidArgumentError(f"shared={shared!r}: expected 'error' or 'keep_one'")
    position = {it.name: i for i, it in enumerate(items)}
    for g in _overlaps(items):
        same = len({tie_key(it) for it in g}) == 1
        if shared == "error" or not same:
            names = sorted((it.name for it in g), key=position.__getitem__)
            why = "tied weights" if same else "overlapping views of one storage"
            if not same and len({tie_key(it)[:3] for it in g}) == 1:
                why = "one is a conjugate or negative view of the other: other values in the same memory"
            hint = " (shared='keep_one' writes one of them)" if same else ""
            raise InvalidArgumentError(f"{what}: tensors {names} share memory ({why}){hint}")
    # Every overlap is now a tie (equal tie keys): exactly what tied_names finds.
    dropped = tied_names(items)
    return [it for it in items if it.name not in dropped], dropped


def check_metadata(metadata, what: str = "save_safetensors") -> dict:
    if metadata is None:
        return {"format": "pt"}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgumentError("metadata must be a dict of str to str (safetensors' __metadata__)")
    for k, v in metadata.items():
        check_text(k, f"{what}: metadata key")
        check_text(v, f"{what}: metadata[{k!r}]")
    return {"format": "pt", **metadata}


def shard_plan(items: list[Item], max_shard_size) -> list[list[Item]]:
    """Items in shards of at most max_shard_size bytes (a tensor larger than that
    alone), in order, as Hugging Face's split_torch_state_dict_into_shards does."""
    if max_shard_size is None:
        return [items]
    if isinstance(max_shard_size, str):
        limit = units.parse_size(max_shard_size)
    elif isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool) and max_shard_size > 0:
        limit = max_shard_size
    else:
        raise InvalidArgumentError(f"max_shard_size={max_shard_size!r}: expected a positive int or a size like '5G'")
    shards: list[list[Item]] = [[]]
    size = 0
    for it in items:
        if shards[-1] and size + it.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += it.nbytes
    return shards


def file_order(items: list[Item]) -> list[Item]:
    """Largest element size first (stable): every tensor aligned to its element size."""
    return sorted(items, key=lambda it: -it.itemsize)


def header(items: list[Item], metadata: dict, what: str = "save_safetensors") -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple
    of DIRECT_ALIGN (of 8, safetensors' own, where that would pass the limit);
    items in file order. InvalidArgumentError if it is over MAX_HEADER_BYTES."""
    h: dict = {"__metadata__": metadata} if metadata else {}
    at = 0
    for it in items:
        h[it.name] = {"dtype": it.code, "shape": it.shape, "data_offsets": [at, at + it.nbytes]}
        at += it.nbytes
    text = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    total = -(-(8 + len(text)) // DIRECT_ALIGN) * DIRECT_ALIGN
    if total - 8 > MAX_HEADER_BYTES:
        total = -(-(8 + len(text)) // 8) * 8
    if total - 8 > MAX_HEADER_BYTES:
        raise InvalidArgumentError(
            f"{what}: the safetensors header of this file would be {total - 8:,} bytes ({len(items)} tensors), "
            f"over the {MAX_HEADER_BYTES:,} bytes safetensors (and ferry's loader) read: no reader could open "
            "the file. Use shorter metadata, or max_shard_size= to spread the tensors over several files")
    text += b" " * (total - 8 - len(text))
    return (total - 8).to_bytes(8, "little") + text


class Plan:
    """What one save writes, decided and checked before any byte is: ``files``
    [(path, items in file order, header)], and the index's bytes (sharded) or
    None."""

    def __init__(self, path: str, items: list[Item], metadata: dict, max_shard_size, what: str):
        if not path.endswith(".safetensors") and max_shard_size is not None:
            raise InvalidArgumentError(
                f"{what}: {path}: a sharded save needs a path ending in .safetensors (e.g. model.safetensors)")
        shards = shard_plan(items, max_shard_size)
        names = _publish.shard_names(path, len(shards))
        self.path = path
        self.index = _publish.index_bytes(shards, names) if len(shards) > 1 else None
        if self.index is not None:
            _publish.check_files(path, names + [path + _publish.INDEX_SUFFIX], what)
        ordered = [file_order(shard) for shard in shards]
        self.files = [(name, items, header(items, metadata, what)) for name, items in zip(names, ordered)]


def prepare(obj, path, metadata, shared: str, what: str):
    """(checked path, items to write, metadata with the dropped ties recorded).
    A tie that the metadata cannot record (its name is a metadata key already:
    "format", or one of metadata=) is not dropped: written as a tensor of its
    own, it loses nothing."""
    path = check_replaceable(path)
    items = collect(obj, what)
    meta = check_metadata(metadata, what)
    kept, dropped = resolve_shared(items, shared, what)
    unrecorded = {k for k in dropped if k in meta}
    if unrecorded:
        kept = [it for it in items if it.name not in dropped or it.name in unrecorded]
    meta.update({k: v for k, v in dropped.items() if k not in unrecorded})
    return path, kept, meta
