"""Every private PyTorch name ferry uses, in one file: a small function (or a
re-export) each, with the PyTorch versions it was checked against and what it
does. Nothing else in python/ferry names a private PyTorch module, function,
class or tensor attribute (tests/python/test_layers.py fails, listing them,
where one does); a PyTorch release that moves one breaks here, and
tests/python/test_torch_private.py says which.

Supported PyTorch: pyproject's `torch` extra (>=2.6). "Checked 2.6-2.11" below
means read in both sources and run by the ferry.torch tests on both:
scripts/test runs them on the newest (FERRYTEST_TORCH) and on the oldest
(FERRYTEST_TORCH_OLDEST) in a venv of its own.

PyTorch is imported on first use, as in _torch.py: ``import ferry.torch``
imports no PyTorch (offload and pinned import this module at their top).
"""

from __future__ import annotations

import functools

from ._torch import torch_module

# ---- tensors (offload) ---------------------------------------------------------


def view_base(t):
    """``t._base``: the tensor `t` is a view of, None where `t` owns its memory.
    Checked 2.6-2.11."""
    return t._base


def version_counter(t) -> int:
    """``t._version``: autograd's count of in-place writes to `t`'s memory.
    Checked 2.6-2.11."""
    return t._version


def neg_view(t):
    """``t._neg_view()``: `t` negated lazily (the negative bit set, as
    ``x.conj().imag`` gives; ``resolve_neg`` makes the values). Checked 2.6-2.11."""
    return t._neg_view()


# ---- DLPack (pinned) and the CUDA state --------------------------------------


def dlpack_capsule_converter():
    """The function that makes a tensor of a DLPack capsule: ``torch._C._from_dlpack``
    (``torch.from_dlpack``'s converter without the checks meant for objects with
    ``__dlpack__``), else ``torch.from_dlpack``. Checked 2.6-2.11 (both have it)."""
    torch = torch_module()
    return getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack


def in_bad_fork() -> bool:
    """``torch.cuda._is_in_bad_fork()``: this process was forked after CUDA was
    initialized (CUDA cannot be used here). Checked 2.6-2.11."""
    return torch_module().cuda._is_in_bad_fork()


def current_raw_stream_getter():
    """The function ``device -> int``: the handle of the calling thread's current
    CUDA stream on `device`, without making a Stream object (the copy calls' stream
    when none is named: src/python/torch_adapter.cpp asks for this function once and
    calls it per copy). ``torch._C._cuda_getCurrentRawStream`` (what Triton and
    Inductor call), else ``torch.cuda.current_stream(device).cuda_stream`` (slower:
    it makes a Stream; for a release that drops the private call). Checked 2.6-2.11
    (both have it)."""
    torch = torch_module()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def empty_host_cache() -> bool:
    """Releases PyTorch's cached pinned host blocks (``torch._C._host_emptyCache``);
    False where this PyTorch has no such call. Checked 2.6-2.11 (both have it)."""
    call = getattr(torch_module()._C, "_host_emptyCache", None)
    if call is None:
        return False
    call()
    return True


# ---- DataLoader: the iterators ferry's subclass --------------------------------

# The private methods of PyTorch's iterators that ferry.torch.data.loader
# overrides or calls through super(). Checked 2.6-2.11; one difference:
# _MultiProcessingDataLoaderIter._process_data takes (data) in 2.6 and
# (data, worker_idx) in 2.11 (ferry's keeps its own task -> worker record).
ITERATOR_METHODS = ("_reset", "_next_data", "_try_put_index", "_get_data", "_process_data",
                    "_shutdown_workers")
# What _MultiProcessingDataLoaderIter.__init__ sets that ferry's rewrite of it
# does not (it starts no pin_memory thread: slots are pinned). Checked 2.6-2.11.
PIN_THREAD_ATTRIBUTES = ("_pin_memory_thread", "_pin_memory_thread_done_event")


def iterator_classes():
    """(_SingleProcessDataLoaderIter, _MultiProcessingDataLoaderIter): the bases
    of ferry's iterators. Checked 2.6-2.11."""
    from torch.utils.data import dataloader

    return dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter


def init_base_iterator(it, loader) -> None:
    """``_BaseDataLoaderIter.__init__``: the state every iterator has (sampler,
    seeds, dataset kind), without _MultiProcessingDataLoaderIter's workers and
    pin thread, which ferry's __init__ makes itself. Checked 2.6-2.11."""
    from torch.utils.data import dataloader

    dataloader._BaseDataLoaderIter.__init__(it, loader)


def sharding_worker_init_fn(worker_init_fn, world_size: int, rank: int):
    """The worker_init_fn PyTorch gives workers of a DataPipe (it shards the
    pipe, then calls `worker_init_fn`): ``dataloader._sharding_worker_init_fn``
    with its first three arguments bound. Checked 2.6-2.11."""
    from torch.utils.data import dataloader

    return functools.partial(dataloader._sharding_worker_init_fn, worker_init_fn, world_size, rank)


def watch_workers(it, workers) -> None:
    """PyTorch's SIGCHLD handler, which raises in the main process when a
    worker of `it` dies (``signal_handling._set_worker_pids``,
    ``_set_SIGCHLD_handler``; ``_shutdown_workers`` forgets them). Checked 2.6-2.11."""
    from torch.utils.data._utils import signal_handling

    signal_handling._set_worker_pids(id(it), tuple(w.pid for w in workers))
    signal_handling._set_SIGCHLD_handler()


# ---- DataLoader: the worker loop -----------------------------------------------


def create_fetcher(kind, dataset, auto_collation: bool, collate_fn, drop_last: bool):
    """``_DatasetKind.create_fetcher``: PyTorch's map-style or iterable fetcher. Checked 2.6-2.11."""
    from torch.utils.data import _DatasetKind

    return _DatasetKind.create_fetcher(kind, dataset, auto_collation, collate_fn, drop_last)


def is_iterable_kind(kind) -> bool:
    """Whether a dataset kind (the iterator's ``_dataset_kind``) is ``_DatasetKind.Iterable``. Checked 2.6-2.11."""
    from torch.utils.data import _DatasetKind

    return kind == _DatasetKind.Iterable


def replica_end(worker_id: int):
    """``_IterableDatasetStopIteration(worker_id)``: the message a worker sends when
    its IterableDataset replica is exhausted. Checked 2.6-2.11."""
    from torch.utils.data._utils.worker import _IterableDatasetStopIteration

    return _IterableDatasetStopIteration(worker_id)


def is_replica_end(message) -> bool:
    """Whether a worker's message is ``_IterableDatasetStopIteration``. Checked 2.6-2.11."""
    from torch.utils.data._utils.worker import _IterableDatasetStopIteration

    return isinstance(message, _IterableDatasetStopIteration)


def is_resume(message) -> bool:
    """Whether a task (or a result's index) is ``_ResumeIteration``, the marker
    a persistent worker gets at a new epoch. Checked 2.6-2.11."""
    from torch.utils.data._utils.worker import _ResumeIteration

    return isinstance(message, _ResumeIteration)


def worker_signal_handlers() -> None:
    """``signal_handling._set_worker_signal_handlers``: a worker's SIGSEGV, SIGBUS,
    SIGFPE handlers (they report the signal before the worker dies). Checked 2.6-2.11."""
    from torch.utils.data._utils import signal_handling

    signal_handling._set_worker_signal_handlers()


def set_thread_name(name: str) -> None:
    """``torch.multiprocessing._set_thread_name``: the worker's name in ps/top. Checked 2.6-2.11."""
    torch_module().multiprocessing._set_thread_name(name)


def numpy_seed(base_seed: int, worker_id: int):
    """``worker._generate_state``: the numpy seed PyTorch's worker would use. Checked 2.6-2.11."""
    from torch.utils.data._utils import worker

    return worker._generate_state(base_seed, worker_id)


def set_worker_info(**fields) -> None:
    """What ``torch.utils.data.get_worker_info()`` returns in this worker (id,
    num_workers, seed, dataset): ``worker._worker_info``. Checked 2.6-2.11."""
    from torch.utils.data._utils import worker

    worker._worker_info = worker.WorkerInfo(**fields)


def manager_watchdog():
    """``worker.ManagerWatchdog()``: ``is_alive()`` turns False once the main
    process is gone. Checked 2.6-2.11."""
    from torch.utils.data._utils import worker

    return worker.ManagerWatchdog()


def status_check_interval() -> float:
    """``_utils.MP_STATUS_CHECK_INTERVAL``: seconds a worker waits for a task before
    it checks the watchdog again (5.0). Checked 2.6-2.11."""
    from torch.utils.data import _utils

    return _utils.MP_STATUS_CHECK_INTERVAL


def exception_wrapper(where: str):
    """``torch._utils.ExceptionWrapper(where=...)`` of the exception being handled:
    it crosses the queue and ``reraise()`` raises it with the worker's traceback.
    Checked 2.6-2.11."""
    from torch._utils import ExceptionWrapper

    return ExceptionWrapper(where=where)


# ---- DataLoader: collation -------------------------------------------------------


def collate(batch, fn_map):
    """``_utils.collate.collate``: PyTorch's collate walk with `fn_map` (type -> function).
    Checked 2.6-2.11."""
    from torch.utils.data._utils import collate as c

    return c.collate(batch, collate_fn_map=fn_map)


def collate_tensors(batch, fn_map=None):
    """``_utils.collate.collate_tensor_fn``: PyTorch's stack of a list of tensors
    (its rules and errors for nested, sparse, other devices). Checked 2.6-2.11."""
    from torch.utils.data._utils import collate as c

    return c.collate_tensor_fn(batch, collate_fn_map=fn_map)


def default_collate_fn_map() -> dict:
    """A copy of ``_utils.collate.default_collate_fn_map`` (default_collate's
    type -> function table). Checked 2.6-2.11."""
    from torch.utils.data._utils import collate as c

    return dict(c.default_collate_fn_map)
