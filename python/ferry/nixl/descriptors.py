"""Descriptor lists (pure Python): Descs and its builders descs, slots and
blocks; xfer_descs and reg_descs turn one into NIXL's lists."""

from __future__ import annotations

from typing import Iterable

from .._resolve import resolve
from ..errors import InvalidArgumentError
from ..pool import Buffer
from .library import _nixl_call

MEM_TYPES = ("DRAM", "VRAM")



def _count(value, what: str) -> int:
    """value as an int >= 0 (numpy integers too), else InvalidArgumentError quoting it."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what}={value!r}: expected an integer")
    try:
        n = value.__index__()
    except (AttributeError, TypeError):
        raise InvalidArgumentError(f"{what}={value!r}: expected an integer") from None
    if n < 0:
        raise InvalidArgumentError(f"{what}={n} is negative")
    return n


def _mem_type(mem_type) -> str:
    if mem_type not in MEM_TYPES:
        raise InvalidArgumentError(f"mem_type={mem_type!r}: expected one of {', '.join(MEM_TYPES)}")
    return mem_type


class Descs:
    """A NIXL descriptor list: ``mem_type`` ("DRAM" host memory, "VRAM" GPU
    memory) and ``rows``, a tuple of (address, nbytes, device) (device: the GPU
    index for VRAM, 0 for DRAM). It holds the objects it was built from, so a
    transfer that holds it keeps its memory alive."""

    __slots__ = ("mem_type", "rows", "_owners")

    def __init__(self, mem_type: str, rows: Iterable[tuple[int, int, int]], owners: tuple = ()):
        self.mem_type = _mem_type(mem_type)
        checked = []
        for i, row in enumerate(rows):
            try:
                address, nbytes, device = row
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"descriptor {i}: {row!r} is not an (address, nbytes, device) "
                                           "triple") from None
            address = _count(address, f"descriptor {i}: address")
            nbytes = _count(nbytes, f"descriptor {i}: nbytes")
            device = _count(device, f"descriptor {i}: device")
            if address == 0:
                raise InvalidArgumentError(f"descriptor {i}: address 0 (a null pointer)")
            if nbytes == 0:
                raise InvalidArgumentError(f"descriptor {i} at {address:#x}: 0 bytes (a descriptor needs at least 1)")
            if address + nbytes > 1 << 64:
                raise InvalidArgumentError(f"descriptor {i}: {address:#x} + {nbytes} bytes passes the end of "
                                           "the address space")
            checked.append((address, nbytes, device))
        self.rows = tuple(checked)
        self._owners = tuple(owners)

    @classmethod
    def _checked(cls, mem_type: str, rows, owners: tuple) -> "Descs":
        """Rows made from rows a Descs already checked (joined ones): no second check."""
        d = cls.__new__(cls)
        d.mem_type, d.rows, d._owners = mem_type, tuple(rows), tuple(owners)
        return d

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __repr__(self) -> str:
        return f"Descs({self.mem_type}, {len(self.rows)} rows, {self.nbytes} bytes)"

    def __eq__(self, other) -> bool:
        return isinstance(other, Descs) and (self.mem_type, self.rows) == (other.mem_type, other.rows)

    __hash__ = None

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.rows)

    def __add__(self, other: "Descs") -> "Descs":
        if not isinstance(other, Descs):
            return NotImplemented
        if other.mem_type != self.mem_type:
            raise InvalidArgumentError(f"cannot join a {self.mem_type} and a {other.mem_type} descriptor list: "
                                       "one transfer side has one memory type")
        return Descs(self.mem_type, self.rows + other.rows, self._owners + other._owners)

    def array(self):
        """The rows as an N x 3 numpy uint64 array (what NIXL takes fastest)."""
        import numpy as np

        return np.array(self.rows, dtype=np.uint64).reshape(len(self.rows), 3)

    def to_dict(self) -> dict:
        """{"mem_type", "rows"}: JSON-ready, for telling a peer where memory is."""
        return {"mem_type": self.mem_type, "rows": [list(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> "Descs":
        """The inverse of to_dict (a peer's memory: nothing to keep alive here)."""
        try:
            return cls(d["mem_type"], [tuple(r) for r in d["rows"]])
        except (KeyError, TypeError) as e:
            raise InvalidArgumentError(f"not a descriptor list: {d!r:.200} ({e})") from None


def _whole(obj, nbytes, mem_type, device) -> tuple[int, int, str, int]:
    """(address, nbytes, mem_type, device) of one object (see descs())."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if nbytes is None or mem_type is None:
            raise InvalidArgumentError(f"an address given as an int ({obj:#x}) needs nbytes and mem_type")
        return obj, _count(nbytes, "nbytes"), _mem_type(mem_type), _count(device or 0, "device")
    if isinstance(obj, Buffer) and obj.released:
        raise InvalidArgumentError("this ferry Buffer was released: it describes no memory")
    address, size, cuda_device = resolve(obj)
    found = "DRAM" if cuda_device is None else "VRAM"
    if mem_type is not None and _mem_type(mem_type) != found:
        raise InvalidArgumentError(f"mem_type={mem_type!r}, but this {type(obj).__name__} is {found} memory")
    if nbytes is not None:
        nbytes = _count(nbytes, "nbytes")
        if nbytes > size:
            raise InvalidArgumentError(f"nbytes={nbytes} is more than the {size} bytes of this {type(obj).__name__}")
        size = nbytes
    return address, size, found, (cuda_device or 0) if device is None else _count(device, "device")


def descs(obj, nbytes: int | None = None, *, mem_type: str | None = None, device: int | None = None) -> Descs:
    """One descriptor for a whole object: a ferry.Buffer, a torch tensor (CPU:
    DRAM; CUDA: VRAM on its device; contiguous), anything with the buffer
    protocol or __cuda_array_interface__; or an int address with nbytes and
    mem_type. nbytes < the object's size describes a prefix."""
    address, size, kind, dev = _whole(obj, nbytes, mem_type, device)
    return Descs(kind, [(address, size, dev)], () if isinstance(obj, int) else (obj,))


def slots(obj, indices, slot_bytes: int | None = None, *, mem_type: str | None = None,
          device: int | None = None) -> Descs:
    """Descriptors for equal slots of one object: row k covers bytes
    [indices[k] * slot_bytes, + slot_bytes) of it. slot_bytes defaults to one
    index along the first dimension of an array or tensor (``tensor[i]``, a KV
    block). indices: ints, a list or an int array."""
    address, size, kind, dev = _whole(obj, None, mem_type, device)
    if slot_bytes is None:
        shape = getattr(obj, "shape", None)
        if not shape:
            raise InvalidArgumentError(f"slot_bytes is needed for a {type(obj).__name__} (it has no shape)")
        slot_bytes = size // int(shape[0]) if int(shape[0]) else 0
    slot_bytes = _count(slot_bytes, "slot_bytes")
    if slot_bytes == 0:
        raise InvalidArgumentError("slot_bytes=0: a slot needs at least 1 byte")
    count = size // slot_bytes
    rows = []
    for k, i in enumerate(_int_list(indices, "indices")):
        if i < 0 or i >= count:
            raise InvalidArgumentError(f"indices[{k}]={i} is outside the {count} slots of {slot_bytes} bytes "
                                       f"in this {size}-byte {type(obj).__name__}")
        rows.append((address + i * slot_bytes, slot_bytes, dev))
    return Descs(kind, rows, () if isinstance(obj, int) else (obj,))


def _int_list(values, what: str) -> list[int]:
    """A list of Python ints from ints, a sequence or a 1-d integer array."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        dtype = getattr(values, "dtype", None)
        if dtype is not None and getattr(dtype, "kind", "i") not in "iu":
            raise InvalidArgumentError(f"{what}: an array of {dtype}, expected integers")
        values = values.tolist()
    if isinstance(values, int) and not isinstance(values, bool):
        return [values]
    try:
        return [v if isinstance(v, int) and not isinstance(v, bool) else _count(v, f"{what}[{k}]")
                for k, v in enumerate(values)]
    except TypeError:
        raise InvalidArgumentError(f"{what}: expected a list or array of integers, "
                                   f"not {type(values).__name__}") from None


def blocks(addresses, lengths, *, mem_type: str, device: int = 0, owner=None) -> Descs:
    """Descriptors from addresses and lengths (lists or int64 arrays; lengths
    may be one int for equal blocks). owner: an object to keep alive with them."""
    addrs = _int_list(addresses, "addresses")
    lens = _int_list(lengths, "lengths")
    if len(lens) == 1 and len(addrs) != 1:
        lens = lens * len(addrs)
    if len(lens) != len(addrs):
        raise InvalidArgumentError(f"{len(addrs)} addresses but {len(lens)} lengths")
    dev = _count(device, "device")
    return Descs(mem_type, [(a, n, dev) for a, n in zip(addrs, lens)], () if owner is None else (owner,))


def _agent(agent, what: str):
    """agent, checked: a NIXL agent (make_agent()) or InvalidArgumentError naming the
    argument (agent=None gave "AttributeError: 'NoneType' object has no attribute ...")."""
    if agent is None or not callable(getattr(agent, "get_xfer_descs", None)):
        text = repr(agent)
        text = text if len(text) <= 80 else text[:77] + "..."
        raise InvalidArgumentError(f"{what}: agent={text}: expected a NIXL agent (ferry.nixl.make_agent())")
    return agent


def xfer_descs(agent, d: Descs):
    """NIXL's transfer descriptor list (nixlXferDList) for `d`."""
    _agent(agent, "xfer_descs")
    return _nixl_call("get_xfer_descs", agent.get_xfer_descs, d.array(), d.mem_type)


def reg_descs(agent, d: Descs):
    """NIXL's registration descriptor list (nixlRegDList) for `d`."""
    _agent(agent, "reg_descs")
    return _nixl_call("get_reg_descs", agent.get_reg_descs, d.array(), d.mem_type)
