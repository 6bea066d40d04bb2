"""Asynchronous checkpoints: ``snapshot(state_dict)`` and ``Snapshot.save(path)``.

A snapshot is a host copy of a state dict in ONE ferry pool allocation (pinned,
from the process's pinned pool of the tensors' GPU, when a tensor is on a GPU;
pageable, from a ferry ``Pool``, when every tensor is on the CPU), laid out as
the data section of its safetensors file (tensors by element size, largest
first, packed), so ``save`` writes it straight from that memory with O_DIRECT.
``snapshot(sd, out=s)`` copies into ``s`` again: nothing is allocated or
pinned after the first call, and training is blocked only for the copy
(device->host at the link's speed).

Tied weights (one tensor under several names) are copied once and stay tied in
the snapshot (their views share memory), so ``save(..., shared="keep_one")``
sees them as safetensors' ``save_model`` does.

Locking: none. A Snapshot is used by one thread at a time, except that its
``save()`` thread reads it (and takes ``_copied``, the events of a
non_blocking copy, by one list swap); ``snapshot(out=s)`` first waits for
``s``'s save to finish, then for its copy.
"""

from __future__ import annotations

import threading
import time

from .. import _args
from ..errors import FerryTimeoutError, InvalidArgumentError
from ._torch import torch_module as _torch
from .file_layout import Plan, collect, file_order, prepare, tied_names
from .publish import ticket
from .save import host_pool, save_items
from .transfer import HostTarget, to_host


class SaveFuture:
    """A save running in a background thread: ``wait()`` (returns the paths
    written, or re-raises the save's error), ``done()``, ``seconds``. The
    interpreter waits for the thread before it exits (a script that ends
    after ``save()`` still gets its file)."""

    def __init__(self, fn):
        self._result = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._started = time.perf_counter()
        self.seconds: float | None = None  # from save() to the files in place (set when done)
        # Not a daemon: the interpreter waits for a save before it exits.
        self._thread = threading.Thread(target=self._run, args=(fn,), name="ferry-snapshot-save", daemon=False)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._result = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by wait()
            self._error = e
        self.seconds = time.perf_counter() - self._started
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> list[str]:
        """The paths written, once the save is done; its error re-raised (each
        call). ferry.errors.FerryTimeoutError (a TimeoutError) if not done within
        `timeout` seconds (None or math.inf: no limit)."""
        timeout = _args.timeout(timeout, "timeout")
        if not self._done.wait(timeout):
            raise FerryTimeoutError(f"the save is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    result = wait


class Snapshot(HostTarget):
    """A host copy of a state dict (see the module's text). ``tensors``: {name:
    CPU tensor} views of the snapshot's memory; ``nbytes``; ``pinned``."""

    def __init__(self, items, pool):
        torch = _torch()
        self._ties = tied_names(items)  # tied weights: copied once, viewed under every name
        self._order = [it for it in file_order(items) if it.name not in self._ties]
        self.nbytes = sum(it.nbytes for it in self._order)
        self._buffer = pool.alloc(-(-max(self.nbytes, 1) // 4096) * 4096, alignment=4096)
        self.pinned = self._buffer.pinned
        raw = torch.from_dlpack(self._buffer)
        views, at = {}, 0
        for it in self._order:
            views[it.name] = raw[at : at + it.nbytes].view(it.tensor.dtype).view(it.tensor.shape)
            at += it.nbytes
        for name, kept in self._ties.items():
            views[name] = views[kept]
        self.tensors = {it.name: views[it.name] for it in items}
        self._signature = _signature(items)
        self._future: SaveFuture | None = None
        self._copied: list = []  # torch.cuda.Events after a non_blocking copy, until wait_copied()

    def _copy_from(self, obj, non_blocking: bool) -> None:
        torch = _torch()
        src = {k: v for k, v in obj.items() if k not in self._ties}
        with torch.no_grad():  # parameters that require grad: no autograd record in the snapshot
            to_host(src, out={k: self.tensors[k] for k in src}, non_blocking=non_blocking)
        if non_blocking:
            for dev in {v.device for v in src.values() if v.is_cuda}:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(dev))
                self._copied.append(event)

    def wait_copied(self) -> None:
        """Waits for the copy of a ``snapshot(..., non_blocking=True)`` (no-op
        otherwise): read ``tensors`` only after this. ``save()`` calls it."""
        events, self._copied = self._copied, []
        for e in events:
            e.synchronize()

    def save(self, path, *, metadata=None, max_shard_size=None, durable: bool = True,
             shared: str = "error") -> SaveFuture:
        """Writes the snapshot as safetensors (``save_safetensors``'s arguments
        and files) in a background thread; returns its SaveFuture. Do not pass
        this snapshot to ``snapshot(out=)`` or ``to_host(out=)`` while it is
        saving: ``snapshot`` waits for the save, ``to_host`` does not."""
        path, items, meta = prepare(self.tensors, path, metadata, shared, "Snapshot.save")
        plan = Plan(path, items, meta, max_shard_size, "Snapshot.save")  # errors now, not in the thread
        direct = len(plan.files) == 1 and [it.name for it in plan.files[0][1]] == [it.name for it in self._order]
        order = ticket()  # this save's place: a later save() to the same path that publishes first wins

        def run():
            self.wait_copied()
            return save_items(plan, durable, source=self._buffer if direct else None, order=order)

        self._future = SaveFuture(run)
        return self._future

    def wait_saved(self) -> None:
        """Waits for the snapshot's last save to finish (its error is not raised here)."""
        f = self._future
        if f is not None:
            f._done.wait()


def _signature(items) -> tuple:
    """What a snapshot must match to be reused: names, dtypes, shapes and ties."""
    return [(it.name, it.tensor.dtype, tuple(it.tensor.shape)) for it in items], tied_names(items)


def snapshot(state_dict, out: Snapshot | None = None, *, pool=None, non_blocking: bool = False,
             into=_args.UNSET) -> Snapshot:
    """A host copy of state_dict ({name: tensor}, CUDA or CPU tensors), in one
    ferry pool allocation; with `out` (a Snapshot of a state dict with the
    same names, dtypes and shapes), copied into it and `out` returned,
    nothing allocated (``into=``: its deprecated spelling, docs/api.md).

    What it waits for: (1) `out`'s last save(), if still running; (2) the
    device->host copy, which ferry queues on each GPU's current torch stream,
    so it runs after the work queued there before the call (e.g. the
    optimizer step) and the call returns once the bytes are in the snapshot.
    After it returns, training may change the GPU tensors (or the CPU ones) at
    once, on any stream. Work on OTHER streams that writes the tensors must be
    ordered before the call by the caller (as for any read on the current
    stream).

    non_blocking=True: returns once the copy is queued (CPU tensors are
    copied before the call returns). The copy is ordered on each GPU's current
    stream: work queued there later (the next step) runs after it, so it may
    change the tensors; work on another stream must wait for the copy itself
    (``torch.cuda.current_stream().synchronize()``, or ``wait_copied()``).
    Read ``tensors`` after ``wait_copied()``; ``save()`` waits for the copy in
    its thread.

    pool: the ferry pool to allocate from (default: the process's pinned pool
    for the tensors' GPU, or a pageable ferry Pool when all are CPU tensors).
    """
    if into is not _args.UNSET:
        _args.renamed("snapshot", "into", "out")
        if out is not None:
            raise InvalidArgumentError("snapshot: out= and into= (its deprecated spelling) given both")
        out = into
    items = collect(state_dict, "snapshot")
    if out is not None:
        if not isinstance(out, Snapshot):
            raise InvalidArgumentError(f"out must be a Snapshot, not {type(out).__name__}")
        if out._signature != _signature(items):
            raise InvalidArgumentError(
                "out: the snapshot was taken of a state dict with other names, dtypes, shapes or tied weights "
                "(take a new snapshot without out=)")
        out.wait_saved()
        out.wait_copied()
        out._copy_from(state_dict, non_blocking)
        return out
    s = Snapshot(items, pool if pool is not None else host_pool(items))
    s._copy_from(state_dict, non_blocking)
    return s
