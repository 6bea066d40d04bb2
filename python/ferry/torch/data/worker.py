"""The worker process: PyTorch's worker loop (torch.utils.data._utils.worker),
with each batch collated into the slot its task names and only a descriptor
sent back.

Kept from PyTorch, so that a worker behaves the same: the signal handlers, the
seeds (``random``, ``torch`` and numpy from the base seed and the worker id),
``get_worker_info()``, ``worker_init_fn``, IterableDataset replicas and their
end, ``_ResumeIteration`` for persistent workers, the watchdog that ends the
worker when the main process is gone, and errors wrapped with the worker's
traceback.

``worker_loop`` is a copy: it mirrors torch/utils/data/_utils/worker.py,
``_worker_loop``, as read in PyTorch 2.11.0 (the version on this machine and on
the GPU machine; 2.6, the oldest supported, was not re-read for this note).
PyTorch's loop has no hook between fetching the samples and sending the result
(collate_fn's result is what crosses the queue), so the whole loop is ours; what
differs from 2.11.0's, block by block, is marked "ferry:" below. Each private
PyTorch name it uses goes through ``_torch_private`` (tested there across
versions). Not taken over: the ``persistent_workers`` argument (2.11.0 passes
it and does not read it) and the AssertionErrors on a missing IterDataPipe seed
and on a final signal without done_event or iteration_end.
"""

from __future__ import annotations

import queue
import random

import torch

from .. import _torch_private as pt
from .batch_layout import Batch, SlotWriter, WorkerFailure
from .chunk_passing import DROPPED, SlotLater, SlotMappings
from .slot_collate import SlotCollator


def _samples(data):
    """The fetcher's collate_fn: the samples as they are (collation is ours)."""
    return data


def _seed(base_seed: int, worker_id: int) -> int:
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with the test extras
        return seed
    np.random.seed(pt.numpy_seed(base_seed, worker_id))
    return seed


def worker_loop(dataset_kind, dataset, index_queue, data_queue, done_event, auto_collation, collate_fn,
                drop_last, base_seed, init_fn, worker_id, num_workers, shared_seed, chunk_socket) -> None:
    """Runs in the worker process until the main process sends None (or dies).
    chunk_socket: this worker's end of its socket pair (``chunk_passing``)."""
    from torch.utils.data import IterDataPipe
    from torch.utils.data.graph_settings import apply_random_seed

    try:
        # PyTorch 2.11.0 _worker_loop: signal handlers, thread name (ferry's), seeds, IterDataPipe seed, worker info.
        pt.worker_signal_handlers()
        pt.set_thread_name("ferry_data_worker")
        torch.set_num_threads(1)
        seed = _seed(base_seed, worker_id)

        shared_rng = torch.Generator()
        if isinstance(dataset, IterDataPipe):
            shared_rng.manual_seed(shared_seed)
            dataset = apply_random_seed(dataset, shared_rng)

        pt.set_worker_info(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)

        collator = SlotCollator(collate_fn)  # ferry: collation into the slot (the fetcher gets _samples)
        mappings = SlotMappings(chunk_socket)  # ferry: the slots' memory, received once per chunk
        # PyTorch 2.11.0 _worker_loop: init_fn and the fetcher; an error there is the first task's result.
        init_exception = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = pt.create_fetcher(dataset_kind, dataset, auto_collation, _samples, drop_last)
        except Exception:
            init_exception = pt.exception_wrapper(f"in DataLoader worker process {worker_id}")

        # PyTorch 2.11.0 _worker_loop's task loop: resume, final signal, skip after the end, fetch, errors.
        iteration_end = False
        watchdog = pt.manager_watchdog()
        interval = pt.status_check_interval()
        while watchdog.is_alive():
            try:
                r = index_queue.get(timeout=interval)
            except queue.Empty:
                continue
            if pt.is_resume(r):
                data_queue.put((r, None))
                iteration_end = False
                if isinstance(dataset, IterDataPipe):
                    shared_rng.manual_seed(r.seed)
                    dataset = apply_random_seed(dataset, shared_rng)
                fetcher = pt.create_fetcher(dataset_kind, dataset, auto_collation, _samples, drop_last)
                continue
            if r is None:
                break  # the final signal
            if done_event.is_set() or iteration_end:
                continue  # wait for the final signal
            idx, index, slot_message = r  # ferry: each task names its slot (PyTorch: idx, index)
            slot_id = None if slot_message is None or isinstance(slot_message, SlotLater) else slot_message[0]
            if init_exception is not None:
                data, init_exception = WorkerFailure(idx, slot_id, init_exception), None
            else:
                try:
                    raw = fetcher.fetch(index)
                    # ferry: wait for a SlotLater's slot, collate into the slot, send a Batch descriptor.
                    if isinstance(slot_message, SlotLater):  # sent before the slots were sized
                        slot_message = mappings.slot_later(
                            slot_message.token, lambda: done_event.is_set() or not watchdog.is_alive(), interval)
                        if slot_message is DROPPED:
                            del raw, idx, index, r
                            continue  # the iterator ended (or began a new epoch): it waits for nothing
                        slot_id = None if slot_message is None else slot_message[0]
                    slot = None if slot_message is None else mappings.slot_bytes(slot_message)
                    writer = SlotWriter(slot)
                    tree = collator(raw, writer)
                    data = Batch(idx, slot_id, tree, writer.used, writer.needed)
                except Exception as e:
                    if isinstance(e, StopIteration) and pt.is_iterable_kind(dataset_kind):
                        data = pt.replica_end(worker_id)
                        iteration_end = True
                    else:
                        data = WorkerFailure(
                            idx, slot_id,
                            pt.exception_wrapper(f"in DataLoader worker process {worker_id}"))
            data_queue.put((idx, data))
            del data, idx, index, r
    except KeyboardInterrupt:
        pass  # the main process raises it
    if done_event.is_set():
        data_queue.cancel_join_thread()
        data_queue.close()
