"""ferry memory as a NIXL endpoint: pools registered with a ``nixl_agent``,
descriptor lists built from ferry buffers, blocks and tensors, transfers to and
from a remote agent's memory, waited for with a timeout.

NIXL (NVIDIA's inference transfer library, over UCX; what vLLM and Dynamo use
between nodes) is optional: ``pip install 'ferry[nixl]'`` brings ``nixl-cu13``.
Without it this module still imports, its descriptor builders (``descs``,
``slots``, ``blocks``) work, and everything that needs an agent raises
``NixlUnavailableError`` (a ``NotSupportedError``) naming the package.

The pieces, bottom-up:

- ``Descs``: a descriptor list, ``mem_type`` ("DRAM" or "VRAM") and rows of
  (address, nbytes, device); it keeps the objects it was built from alive.
  ``descs(obj)`` (a whole ferry.Buffer, torch tensor, buffer or array),
  ``slots(obj, indices, slot_bytes)`` (equal slots of one object, e.g. KV
  blocks ``tensor[i]``), ``blocks(addresses, lengths, mem_type=...)`` (lists or
  int64 arrays). ``xfer_descs`` / ``reg_descs`` turn one into NIXL's lists.
- ``agent(name)``: a NIXL agent with UCX settings chosen for this machine
  and its traffic (ferry.ucx: the transports that start here, the fastest set
  for peers on this host and on others, the error handling they allow, UCX's
  RMA pipeline where GPUs are); the user's UCX_* variables and backend_params
  win. ``settings(agent).describe()`` says what was chosen and why (also
  logged at INFO by the "ferry.nixl" logger). ``make_agent`` takes NIXL's
  defaults.
- ``register_pool(agent, pool)``: a ferry ``Pool`` or ``PinnedPool`` (both
  "DRAM") registered chunk by chunk. Its chunks now; ``sync()`` registers the
  chunks the pool added since and deregisters the ones it released (it polls
  ``pool.chunk_generation``, so nothing runs inside the pool). ``register``:
  any other memory (a GPU tensor as "VRAM").
- ``post`` / ``transfer`` / ``read`` / ``write``: one NIXL transfer between
  local and remote descriptor lists; ``Transfer.wait(timeout)`` raises
  ``NixlTimeoutError`` or ``NixlError`` with what, how much and with whom.
  Rows adjacent on both sides are joined into descriptors of up to 2 MiB
  before posting (``coalesce``; ``post(coalesce=False)`` posts them as given):
  UCX pays a rendezvous per descriptor.
- ``publish_metadata`` / ``load_metadata``: an agent's metadata through a file
  (written atomically), for processes on one machine or a shared filesystem.

Keeping registrations in step: a chunk added after a peer loaded this agent's
metadata is unknown to that peer until it loads the metadata again
(``load_metadata`` or ``add_remote_agent`` updates a known agent); a peer
forgets a deregistered chunk only after ``remove_remote_agent`` and a fresh
load. ``sync()`` says what changed. A chunk is released only when no
allocation lies in it, and ``Pool.trim()`` of a plain pool may return free
pages of a used chunk to the OS: then that chunk's generation moves and
``sync()`` registers it again (a registration that pinned the old pages, as
RDMA does, would be stale). ``PinnedPool`` releases whole chunks only.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
import weakref
from typing import Iterable, Sequence

from ._resolve import resolve
from .errors import FerryError, InvalidArgumentError, NotSupportedError
from .pool import Buffer
from .ucx import NIXL_MODULES

MODULES = NIXL_MODULES  # the modules tried, in order (ferry.ucx finds UCX through them)
INSTALL_HINT = "pip install 'ferry[nixl]' (or: pip install nixl-cu13; nixl-cu12 for CUDA 12)"
MEM_TYPES = ("DRAM", "VRAM")
OPERATIONS = ("READ", "WRITE")


class NixlUnavailableError(NotSupportedError):
    """NIXL's Python package is not installed or does not load."""


class NixlError(FerryError, RuntimeError):
    """A NIXL call failed or a transfer ended in error; the message says which."""


class NixlTimeoutError(NixlError, TimeoutError):
    """A transfer was not done within its timeout (it stays posted)."""


# ---- the NIXL module ------------------------------------------------------------

_module = None
_import_error: str | None = None


def nixl():
    """NIXL's Python module (nixl_cu13, nixl_cu12 or nixl, the first that
    imports); raises NixlUnavailableError naming the package to install."""
    global _module, _import_error
    if _module is not None:
        return _module
    if _import_error is None:
        failures = []
        for name in MODULES:
            try:
                module = importlib.import_module(name)
                module.nixl_agent  # a source tree's `nixl` directory is no agent
            except Exception as e:  # ImportError, or a bundled library that does not load
                failures.append(f"{name}: {type(e).__name__}: {e}")
                continue
            _module = module
            return module
        _import_error = "; ".join(failures)
    raise NixlUnavailableError(f"ferry.nixl needs NIXL's Python package: {INSTALL_HINT}. "
                               f"Importing it failed ({_import_error})")


def available() -> bool:
    """True when NIXL's Python package imports."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why NIXL cannot be used here, or None."""
    try:
        nixl()
    except NixlUnavailableError as e:
        return str(e)
    return None


def _nixl_call(what: str, fn, *args, hint: str = ""):
    """fn(*args), a NIXL failure becoming NixlError("NIXL <what> failed: ...")."""
    try:
        return fn(*args)
    except FerryError:
        raise
    except Exception as e:  # NIXL's binding errors (nixlNotFoundError, ...) derive from Exception
        name = type(e).__name__
        detail = str(e) if str(e) and str(e) != name else ""
        message = f"NIXL {what} failed: {name}" + (f" ({detail})" if detail else "")
        raise NixlError(message + (f"; {hint}" if hint else "")) from e


def make_agent(name: str, *, backends: Sequence[str] = ("UCX",), backend_params: dict | None = None,
               progress_thread: bool = True, num_threads: int = 0):
    """A ``nixl_agent`` named `name` with `backends` (UCX by default), each
    created with its entry of `backend_params` ({"UCX": {"ucx_error_handling_mode":
    "none"}}: string values; NIXL's agent.get_plugin_params("UCX") lists them).
    The UCX_* environment variables of this process (UCX_TLS, UCX_NET_DEVICES,
    ...) choose the transports: set them before the first agent."""
    if not name:
        raise InvalidArgumentError("a NIXL agent needs a non-empty name")
    backends = [backends] if isinstance(backends, str) else list(backends)
    params = dict(backend_params or {})
    unknown = set(params) - set(backends)
    if unknown:
        raise InvalidArgumentError(f"backend_params for {sorted(unknown)}, which are not among backends "
                                   f"{list(backends)}")
    module = nixl()
    config = module.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
    agent = _nixl_call(f"agent creation ({name!r})", module.nixl_agent, name, config)
    for backend in backends:
        if backend not in agent.get_plugin_list():
            raise NixlError(f"NIXL agent {name!r}: no {backend!r} plugin (found: {agent.get_plugin_list()})")
        init = {str(k): str(v) for k, v in params.get(backend, {}).items()}
        if num_threads > 0:
            init.setdefault("num_threads", str(num_threads))
        _nixl_call(f"{backend} backend creation for agent {name!r} with {init}", agent.create_backend, backend, init,
                   hint="NIXL's log above says why; with UCX, UCX_TLS must leave a transport that supports the "
                        "endpoints' error handling (tcp or an RDMA one for 'peer', NIXL's default), or pass "
                        "backend_params={'UCX': {'ucx_error_handling_mode': 'none'}}; where NVIDIA GPUs are "
                        "present NIXL also wants a CUDA transport in UCX_TLS (cuda_copy, or cuda)")
    return agent


log = logging.getLogger("ferry.nixl")
_env_lock = threading.Lock()  # held while agent() sets UCX_* variables for one agent creation
_settings: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # agent -> ucx.Settings


def agent(name: str, *, peers: str = "any", backend_params: dict | None = None, cma: bool | None = None,
          progress_thread: bool = True, num_threads: int = 0):
    """A ``nixl_agent`` with UCX, configured for this machine and traffic.

    peers: where the agents it talks to run: "local" (this host), "remote"
    (other nodes) or "any" (default). UCX's transports are probed once per
    process (ferry.ucx.probe: a child process, about a second) and
    ferry.ucx.choose picks UCX_TLS (CUDA transports, shared memory, RDMA, tcp,
    as they start here), UCX_RMA_PPLN_ENABLE=y where GPUs are, 4 MiB
    rendezvous fragments for GPUs and peers on this host, and the
    backend's ``ucx_error_handling_mode`` ("none" where shared-memory or
    cuda_ipc lanes are chosen: they cannot report a dead peer; "peer" for
    remote-only traffic). cma: allow UCX's cma transport between local
    processes (default: only where no CUDA transport starts; see ferry.ucx).

    Precedence: a UCX_* variable in this process's environment and an entry
    of backend_params ({"UCX": {...}}, as make_agent takes) always win; they
    are reported in ``settings(agent)``. UCX reads its variables when the
    backend is created, so ferry's choices are put into os.environ for that
    call only (under a lock, restored right after): other threads that read
    the environment during those milliseconds see them; later agents,
    make_agent() and child processes do not."""
    from . import ucx

    if not name:
        raise InvalidArgumentError("a NIXL agent needs a non-empty name")
    params = dict(backend_params or {})
    unknown = set(params) - {"UCX"}
    if unknown:
        raise InvalidArgumentError(f"backend_params for {sorted(unknown)}: ferry.nixl.agent creates the UCX "
                                   "backend only (make_agent takes others)")
    nixl()  # NixlUnavailableError before the probe
    chosen = ucx.choose(ucx.probe(), peers=peers, backend_params=params.get("UCX"), cma=cma)
    with _env_lock:
        saved = {k: os.environ.get(k) for k in chosen.env}
        os.environ.update(chosen.env)
        try:
            created = make_agent(name, backend_params={"UCX": dict(chosen.backend_params)},
                                 progress_thread=progress_thread, num_threads=num_threads)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    _settings[created] = chosen
    log.info("NIXL agent %r: %s", name, chosen.describe())
    return created


def settings(a):
    """The ferry.ucx.Settings that agent() chose for `a` (``.describe()``:
    the text); InvalidArgumentError for an agent that agent() did not make."""
    try:
        return _settings[a]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"{type(a).__name__} was not made by ferry.nixl.agent(): no settings "
                                   "recorded") from None


# ---- descriptor lists (pure Python) ------------------------------------------------


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


# ---- registrations ----------------------------------------------------------------


class Registration:
    """Memory registered with a NIXL agent until close() (or the end of a with
    block). Holds what it describes alive."""

    def __init__(self, agent, d: Descs, backends: Sequence[str] = ()):
        _agent(agent, "Registration")
        self.agent = agent
        self.descs = d
        self._backends = list(backends)
        self._reg = _nixl_call(f"register_memory of {len(d)} {d.mem_type} region(s), {d.nbytes} bytes",
                               agent.register_memory, reg_descs(agent, d), d.mem_type, self._backends)

    def close(self) -> None:
        if self._reg is not None:
            reg, self._reg = self._reg, None
            _nixl_call("deregister_memory", self.agent.deregister_memory, reg, self._backends)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register(agent, obj, nbytes: int | None = None, *, mem_type: str | None = None,
             device: int | None = None, backends: Sequence[str] = ()) -> Registration:
    """Register memory with `agent`: a Descs, or anything descs() takes (a GPU
    tensor becomes VRAM on its device)."""
    _agent(agent, "register")
    d = obj if isinstance(obj, Descs) else descs(obj, nbytes, mem_type=mem_type, device=device)
    return Registration(agent, d, backends)


class Changes:
    """What a PoolRegistration.sync() did: chunks registered (added) and
    deregistered (removed), as (base, nbytes). Truthy when anything changed
    (then peers need this agent's metadata again)."""

    __slots__ = ("added", "removed")

    def __init__(self, added=(), removed=()):
        self.added = list(added)
        self.removed = list(removed)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def __repr__(self) -> str:
        return f"Changes(added={len(self.added)}, removed={len(self.removed)})"


class PoolRegistration:
    """A ferry Pool's (or PinnedPool's) chunks registered with a NIXL agent as
    DRAM, one region per chunk (no allocation spans two). sync() follows the
    pool; close() deregisters everything. Not thread-safe: sync from one
    thread (or hold a lock of your own around it)."""

    mem_type = "DRAM"

    def __init__(self, agent, pool, backends: Sequence[str] = ()):
        _agent(agent, "PoolRegistration")
        chunks = getattr(pool, "chunks", None)
        if not callable(chunks) or not hasattr(pool, "chunk_generation"):
            raise InvalidArgumentError(f"register_pool needs a ferry.Pool or ferry.PinnedPool, "
                                       f"not {type(pool).__name__}")
        self.agent = agent
        self.pool = pool
        self._backends = list(backends)
        self._regs: dict[tuple[int, int], tuple[int, object]] = {}  # (base, generation) -> (nbytes, reg list)
        self._seen = None  # pool.chunk_generation at the last sync
        self._closed = False
        self.sync()

    def sync(self) -> Changes:
        """Register the pool's new chunks and deregister those it released (or
        partly returned to the OS: those are registered again). Cheap when the
        pool did not change (one lock-free read)."""
        if self._closed:
            raise InvalidArgumentError("this PoolRegistration was closed")
        generation = self.pool.chunk_generation  # before the snapshot: a later change shows next time
        if generation == self._seen:
            return Changes()
        now = {(base, gen): nbytes for base, nbytes, gen in self.pool.chunks()}
        removed = [key for key in self._regs if key not in now]
        changes = Changes()
        for key in removed:
            nbytes, reg = self._regs.pop(key)
            _nixl_call(f"deregister_memory of a pool chunk at {key[0]:#x}", self.agent.deregister_memory, reg,
                       self._backends)
            changes.removed.append((key[0], nbytes))
        for key, nbytes in sorted(now.items()):
            if key in self._regs:
                continue
            d = Descs("DRAM", [(key[0], nbytes, 0)])
            reg = _nixl_call(f"register_memory of a {nbytes}-byte pool chunk at {key[0]:#x}",
                             self.agent.register_memory, reg_descs(self.agent, d), "DRAM", self._backends)
            self._regs[key] = (nbytes, reg)
            changes.added.append((key[0], nbytes))
        self._seen = generation
        return changes

    @property
    def regions(self) -> list[tuple[int, int]]:
        """(base, nbytes) of the registered chunks, by address."""
        return sorted((base, nbytes) for (base, _), (nbytes, _) in self._regs.items())

    def check(self, d: Descs) -> None:
        """Raise InvalidArgumentError unless every row of `d` lies inside one
        registered chunk (after a sync())."""
        self.sync()
        regions = self.regions
        for i, (address, nbytes, _) in enumerate(d.rows):
            if not any(base <= address and address + nbytes <= base + size for base, size in regions):
                raise InvalidArgumentError(f"descriptor {i} ({address:#x}, {nbytes} bytes) is not inside one "
                                           f"chunk of the registered pool ({len(regions)} chunk(s))")

    def close(self) -> None:
        """Deregister every chunk (idempotent)."""
        if self._closed:
            return
        self._closed = True
        regs, self._regs = self._regs, {}
        for nbytes, reg in regs.values():
            _nixl_call("deregister_memory", self.agent.deregister_memory, reg, self._backends)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register_pool(agent, pool, *, backends: Sequence[str] = ()) -> PoolRegistration:
    """Register `pool`'s chunks with `agent` as DRAM (see PoolRegistration)."""
    _agent(agent, "register_pool")
    return PoolRegistration(agent, pool, backends)


# ---- metadata ------------------------------------------------------------------------


def add_remote(agent, metadata: bytes) -> str:
    """Load a remote agent's metadata into `agent` (a known agent is updated:
    regions it registered since are added); returns its name as a str."""
    _agent(agent, "add_remote")
    name = _nixl_call("add_remote_agent", agent.add_remote_agent, metadata)
    return name.decode() if isinstance(name, bytes) else name


def publish_metadata(agent, path: str | os.PathLike, extra: dict | None = None) -> None:
    """Write `agent`'s metadata (and `extra`, JSON: e.g. where its blocks are)
    to `path`, atomically: a reader sees the whole file or none."""
    _agent(agent, "publish_metadata")
    metadata = _nixl_call("get_agent_metadata", agent.get_agent_metadata)
    document = {"agent": agent.name, "metadata": metadata.hex(), "extra": extra or {}}
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(document, f)
    os.replace(tmp, path)


def load_metadata(agent, path: str | os.PathLike, timeout: float = 60.0) -> tuple[str, dict]:
    """Wait (up to `timeout` s) for a file publish_metadata() wrote, add that
    agent to `agent` (a known agent is updated) and return (its name, extra)."""
    _agent(agent, "load_metadata")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise NixlTimeoutError(f"no NIXL metadata at {os.fspath(path)!r} after {timeout:g} s: "
                                   "did the peer process start and publish it?")
        time.sleep(0.01)
    with open(path) as f:
        document = json.load(f)
    name = _nixl_call(f"add_remote_agent ({document.get('agent')!r} from {os.fspath(path)!r})",
                      add_remote, agent, bytes.fromhex(document["metadata"]))
    return name, document.get("extra", {})


# ---- transfers ----------------------------------------------------------------------


def _as_descs(d, what: str) -> Descs:
    if isinstance(d, Descs):
        return d
    try:
        return descs(d)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{what}: {e}") from None


def _check_pair(local: Descs, remote: Descs) -> None:
    if not local:
        raise InvalidArgumentError("no descriptors: a transfer needs at least one")
    if len(local) != len(remote):
        raise InvalidArgumentError(f"{len(local)} local descriptors but {len(remote)} remote ones: "
                                   "a transfer pairs them one to one")
    for i, ((_, a, _), (_, b, _)) in enumerate(zip(local.rows, remote.rows)):
        if a != b:
            raise InvalidArgumentError(f"descriptor {i}: {a} bytes locally, {b} remotely: paired descriptors "
                                       "have the same length")


class Transfer:
    """A posted NIXL transfer. wait(timeout) until it is done; done (a poll);
    release() frees its handle (aborting it if still running); repost() runs
    the same transfer again. A context manager that releases on exit.
    ``parts``: the NIXL requests it was posted as (post(split=N)); ``posted``:
    the descriptors posted, after post() joined adjacent ones (coalesce)."""

    def __init__(self, agent, handles, op: str, local: Descs, remote: Descs, remote_agent: str,
                 posted: int | None = None):
        _agent(agent, "Transfer")
        self.agent = agent
        self.op = op
        self.local = local  # held: their memory stays alive while the transfer may run
        self.remote = remote
        self.remote_agent = remote_agent
        self.posted = len(local) if posted is None else posted  # descriptors posted (after coalescing)
        self._handles = list(handles) if isinstance(handles, (list, tuple)) else [handles]
        self._handle = self._handles[0]
        self._posted = 0.0
        self.seconds: float | None = None  # post to done, as seen by done/wait

    @property
    def nbytes(self) -> int:
        return self.local.nbytes

    @property
    def backend(self) -> str:
        """The NIXL backend that runs this transfer (e.g. "UCX")."""
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        return _nixl_call("query_xfer_backend", self.agent.query_xfer_backend, self._handle)

    @property
    def parts(self) -> int:
        return len(self._handles)

    def _what(self) -> str:
        arrow, direction = ("<-", "from") if self.op == "READ" else ("->", "to")
        return (f"NIXL {self.op} of {self.nbytes} bytes ({len(self.local)} descriptor(s), {self.local.mem_type} "
                f"{arrow} {self.remote.mem_type}) {direction} agent {self.remote_agent!r}")

    def _post(self, notif: bytes) -> None:
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        self.seconds = None
        self._posted = time.perf_counter()
        states = [_nixl_call(f"post of {self._what()}", self.agent.transfer, h, notif) for h in self._handles]
        self._settle(states)

    def repost(self, notif: bytes = b"") -> "Transfer":
        """Post the same transfer again (after it is done)."""
        if not self.done:
            raise InvalidArgumentError(f"{self._what()} is still running: wait() before repost()")
        self._post(notif)
        return self

    def _settle(self, states: list[str]) -> bool:
        bad = [s for s in states if s not in ("DONE", "PROC")]
        if not bad and all(s == "DONE" for s in states):
            if self.seconds is None:
                self.seconds = time.perf_counter() - self._posted
            return True
        if not bad:
            return False
        raise NixlError(f"{self._what()} failed (state {bad[0]}); NIXL's log above says why "
                        "(for UCX: the peer may be gone, or no transport both sides share reaches this memory)")

    @property
    def done(self) -> bool:
        """True once the transfer completed; raises NixlError if it failed."""
        if self.seconds is not None:
            return True
        if self._handle is None:
            raise InvalidArgumentError("this transfer was released")
        return self._settle([_nixl_call(f"check_xfer_state of {self._what()}", self.agent.check_xfer_state, h)
                             for h in self._handles])

    def wait(self, timeout: float | None = 60.0) -> "Transfer":
        """Block until done (polling NIXL, which also drives its progress);
        NixlTimeoutError after `timeout` seconds (None: no limit) with the
        transfer still posted, NixlError if it failed."""
        start = time.perf_counter()
        pause = 0.0
        while not self.done:
            waited = time.perf_counter() - start
            if timeout is not None and waited > timeout:
                raise NixlTimeoutError(f"{self._what()} not done after {timeout:g} s; it is still posted "
                                       "(release() aborts it). Is the peer alive, and do both sides' UCX_TLS "
                                       "share a transport for this memory?")
            # Spin for the first millisecond (a transfer of a few MiB is done by then), then back off to 1 ms.
            if waited > 1e-3:
                pause = min(1e-3, max(2e-5, pause * 2))
                time.sleep(pause)
        return self

    def release(self) -> None:
        """Free the NIXL handle (aborting a running transfer); idempotent."""
        if self._handle is not None:
            handles, self._handles, self._handle = self._handles, [], None
            for handle in handles:
                _nixl_call(f"release_xfer_handle of {self._what()}", self.agent.release_xfer_handle, handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


COALESCE_BYTES = 2 << 20  # post()'s default cap on a joined descriptor (see coalesce)


def coalesce(local: Descs, remote: Descs, max_bytes: int = COALESCE_BYTES) -> tuple[Descs, Descs]:
    """Pairs of rows that continue each other on BOTH sides joined into one
    pair: (local row, remote row) pairs are taken in local-address order, and
    a pair whose local and remote memory start where the previous pair's end
    (same devices) is appended to it while the joined length stays within
    `max_bytes`. Every local byte still pairs with the same remote byte, so a
    transfer of the result moves exactly what the original moves; rows that
    are not adjacent on both sides stay separate, and a row longer than
    max_bytes stays whole. Returns (local, remote) themselves when nothing
    joins. Why: UCX runs each descriptor as its own rendezvous (a handshake per
    descriptor), which caps 64 KiB blocks at ~5 GB/s on the H200 machine where
    2 MiB ones reach 40+; a KV offload of consecutive blocks joins into few
    large descriptors. Pure (no NIXL)."""
    _check_pair(local, remote)
    max_bytes = _count(max_bytes, "max_bytes")
    n = len(local.rows)
    if n < 2 or max_bytes == 0:
        return local, remote
    lrows, rrows = local.rows, remote.rows
    order = sorted(range(n), key=lambda k: lrows[k][0])
    out_l, out_r = [], []
    la, ln, ld = lrows[order[0]]
    ra, _, rd = rrows[order[0]]
    for k in order[1:]:
        a, m, d = lrows[k]
        b, _, e = rrows[k]
        if a == la + ln and b == ra + ln and d == ld and e == rd and ln + m <= max_bytes:
            ln += m
            continue
        out_l.append((la, ln, ld))
        out_r.append((ra, ln, rd))
        la, ln, ld, ra, rd = a, m, d, b, e
    out_l.append((la, ln, ld))
    out_r.append((ra, ln, rd))
    if len(out_l) == n:
        return local, remote
    return (Descs._checked(local.mem_type, out_l, local._owners),
            Descs._checked(remote.mem_type, out_r, remote._owners))


_join = coalesce  # post()'s argument of that name hides the function there


def _split_rows(d: Descs, parts: int) -> list[Descs]:
    """d's rows in `parts` contiguous groups of nearly equal row counts."""
    n = len(d.rows)
    bounds = [n * k // parts for k in range(parts + 1)]
    return [Descs(d.mem_type, d.rows[a:b], d._owners) for a, b in zip(bounds, bounds[1:]) if b > a]


def _coalesce_limit(value) -> int:
    """post()'s coalesce= as a byte cap (0: off)."""
    if value is True:
        return COALESCE_BYTES
    if value is False or value is None:
        return 0
    return _count(value, "coalesce")


def _remote_covers(agent, remote_agent: str, remote: Descs) -> bool:
    """Whether each of `remote`'s rows lies inside one region of the remote
    agent's metadata as loaded here (NIXL's check, quiet; True where this NIXL
    has no such check: initialize_xfer's failure is the fallback then)."""
    check = getattr(agent, "check_remote_metadata", None)
    if check is None:
        return True
    try:
        return bool(check(remote_agent, xfer_descs(agent, remote)))
    except Exception:
        return True


def _initialize(agent, op: str, local: Descs, remote: Descs, remote_agent: str, notif: bytes, backends,
                split: int) -> list:
    """NIXL request handles for local/remote in min(split, rows) contiguous parts
    (none left behind on failure)."""
    hint = ("NIXL_ERR_NOT_FOUND means a descriptor lies outside the memory registered here or in the "
            "remote agent's metadata as loaded (register it; the peer loads the metadata again)")
    parts = min(split, len(local))
    handles = []
    try:
        for part_local, part_remote in zip(_split_rows(local, parts), _split_rows(remote, parts)):
            handles.append(_nixl_call(f"initialize_xfer ({op} of {part_local.nbytes} bytes, {len(part_local)} "
                                      f"descriptor(s), with agent {remote_agent!r})", agent.initialize_xfer, op,
                                      xfer_descs(agent, part_local), xfer_descs(agent, part_remote), remote_agent,
                                      notif, list(backends), hint=hint))
    except BaseException:
        for h in handles:
            try:
                agent.release_xfer_handle(h)
            except Exception:
                pass  # the initialize error says more
        raise
    return handles


def post(agent, op: str, local, remote, remote_agent: str, *, notif: bytes = b"",
         backends: Sequence[str] = (), sync: PoolRegistration | Sequence[PoolRegistration] = (),
         split: int = 1, coalesce: int | bool = True) -> Transfer:
    """Start one transfer: op "READ" (remote -> local) or "WRITE" (local ->
    remote); local and remote are Descs (or objects descs() takes) paired row by
    row; remote rows are addresses in the remote agent's memory. `sync`: pool
    registrations to bring up to date first (so new chunks are registered).

    coalesce: join pairs of rows that are adjacent on both sides into larger
    descriptors before posting (ferry.nixl.coalesce; True: up to
    COALESCE_BYTES = 2 MiB each, an int: that cap in bytes, False or 0: post
    the rows as given). The bytes moved are the same; consecutive 64 KiB KV
    blocks move as 2 MiB descriptors (README, NIXL). A joined row must lie in
    one registered region on each side: the remote side is checked against
    the peer's metadata first, and if NIXL still refuses the joined lists
    (local rows adjacent across two registrations) the rows are posted as
    given. ``Transfer.posted`` says how many descriptors went out.

    split: post the rows as up to that many NIXL requests at once (contiguous
    groups; one Transfer waits for all; notif goes with each part). Measured
    on the H200 machine: no gain (scripts/gpu-nixl-write, docs/findings.md)."""
    if op not in OPERATIONS:
        raise InvalidArgumentError(f"op={op!r}: expected READ or WRITE")
    local = _as_descs(local, "local")
    remote = _as_descs(remote, "remote")
    _check_pair(local, remote)
    split = _count(split, "split")
    if split < 1:
        raise InvalidArgumentError("split=0: a transfer is posted as at least one request")
    limit = _coalesce_limit(coalesce)
    _agent(agent, "post")  # after the request's checks (they need no agent)
    if isinstance(remote_agent, bytes):
        remote_agent = remote_agent.decode()
    for registration in [sync] if isinstance(sync, PoolRegistration) else sync:
        registration.sync()
    post_local, post_remote = _join(local, remote, limit) if limit else (local, remote)
    if post_local is not local and not _remote_covers(agent, remote_agent, post_remote):
        post_local, post_remote = local, remote  # a joined row spans two of the peer's regions
    try:
        handles = _initialize(agent, op, post_local, post_remote, remote_agent, notif, backends, split)
    except NixlError:
        if post_local is local:
            raise
        post_local, post_remote = local, remote  # a joined row spans two local registrations
        handles = _initialize(agent, op, local, remote, remote_agent, notif, backends, split)
    t = Transfer(agent, handles, op, local, remote, remote_agent, posted=len(post_local))
    try:
        t._post(notif)
    except BaseException:
        try:
            t.release()
        except NixlError:
            pass  # the post's error says more
        raise
    return t


def transfer(agent, op: str, local, remote, remote_agent: str, *, timeout: float | None = 60.0,
             notif: bytes = b"", backends: Sequence[str] = (), sync=(), split: int = 1,
             coalesce: int | bool = True) -> Transfer:
    """post() and wait(timeout); returns the done Transfer (``seconds``: post to
    done). Release it (or use it in a with block) when not reposting it."""
    t = post(agent, op, local, remote, remote_agent, notif=notif, backends=backends, sync=sync, split=split,
             coalesce=coalesce)
    try:
        return t.wait(timeout)
    except NixlTimeoutError:
        raise  # still posted: the caller decides (release() aborts)
    except BaseException:
        t.release()
        raise


def read(agent, local, remote, remote_agent: str, **kwargs) -> Transfer:
    """transfer(agent, "READ", ...): remote memory into local memory."""
    return transfer(agent, "READ", local, remote, remote_agent, **kwargs)


def write(agent, local, remote, remote_agent: str, **kwargs) -> Transfer:
    """transfer(agent, "WRITE", ...): local memory into remote memory."""
    return transfer(agent, "WRITE", local, remote, remote_agent, **kwargs)


__all__ = [
    "COALESCE_BYTES", "Changes", "Descs", "NixlError", "NixlTimeoutError", "NixlUnavailableError",
    "PoolRegistration", "Registration", "Transfer", "add_remote", "agent", "available", "blocks", "coalesce",
    "descs", "load_metadata", "make_agent", "nixl", "post", "publish_metadata", "read", "reg_descs", "register",
    "register_pool", "settings", "slots", "transfer", "unavailable_reason", "write", "xfer_descs",
]
