"""Datasets and helpers for tests/python/test_dataloader.py, importable by the
worker processes (spawn pickles them by module and name)."""

from __future__ import annotations

import collections
import os
import signal
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ferry.bench.dataloader import Frames as BenchFrames

Pair = collections.namedtuple("Pair", "left right")


class NestedSamples(Dataset):
    """Samples of every kind default_collate handles, odd sizes and dtypes,
    random content drawn from the worker's seeded generators (so equal
    batches need equal seeds)."""

    def __init__(self, n: int = 41):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        return {
            "image": torch.randint(0, 256, (3, 7, 5), dtype=torch.uint8, generator=g),
            "half": torch.randn(3, generator=g).to(torch.bfloat16),
            "mask": torch.rand(9, generator=g) > 0.5,
            "empty": torch.empty(0, 4),
            "scalar": torch.tensor(i * 1.5, dtype=torch.float64),
            "np": np.random.default_rng(i).standard_normal(6).astype(np.float32),
            "np_scalar": np.int16(i),
            "label": i,
            "weight": i / 7,
            "name": f"sample-{i}",
            "raw": bytes([i % 256]) * 3,
            "pair": Pair(torch.full((2,), i, dtype=torch.int32), [i, -i]),
            "augment": torch.rand(4),  # the worker's torch seed
            "np_augment": np.random.rand(2),  # the worker's numpy seed
        }


class SizedByIndex(Dataset):
    """Sample i holds (i // group + 1) * unit float32 values: batches (of
    `group` consecutive samples, or each sample with batch_size=None) grow as
    the epoch goes on."""

    def __init__(self, n: int, group: int = 1, unit: int = 1):
        self.n, self.group, self.unit = n, group, unit

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.arange((i // self.group + 1) * self.unit, dtype=torch.float32) + i * 1000


class ShardedStream(IterableDataset):
    """An iterable dataset split among workers through get_worker_info()."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.full((3,), i, dtype=torch.int64)


class FailsAt(Dataset):
    def __init__(self, n: int, bad: int):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return torch.full((4,), i)


class KillsItsWorker(Dataset):
    """The worker that fetches sample `victim` kills itself with SIGKILL."""

    def __init__(self, n: int, victim: int):
        self.n, self.victim = n, victim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.victim and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)
        return torch.full((4,), i)


class Frames(BenchFrames):
    """ferry bench dataloader's dataset (slices of one random pool per
    process), each sample with its index."""

    def __init__(self, n: int, shape=(3, 224, 224), dtype=torch.uint8, pool_items: int = 64):
        super().__init__(n, shape, str(dtype).removeprefix("torch."), pool_items)

    def __getitem__(self, i):
        return super().__getitem__(i), i


def record_worker(worker_id):
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    torch.utils.data.get_worker_info().dataset.init_ids = worker_id


def pair_collate(samples):
    """A custom collate: a tuple of a non-contiguous tensor, a list and a string."""
    x = torch.stack([s["image"] for s in samples]).transpose(1, 3)
    return x, [s["label"] for s in samples], "custom"


class StallsOnce(Dataset):
    """Sample i is a row of i (float32, `width` wide), except the first time a
    worker fetches sample `stall`: that worker ignores SIGTERM, creates
    `<directory>/stalled`, waits until `<directory>/go` exists and returns a
    row of -1 (a value no other sample has). The worker outlives its loader's
    shutdown, as one busy in __getitem__ past PyTorch's timeout does."""

    def __init__(self, n: int, stall: int, directory: str, width: int = 5):
        self.n, self.stall, self.directory, self.width = n, stall, directory, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        stalled = os.path.join(self.directory, "stalled")
        if i == self.stall and get_worker_info() is not None and not os.path.exists(stalled):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open(stalled, "w").close()
            go = os.path.join(self.directory, "go")
            while not os.path.exists(go):
                time.sleep(0.01)
            return torch.full((self.width,), -1.0)
        return torch.full((self.width,), float(i))


class MixedFloats(Dataset):
    """Samples of alternating dtypes that default_collate promotes: float32
    and float64 (a value float32 cannot hold), int64 and float32, bool and
    uint8, under dict keys."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        odd = i % 2 == 1
        g = torch.Generator().manual_seed(i)
        wide = torch.tensor([1.5 + i, 1e-300 * (i + 1)], dtype=torch.float64)
        return {
            "f": wide if odd else torch.randn(2, generator=g),
            "i": torch.randint(-9, 9, (3,), generator=g) if odd else torch.randn(3, generator=g) * 1e3,
            "b": torch.rand(4, generator=g) > 0.5 if odd else torch.randint(0, 255, (4,), dtype=torch.uint8,
                                                                           generator=g),
        }


def conj_neg_collate(samples):
    """A custom collate returning views with the conjugate and the negative bit set."""
    z = torch.stack([torch.complex(s, -2 * s) for s in samples])
    return z.conj(), z.conj().imag


class EpochSizes(torch.utils.data.Sampler):
    """Indices 0 .. stops[e] - 1 in epoch e (the last stop from then on): with
    SizedByIndex, a later epoch's batches outgrow the slots of the one before."""

    def __init__(self, stops):
        self.stops, self.epoch = list(stops), 0

    def __len__(self):
        return self.stops[min(self.epoch, len(self.stops) - 1)]

    def __iter__(self):
        stop = len(self)
        self.epoch += 1
        return iter(range(stop))


# ---- issue 38 item 5: a worker that outlives its epoch ----------------------


def ignore_sigterm(worker_id):
    """worker_init_fn: the worker ignores SIGTERM (PyTorch's shutdown sends it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class SlowFirstCall(Dataset):
    """Sample i is a row of i (float32, `width` wide), except the first call
    of __getitem__(slow) in any process (a marker file made with O_EXCL):
    it sleeps `sleep` seconds and returns a row of -999. The marker records
    the pid, the epoch (set by the main process before each iter(): a
    worker has the value of its fork) and the time of that call."""

    def __init__(self, n: int, slow: int, directory: str, sleep: float, width: int = 4096):
        self.n, self.slow, self.directory, self.sleep, self.width = n, slow, directory, sleep, width
        self.epoch = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.slow:
            try:
                fd = os.open(os.path.join(self.directory, "first-call"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{os.getpid()} {self.epoch} {time.time()}".encode())
                os.close(fd)
                time.sleep(self.sleep)
                return torch.full((self.width,), -999.0)
        return torch.full((self.width,), float(i))

    def first_call(self):
        """(pid, epoch, time.time()) of the slow first call, or None before it."""
        try:
            with open(os.path.join(self.directory, "first-call")) as f:
                pid, epoch, when = f.read().split()
        except FileNotFoundError:
            return None
        return int(pid), int(epoch), float(when)


def stale_worker_case(loader_class, directory: str, scale: float = 1.0) -> dict:
    """Issue 38 item 5, as reported (scale 1): 16 samples, batch_size=2,
    num_workers=2, workers that ignore SIGTERM, __getitem__(4) sleeps 9 s on
    its first call only. Epoch 1: one batch, then break. Epoch 2: the whole
    loader, every batch kept. At 12 s from the start the held batches are
    read. scale < 1 shortens every duration in proportion (PyTorch's
    shutdown wait, MP_STATUS_CHECK_INTERVAL, too), keeping the interleaving.

    Returns what happened: `at_delivery` and `at_end` (each batch's rows,
    as lists of the first value of each sample), the first call's epoch,
    the times (seconds from the start) of epoch 2's end, of the first call
    and of the check."""
    from torch.utils.data import _utils

    start = time.monotonic()
    wall0 = time.time()
    if scale != 1.0:
        _utils.MP_STATUS_CHECK_INTERVAL = 5.0 * scale
    ds = SlowFirstCall(16, 4, directory, sleep=9.0 * scale)
    loader = loader_class(ds, batch_size=2, num_workers=2, worker_init_fn=ignore_sigterm)
    ds.epoch = 1
    for batch in loader:
        break
    ds.epoch = 2
    held, at_delivery = [], []
    for batch in loader:
        held.append(batch)
        at_delivery.append(batch[:, 0].tolist())
    epoch2_end = time.monotonic() - start
    time.sleep(max(0.0, start + 12.0 * scale - time.monotonic()))
    check = time.monotonic() - start
    first = ds.first_call()
    return {
        "at_delivery": at_delivery,
        "at_end": [b[:, 0].tolist() for b in held],
        "whole": [bool((b == b[:, :1]).all()) for b in held],  # every value of a row alike
        "first_call_epoch": None if first is None else first[1],
        "first_call_s": None if first is None else round(first[2] - wall0, 2),
        "epoch2_end_s": round(epoch2_end, 2),
        "check_s": round(check, 2),
    }


def stale_worker_cases(n: int, scale: float = 1.0) -> list:
    """n runs of stale_worker_case with ferry's loader, at once, each in a
    process forked from this one (torch imported once; call it before any
    torch op: no thread pool to inherit). Each run's result dict, or a
    string saying how it failed."""
    import json
    import tempfile

    import ferry.torch as ft

    runs = []
    for _ in range(n):
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # the run: report through the pipe, never return
            status = 1
            try:
                os.close(rd)
                try:
                    with tempfile.TemporaryDirectory() as directory:
                        reply = stale_worker_case(ft.DataLoader, directory, scale)
                except BaseException as e:  # noqa: BLE001 - reported to the parent
                    reply = f"{type(e).__name__}: {e}"
                with os.fdopen(wr, "w") as f:
                    json.dump(reply, f)
                status = 0
            finally:
                os._exit(status)
        os.close(wr)
        runs.append((pid, rd))
    results = []
    for pid, rd in runs:
        with os.fdopen(rd) as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        results.append(json.loads(data) if data else f"the run died (wait status {status:#x})")
    return results
