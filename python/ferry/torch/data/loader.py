"""``ferry.torch.DataLoader``: PyTorch's DataLoader whose workers collate each
batch straight into a slot of one shared, pinned region.

PyTorch's multi-process loader collates each batch into a new shared-memory
segment (in /dev/shm), sends its file descriptor to the main process, which
maps it, faults it in and copies it again, in one pin_memory thread, into
pinned memory before the DMA. Here the workers write into slots of a memfd-
backed ferry pool that the main process registered with CUDA once: only a
small descriptor crosses the queue, and the slot is DMAed at the link's speed
and reused (``slots``, ``delivery``).

Everything else is PyTorch's: the sampler, the batches and their order, the
seeds, the worker loop's rules (``worker``), in-order and out-of-order
delivery, persistent workers, timeouts, worker errors and deaths. The iterator
classes below subclass PyTorch's and change only where tasks get their slot
and how a result becomes a batch.

Threads: each ``iter()`` is its own iterator with its own workers, as with
PyTorch's loader, and every thread's iterators share the loader's slots
(``SlotPool`` is locked). With ``persistent_workers=True`` the loader has ONE
iterator, as PyTorch's has, and a new epoch restarts it: using it from two
threads at the same time is refused (``NotSupportedError``); give each thread
its own loader.

Fork: a loader used in a forked child makes new slots there (``slots``). CUDA
cannot be used in a child forked after CUDA was initialized: there batches of
``device="cpu"`` come in pageable shared memory (not pinned), and
``device="cuda"`` is refused with ``NotSupportedError``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings

import torch
import torch.utils.data as _data

from ...errors import DataLoaderError, DataLoaderTimeoutError, InternalError
from .. import _torch_private as pt
from ..devices import cuda_device
from .batch_layout import Batch, SlotWriter, WorkerFailure
from .chunk_passing import BYTES, DROP, SLOT, ChunkSender, SlotLater, socket_pair
from .delivery import Delivery
from .slot_collate import SlotCollator
from .slots import SlotPool
from .worker import _samples, worker_loop

# PyTorch's iterator classes (private: _SingleProcessDataLoaderIter, _MultiProcessingDataLoaderIter).
_TorchSingleProcessIter, _TorchMultiProcessIter = pt.iterator_classes()

# Slots beyond the tasks in flight, made at once: the batch being delivered
# (device=...: while its copy runs), and with device="cpu" the one the user
# holds while the next is delivered. More are made one by one when needed.
EXTRA_SLOTS_DEVICE = 1
EXTRA_SLOTS_CPU = 2

# Guards DataLoader._ferry_slots (made once, whichever thread iterates first).
_SLOT_POOL_LOCK = threading.Lock()
# One thread at a time starts workers: a worker forked by one thread must not
# inherit another thread's half-made socket pair, and forks from several threads
# at once trip other libraries' fork guards (filelock raised "os.fork is unsafe
# while filelock is changing descriptor ownership" in the H200 run).
_WORKER_START_LOCK = threading.Lock()


def _new_locks_after_fork() -> None:
    global _SLOT_POOL_LOCK, _WORKER_START_LOCK  # a parent's thread may have held them
    _SLOT_POOL_LOCK, _WORKER_START_LOCK = threading.Lock(), threading.Lock()


# Not a ferry._per_device cache: two module locks, no object per device, to remake in the child.
os.register_at_fork(after_in_child=_new_locks_after_fork)


def _device_arg(device):
    """None (CPU batches), or the torch.device("cuda"[, N]) batches are delivered to."""
    if device is None:
        # Before ferry.torch gave device=None one meaning (the current CUDA device), it
        # meant CPU batches here: it still does, said aloud, so no batch moves silently.
        warnings.warn("ferry.torch.DataLoader(device=None): pass device='cpu' for CPU batches (the default) or "
                      "device='cuda' for batches on the current GPU; across ferry.torch None means the current "
                      "CUDA device, and here it still means CPU batches, for now", FutureWarning, stacklevel=3)
        return None
    if isinstance(device, str) and device == "cpu" or isinstance(device, torch.device) and device.type == "cpu":
        return None
    d = cuda_device(device, "DataLoader", "batches go to the host or to a CUDA device",
                    "'cpu' (CPU batches), 'cuda' (the current GPU), 'cuda:N', a torch.device or an int N")
    if not torch.cuda.is_available():
        from ...errors import NoDeviceError

        raise NoDeviceError(f"DataLoader(device={device!r}): PyTorch sees no CUDA device on this machine "
                            "(use device='cpu' for CPU batches)")
    return d


def _pinned_device(device):
    """The CUDA device index slots are pinned on, or None (pageable shared
    memory); asked in each process that makes slots. device: the loader's."""
    forked = pt.in_bad_fork()  # forked after CUDA was initialized: no CUDA here
    if device is not None:
        if forked:
            from ...errors import NotSupportedError

            raise NotSupportedError(
                f"DataLoader(device={str(device)!r}) used in a process forked after CUDA was initialized: CUDA "
                "cannot be used in such a child. Start it with the 'spawn' or 'forkserver' method "
                "(multiprocessing.get_context('spawn')), or use device='cpu' there (CPU batches, not pinned)")
        return device.index
    if forked or not torch.cuda.is_available():
        return None
    return torch.cuda.current_device()


class DataLoader(_data.DataLoader):
    """A drop-in for ``torch.utils.data.DataLoader`` (the same arguments and
    behaviour) whose batches cross from the workers to the GPU without a copy
    in the main process, plus:

    device: "cpu" (default) hands out CPU batches in pinned memory (pageable
        shared memory where there is no CUDA device); "cuda" (the current
        GPU) or "cuda:N" hands out batches already on that GPU, copied on a
        side stream, with the current stream ordered after the copy. None
        still means CPU batches here, with a FutureWarning (elsewhere in
        ferry.torch None means the current CUDA device).

    ``pin_memory`` is accepted and has no further effect: batches are pinned
    wherever there is a CUDA device. Tensors of the batch are laid out in the
    slot; anything else in it (strings, numbers of a custom collate, objects)
    crosses the queue as PyTorch sends it.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, device="cpu"):
        target = _device_arg(device)
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
                         pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                         pin_memory_device=pin_memory_device, in_order=in_order)
        self.device = target
        self._ferry_slots = None

    def _slot_pool(self) -> SlotPool:
        if self._ferry_slots is not None:
            return self._ferry_slots
        # Made without the lock (CUDA is asked which device); the first thread's is kept.
        device = self.device
        if device is not None and device.index is None:
            _pinned_device(device)  # in a forked child: refused before CUDA is asked
            device = torch.device("cuda", torch.cuda.current_device())
        in_flight = (self.prefetch_factor or 0) * self.num_workers if self.num_workers else 1
        extra = EXTRA_SLOTS_CPU if device is None else EXTRA_SLOTS_DEVICE
        slots = SlotPool(functools.partial(_pinned_device, device), in_flight + extra)
        with _SLOT_POOL_LOCK:
            if self._ferry_slots is None:
                self.device, self._ferry_slots = device, slots
            return self._ferry_slots

    def slot_stats(self) -> dict:
        """The slots: capacity (bytes each), slots (made and alive), free, held
        (waiting for a copy), quarantined (a worker of an ended iterator may
        still write them), made (in all), pinned."""
        return self._slot_pool().stats()

    def _get_iterator(self):
        if self.num_workers == 0:
            return _FerrySingleProcessIter(self)
        self.check_worker_number_rationality()
        return _FerryMultiProcessIter(self)


class _FerrySingleProcessIter(_TorchSingleProcessIter):
    """num_workers=0: the main process fetches, collates into a slot and delivers."""

    def __init__(self, loader):
        super().__init__(loader)
        self._pin_memory = False  # the slots are pinned already
        self._slots = loader._slot_pool()
        self._deliver = Delivery(self._slots, loader.device)
        self._collate = SlotCollator(loader.collate_fn)
        self._dataset_fetcher = pt.create_fetcher(
            self._dataset_kind, self._dataset, self._auto_collation, _samples, self._drop_last)

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        raw = self._dataset_fetcher.fetch(index)  # may raise StopIteration
        slot = None if self._slots.capacity is None else self._slots.acquire()
        try:
            writer = SlotWriter(None if slot is None else slot.bytes)
            tree = self._collate(raw, writer)
        except BaseException:
            if slot is not None:
                self._slots.release(slot)
            raise
        return self._deliver(Batch(None, None if slot is None else slot.id, tree, writer.used, writer.needed))


class _FerryMultiProcessIter(_TorchMultiProcessIter):
    """PyTorch's multi-process iterator with ferry's workers and slots."""

    def __init__(self, loader):
        """A copy: torch/utils/data/dataloader.py, _MultiProcessingDataLoaderIter.__init__,
        as read in PyTorch 2.11.0 (its workers' target and arguments are not a hook, so
        the worker start is copied). Differs: ferry's worker_loop and its socket end; no
        pin_memory thread, so no atexit cleanup (2.11.0 registers one only with it);
        no pickle-error warning around w.start(). ``test_torch_private`` fails when a
        PyTorch release sets an attribute here that this copy does not."""
        pt.init_base_iterator(self, loader)
        self._pin_memory = False  # the slots are pinned already: no pin_memory thread
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        self._slots = loader._slot_pool()
        self._deliver = Delivery(self._slots, loader.device)
        self._task_slot: dict[int, object] = {}  # task idx -> the slot its worker writes
        # Task idx -> its worker, and each worker's tasks not yet delivered (in_order=False
        # balances by them): ours, as PyTorch 2.6 keeps neither (_torch_private.ITERATOR_METHODS).
        self._task_worker: dict[int, int] = {}
        self._worker_tasks = [0] * self._num_workers
        self._chunk_senders: list[ChunkSender] = []  # one per worker: the batch memory's fds go through it
        self._in_use = threading.Lock()  # persistent workers: one thread at a time (see the module)
        self._resuming = False
        # Before a batch sized the slots (the loader's first window) the whole window goes out
        # at once, as in PyTorch's loader: one task collated as bytes (it sizes the slots), the
        # others with a SlotLater, their worker fetching at once and waiting for its slot
        # (chunk_passing). _unsized: the idx of tasks collated as bytes, not yet back;
        # _later: (idx, worker, token) of tasks not yet given their slot, in task order.
        self._unsized: set[int] = set()
        self._later: list[tuple[int, int, int]] = []
        self._next_token = 0

        # Copied from PyTorch 2.11.0 from here to the end (the worker start), ferry's lines marked "ferry:".
        ctx = loader.multiprocessing_context or torch.multiprocessing
        self._worker_init_fn = loader.worker_init_fn
        if isinstance(self._dataset, (_data.IterDataPipe, _data.MapDataPipe)):
            self._worker_init_fn = pt.sharding_worker_init_fn(self._worker_init_fn, self._world_size, self._rank)
        self._worker_result_queue = ctx.Queue()
        self._worker_pids_set = False
        self._shutdown = False
        self._workers_done_event = ctx.Event()
        self._index_queues = []
        self._workers = []
        for i in range(self._num_workers):
            index_queue = ctx.Queue()
            index_queue.cancel_join_thread()
            with _WORKER_START_LOCK:  # ferry: one start at a time, each worker with its socket pair
                ours, theirs = socket_pair()
                self._chunk_senders.append(ChunkSender(ours, i))
                w = ctx.Process(
                    target=worker_loop,
                    args=(self._dataset_kind, self._dataset, index_queue, self._worker_result_queue,
                          self._workers_done_event, self._auto_collation, self._collate_fn, self._drop_last,
                          self._base_seed, self._worker_init_fn, i, self._num_workers, self._shared_seed, theirs),
                )
                w.daemon = True
                try:
                    w.start()
                finally:
                    theirs.close()  # the worker has its own: inherited (fork) or passed (spawn, forkserver)
            self._index_queues.append(index_queue)
            self._workers.append(w)
        self._data_queue = self._worker_result_queue
        pt.watch_workers(self, self._workers)
        self._worker_pids_set = True
        self._reset(loader, first_iter=True)

    # ---- tasks get slots -------------------------------------------------

    def _reset(self, loader, first_iter=False):
        with self._one_thread("start a new epoch of"):
            if not first_iter:  # batches received but never delivered last epoch: their slots are free
                for idx, info in list(getattr(self, "_task_info", {}).items()):
                    if len(info) == 2:
                        self._free_task_slot(idx)
                self._assign_later(DROP)  # their workers would wait for a slot, not for the resume
                self._unsized.clear()
            self._resuming = not first_iter
            self._worker_tasks = [0] * self._num_workers  # as PyTorch counts them: from each epoch's start
            try:
                super()._reset(loader, first_iter)
            finally:
                self._resuming = False

    def _next_data(self):
        with self._one_thread("take a batch from"):
            return super()._next_data()

    @contextlib.contextmanager
    def _one_thread(self, what):
        """The iterator's state is one thread's at a time: a second thread is
        refused, not made to wait (it would get the other's epoch's batches)."""
        if not self._in_use.acquire(blocking=False):
            from ...errors import NotSupportedError

            raise NotSupportedError(
                f"ferry DataLoader: cannot {what} this iterator while another thread is using it. With "
                "persistent_workers=True the loader has one iterator (as PyTorch's), restarted by every iter(): "
                "give each thread its own DataLoader, or use persistent_workers=False (each iter() its own)")
        try:
            yield
        finally:
            self._in_use.release()

    def _try_put_index(self):
        # A copy of _MultiProcessingDataLoaderIter._try_put_index (PyTorch 2.11.0): the same worker
        # choice; ferry: the task gets its slot (or waits for one) and the index queue carries it,
        # the per-worker count is ours (_worker_tasks; 2.6 has none) and 2.11.0's assertion on the
        # outstanding tasks is not kept.
        try:
            index = self._next_index()
        except StopIteration:
            return
        max_tasks = self._prefetch_factor * self._num_workers
        for _ in range(self._num_workers):  # the next active worker, as PyTorch picks it
            worker = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker]:
                if self._in_order:
                    break
                if self._worker_tasks[worker] < max_tasks // sum(self._workers_status):
                    break
        else:
            return
        slot = message = None
        if self._slots.capacity is not None:
            slot = self._slots.acquire()
            self._chunk_senders[worker].before_task(slot)
            message = slot.message()
        elif self._unsized:  # a batch collated as bytes will size the slots: this task waits for its slot
            message = SlotLater(self._next_token)
            self._later.append((self._send_idx, worker, self._next_token))
            self._next_token += 1
        else:
            self._unsized.add(self._send_idx)
        self._index_queues[worker].put((self._send_idx, index, message))
        self._task_info[self._send_idx] = (worker,)
        self._task_slot[self._send_idx] = slot
        self._task_worker[self._send_idx] = worker
        self._worker_tasks[worker] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _assign_later(self, state=SLOT):
        """Gives the tasks waiting for a slot theirs (SLOT: slots of the current
        size, or bytes while none is known), or tells them BYTES or DROP."""
        later, self._later = self._later, []
        for idx, worker, token in later:
            slot = None
            task_state = state
            if state == SLOT and self._slots.capacity is not None:
                slot = self._slots.acquire()
                self._task_slot[idx] = slot
            elif state == SLOT:
                task_state = BYTES
            if task_state == BYTES:
                self._unsized.add(idx)
            if task_state == DROP:  # no result will come
                self._task_slot.pop(idx, None)
                self._task_worker.pop(idx, None)
            self._chunk_senders[worker].assign(token, slot, task_state)

    def _free_task_slot(self, idx):
        self._task_worker.pop(idx, None)
        slot = self._task_slot.pop(idx, None)
        if slot is not None:
            self._slots.release(slot)

    # ---- results become batches -------------------------------------------

    def _get_data(self):
        try:
            idx, data = super()._get_data()
        except RuntimeError as e:
            # PyTorch says a timeout (timeout=t > 0) in its message only: "DataLoader timed out after t seconds"
            timed_out = str(e).startswith("DataLoader timed out")
            kind = DataLoaderTimeoutError if timed_out else DataLoaderError
            raise kind(f"ferry DataLoader: {e} ({self._worker_names()})") from e
        if pt.is_resume(idx):
            return idx, data
        if self._later and not self._resuming:
            if idx in self._unsized:  # the first result: it sizes the slots, the waiting tasks get theirs
                if isinstance(data, Batch) and data.needed_bytes:
                    self._slots.fit(data.needed_bytes)
                self._assign_later()
            else:  # a waiting task that failed before its slot came: none will
                self._later = [entry for entry in self._later if entry[0] != idx]
        self._unsized.discard(idx)
        if pt.is_replica_end(data) or self._resuming:
            self._free_task_slot(idx)  # no batch in it (the replica ended; a stale task of the last epoch)
        return idx, data

    def _worker_names(self) -> str:
        return "workers: " + ", ".join(
            f"{i} pid {w.pid}{'' if w.is_alive() else ' (exited, code ' + str(w.exitcode) + ')'}"
            for i, w in enumerate(self._workers))

    def _process_data(self, data, worker_idx=None):  # PyTorch 2.6 passes no worker_idx
        worker_idx = self._task_worker.pop(getattr(data, "idx", None), worker_idx)
        if worker_idx is not None:
            self._worker_tasks[worker_idx] -= 1
        if isinstance(data, WorkerFailure):
            self._free_task_slot(data.idx)
            self._try_put_index()
            data.error.reraise()
        if not isinstance(data, Batch):  # pragma: no cover - our workers send nothing else
            raise InternalError(f"ferry DataLoader: unexpected message from worker {worker_idx}: {type(data)}")
        slot = self._task_slot.pop(data.idx, None)  # the batch holds it now
        try:
            batch = self._deliver(data)
        except BaseException:
            if slot is not None:
                self._slots.release(slot)
            raise
        finally:
            self._try_put_index()
        return batch

    def _shutdown_workers(self):
        if not getattr(self, "_shutdown", True) and getattr(self, "_later", None):
            self._assign_later(DROP)  # workers waiting for a slot: the shutdown must not wait for them
        super()._shutdown_workers()
        if not self._shutdown:
            return  # the interpreter is exiting (PyTorch did nothing either)
        # PyTorch waited for the workers, then sent SIGTERM: one busy in
        # __getitem__ that ignores it lives on and writes its task's slot later.
        for idx in list(self._task_slot):
            slot = self._task_slot.pop(idx)
            info = self._task_info.get(idx)  # (worker,) while its result is out; (worker, data) once back
            if slot is None:
                continue
            if info is not None and len(info) == 2:
                self._slots.release(slot)
            else:
                writers = self._workers if info is None else [self._workers[info[0]]]
                self._slots.quarantine(slot, writers)
        for sender in self._chunk_senders:
            sender.close()
        self._chunk_senders = []
