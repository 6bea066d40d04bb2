"""ferry.torch.DataLoader against PyTorch's own loader: the same batches in the
same order (bit-equal, same types and dtypes), PyTorch's worker semantics,
errors, worker deaths, slot reuse and leaks. CPU wherever the logic allows;
the GPU cases skip without a CUDA device."""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import dataloader_cases as cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def assert_same(a, b, where="batch"):
    """Deep equality: the same container types, tensors equal in dtype, shape and bits."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a.cpu().view(torch.uint8) if a.numel() and a.dtype != torch.bool else a.cpu(),
                           b.cpu().view(torch.uint8) if b.numel() and b.dtype != torch.bool else b.cpu()), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def both(dataset, **kw):
    """The epochs of PyTorch's loader and ferry's with the same arguments and seed."""
    seed = kw.pop("seed", 1)
    device = kw.pop("device_for_ferry", None)  # ferry's loader only: "cuda" for GPU batches
    out = []
    for cls in (TorchLoader, ft.DataLoader):
        torch.manual_seed(seed)  # num_workers=0 draws from the main process's generators
        np.random.seed(seed)
        extra = {"device": device} if cls is ft.DataLoader and device else {}
        loader = cls(dataset, generator=torch.Generator().manual_seed(seed), **kw, **extra)
        out.append(list(loader))
    return out


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_nested_batches_equal_pytorchs(num_workers):
    theirs, ours = both(cases.NestedSamples(41), batch_size=4, shuffle=True, num_workers=num_workers)
    assert len(theirs) == len(ours) == 11
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert_same(a, b, f"batch {i}")


def test_spawn_and_worker_init_and_drop_last():
    theirs, ours = both(cases.NestedSamples(23), batch_size=5, shuffle=True, num_workers=2, drop_last=True,
                        multiprocessing_context="spawn", worker_init_fn=cases.record_worker)
    assert len(ours) == 4
    for a, b in zip(theirs, ours):
        assert_same(a, b)


def test_batch_size_none_and_growing_samples():
    """Each sample a batch, each larger than the last: every one overflows the
    slots sized by the one before, and still arrives intact."""
    ds = cases.SizedByIndex(30)
    theirs, ours = both(ds, batch_size=None, num_workers=2)
    for a, b in zip(theirs, ours):
        assert_same(a, b)
    ds = cases.SizedByIndex(60, group=6)
    theirs = list(TorchLoader(ds, batch_size=6, num_workers=2))
    loader = ft.DataLoader(ds, batch_size=6, num_workers=2)
    for _ in range(2):  # the second epoch reuses the grown slots
        for a, b in zip(theirs, list(loader)):
            assert_same(a, b)
    assert loader.slot_stats()["capacity"] >= 6 * 10 * 4


def test_variable_batches_equal():
    ds = cases.SizedByIndex(7)
    theirs, ours = both(ds, batch_size=1, num_workers=2)
    for a, b in zip(theirs, ours):
        assert_same(a, b)


def test_custom_collate_fn_output_is_copied():
    theirs, ours = both(cases.NestedSamples(17), batch_size=3, num_workers=2, collate_fn=cases.pair_collate)
    for a, b in zip(theirs, ours):
        assert_same(a[0].contiguous(), b[0].contiguous())
        assert a[1:] == b[1:]


def test_out_of_order_delivers_every_batch():
    ds = cases.NestedSamples(40)
    ours = list(ft.DataLoader(ds, batch_size=4, num_workers=2, in_order=False))
    theirs = list(TorchLoader(ds, batch_size=4, num_workers=2, in_order=False))
    key = lambda b: int(b["label"][0])  # noqa: E731
    assert sorted(map(key, ours)) == sorted(map(key, theirs)) == list(range(0, 40, 4))
    for a, b in zip(sorted(theirs, key=key), sorted(ours, key=key)):
        assert_same(a["image"], b["image"])


def test_iterable_dataset_with_sharding():
    theirs, ours = both(cases.ShardedStream(29), batch_size=4, num_workers=2)
    assert len(theirs) == len(ours)
    for a, b in zip(theirs, ours):
        assert_same(a, b)


def test_persistent_workers_keep_pytorchs_epochs():
    ds = cases.NestedSamples(19)
    theirs = TorchLoader(ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                         generator=torch.Generator().manual_seed(5))
    ours = ft.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                         generator=torch.Generator().manual_seed(5))
    for epoch in range(3):
        if epoch == 1:  # an epoch abandoned half way: its stale tasks must not leak slots
            it = iter(ours)
            next(it), next(it)
            it2 = iter(theirs)
            next(it2), next(it2)
            continue
        for a, b in zip(list(theirs), list(ours)):
            assert_same(a, b, f"epoch {epoch}")
    del a, b
    gc.collect()
    stats = ours.slot_stats()
    # list() held a whole epoch (5 batches) while 4 tasks were out: slots were
    # made for them; every one is back now, none is lost to the abandoned epoch.
    assert stats["slots"] <= 5 + 2 * 2, stats
    assert stats["free"] + stats["held"] == stats["slots"], stats


def test_worker_error_is_reraised_with_its_traceback():
    loader = ft.DataLoader(cases.FailsAt(20, bad=9), batch_size=2, num_workers=2)
    got = []
    with pytest.raises(ValueError) as info:
        for b in loader:
            got.append(b)
    assert "sample 9 is broken" in str(info.value)
    assert "in DataLoader worker process" in str(info.value)
    assert len(got) == 4  # batches 0-3 arrived, batch 4 holds sample 9


def test_worker_error_without_workers():
    with pytest.raises(ValueError, match="sample 3 is broken"):
        list(ft.DataLoader(cases.FailsAt(8, bad=3), batch_size=2))


def test_dropped_iterator_stops_workers_and_frees_slots():
    loader = ft.DataLoader(cases.NestedSamples(200), batch_size=2, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    first = next(it)
    workers = list(it._workers)
    assert all(w.is_alive() for w in workers)
    del it, first
    gc.collect()
    deadline = time.monotonic() + 10
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers)
    stats = loader.slot_stats()
    assert stats["free"] + stats["held"] == stats["slots"], stats


def test_no_slot_leak_over_many_epochs():
    ds = cases.NestedSamples(24)
    loader = ft.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, prefetch_factor=2)
    for _ in range(12):
        for b in loader:
            b["image"].sum()
    del b  # the last batch holds its slot while it lives
    gc.collect()
    stats = loader.slot_stats()
    assert stats["slots"] <= 2 * 2 + 2 + 1, stats  # workers x prefetch + the extra slots
    assert stats["free"] + stats["held"] == stats["slots"], stats


def test_held_batches_keep_their_bytes():
    """Batches the user keeps are never overwritten: slots are made instead."""
    again, kept = both(cases.NestedSamples(30), batch_size=3, num_workers=2)
    for a, b in zip(again, kept):
        assert_same(a, b)


def test_cpu_batches_are_writable_views_of_shared_memory():
    loader = ft.DataLoader(cases.Frames(8, shape=(5, 3)), batch_size=4, num_workers=1)
    x, idx = next(iter(loader))
    x.add_(1)  # a batch is the user's to change
    assert torch.equal(idx, torch.arange(4))
    assert loader.slot_stats()["capacity"] >= x.numel()


def test_bad_device_is_refused():
    with pytest.raises(ferry.InvalidArgumentError, match="host or to a CUDA device"):
        ft.DataLoader(cases.SizedByIndex(3), device="meta")
    for bad in ("nonsense", 2.5):
        with pytest.raises(ferry.InvalidArgumentError, match="is not a device; expected 'cpu'"):
            ft.DataLoader(cases.SizedByIndex(3), device=bad)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_cpu_batches_are_asked_for_with_device_cpu(device):
    """ferry.torch's rule: device=None is the current GPU; the host is said aloud."""
    again, ours = both(cases.NestedSamples(10), batch_size=3, num_workers=1, device_for_ferry=device)
    for a, b in zip(again, ours):
        assert_same(a, b)
        assert not b["image"].is_cuda


def test_device_none_still_gives_cpu_batches_with_a_warning():
    with pytest.warns(FutureWarning, match="pass device='cpu'") as caught:
        loader = ft.DataLoader(cases.Frames(6, shape=(5, 3)), batch_size=3, num_workers=0, device=None)
    assert caught[0].filename == __file__  # the warning points at the caller
    x, idx = next(iter(loader))
    assert x.device.type == "cpu" and torch.equal(idx, torch.arange(3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_device_without_a_gpu_says_so():
    with pytest.raises(ferry.NoDeviceError, match="CUDA"):
        ft.DataLoader(cases.SizedByIndex(3), device="cuda")


def _run(code: str, timeout: float = 120):
    # A child that hangs prints every thread's stack and exits 10 s before the
    # timeout, so the failure shows where it stood rather than TimeoutExpired alone.
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({timeout - 10}, exit=True)\n"
    r = subprocess.run([sys.executable, "-c", watchdog + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, cwd=HERE)
    err = r.stderr if len(r.stderr) <= 6000 else r.stderr[:1500] + "\n[...]\n" + r.stderr[-4500:]
    assert "Timeout (" not in r.stderr, f"the child hung; its output and threads:\n{err}"
    return r


def test_sigkilled_worker_is_named_not_a_hang():
    r = _run("""
        import torch, ferry.torch as ft, dataloader_cases as cases
        try:
            for b in ft.DataLoader(cases.KillsItsWorker(40, victim=13), batch_size=2, num_workers=2):
                pass
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("NO ERROR")
        """, timeout=90)
    assert "ERROR:" in r.stdout, r.stdout + r.stderr
    assert "killed by signal" in r.stdout or "exited unexpectedly" in r.stdout, r.stdout
    assert "pid" in r.stdout


def test_ctrl_c_stops_the_workers_and_frees_every_slot():
    code = textwrap.dedent("""
        import gc, os, signal, sys, time, torch, ferry.torch as ft, dataloader_cases as cases
        # As at a terminal: a job started in the background by a shell without job
        # control (nohup CMD &, some CI runners) inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler (the test iterated to its timeout).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = ft.DataLoader(cases.Frames(10**6, shape=(64, 64)), batch_size=4, num_workers=2)
        it = iter(loader)
        workers = list(it._workers)
        try:
            for i, _ in enumerate(it):
                if i == 5:
                    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would
                    print("SIGINT sent", file=sys.stderr, flush=True)  # what a hang's report shows (_run)
                    time.sleep(5)
                if i > 5:
                    print("still iterating at batch", i, file=sys.stderr, flush=True) if i % 1000 == 6 else None
        except KeyboardInterrupt:
            print("KeyboardInterrupt at batch", i, file=sys.stderr, flush=True)
        del it, _
        gc.collect()
        deadline = time.monotonic() + 10
        while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        s = loader.slot_stats()
        print("ALIVE", sum(w.is_alive() for w in workers), "LOST", s["slots"] - s["free"] - s["held"])
        """)
    r = _run(code, timeout=90)
    assert "ALIVE 0 LOST 0" in r.stdout, r.stdout + r.stderr


def test_small_dev_shm_fails_pytorch_not_ferry():
    """Docker's 64 MB /dev/shm, scaled down: a private 1 MiB tmpfs over /dev/shm
    (in a mount namespace of its own), 2 MB batches. PyTorch's workers put each
    batch in /dev/shm and fail; ferry's put nothing there."""
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm && df -k /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.strip()}")
    code = textwrap.dedent("""
        import sys, torch, ferry.torch as ft, dataloader_cases as cases
        from torch.utils.data import DataLoader
        cls = ft.DataLoader if sys.argv[1] == "ferry" else DataLoader
        ds = cases.Frames(16, shape=(1000, 1000), dtype=torch.uint8, pool_items=4)
        n = 0
        for x, i in cls(ds, batch_size=2, num_workers=2):
            n += int(x.sum() > 0)
        print("BATCHES", n)
        """)
    results = {}
    for which in ("torch", "ferry"):
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$0" -c "$1" "$2"',
                            sys.executable, code, which],
                           capture_output=True, text=True, timeout=120, cwd=HERE)
        results[which] = r
    assert "BATCHES 8" in results["ferry"].stdout, results["ferry"].stdout + results["ferry"].stderr
    assert "BATCHES 8" not in results["torch"].stdout, "PyTorch's loader worked in a 1 MiB /dev/shm"


# ---- GPU ------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")


@gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_batches_equal_pytorchs(num_workers):
    ds = cases.NestedSamples(33)
    torch.manual_seed(3)  # num_workers=0 draws from the main process's generators
    np.random.seed(3)
    theirs = [_to_cuda(b) for b in
              TorchLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(3))]
    torch.manual_seed(3)
    np.random.seed(3)
    ours = list(ft.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, device="cuda",
                              generator=torch.Generator().manual_seed(3)))
    for a, b in zip(theirs, ours):
        assert b["image"].is_cuda
        assert_same(a, b)


def _to_cuda(batch):
    from ferry.torch.containers import map_leaves

    return map_leaves(batch, lambda t: t.cuda(), lambda x: isinstance(x, torch.Tensor))


@gpu
def test_cpu_batches_are_pinned():
    x, _ = next(iter(ft.DataLoader(cases.Frames(8, shape=(64, 64)), batch_size=4, num_workers=1)))
    assert x.is_pinned()


@gpu
def test_non_blocking_copies_then_drop_never_see_reused_slots():
    """The usual loop: copy with non_blocking=True, drop the CPU batch at once.
    The slot must not be rewritten before the copy read it."""
    ds = cases.Frames(96, shape=(512, 1024), dtype=torch.uint8, pool_items=96)
    loader = ft.DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=1)
    sums = []
    slow = torch.randn(4096, 4096, device="cuda")
    for x, idx in loader:
        slow @ slow  # keep the stream busy so copies queue behind it
        y = x.to("cuda", non_blocking=True)
        del x
        sums.append((y.view(4, -1).long().sum(1), idx))
    ref = torch.stack([ds[i][0].long().sum() for i in range(96)])
    for s, idx in sums:
        assert torch.equal(s.cpu(), ref[idx])


@gpu
def test_device_batches_are_ordered_on_the_current_stream():
    ds = cases.Frames(64, shape=(256, 1024), dtype=torch.float32, pool_items=64)
    side = torch.cuda.Stream()
    total = torch.zeros((), device="cuda", dtype=torch.float64)
    with torch.cuda.stream(side):
        for x, idx in ft.DataLoader(ds, batch_size=4, num_workers=2, device="cuda"):
            assert x.device.type == "cuda"
            total += x.double().sum()
    torch.cuda.synchronize()
    expected = sum(ds[i][0].double().sum() for i in range(64))
    assert torch.isclose(total.cpu(), expected.to(torch.float64))


@gpu
def test_device_batch_is_one_ferry_copy(monkeypatch):
    """A device batch crosses in one ferry copy_many (not one copy per tensor)."""
    fc = importlib.import_module("ferry.copy")  # the module: ferry.copy, the attribute, is the function

    calls = []
    real = fc.copy_many_async

    def spy(dsts, srcs, *a, **kw):
        calls.append(len(dsts))
        return real(dsts, srcs, *a, **kw)

    monkeypatch.setattr(fc, "copy_many_async", spy)
    ds = cases.NestedSamples(9)
    theirs, ours = both(ds, batch_size=4, num_workers=0, device_for_ferry="cuda")
    leaves = [sum(1 for t in _tensors(b) if t.numel()) for b in ours]
    assert len(ours) == 3 and min(leaves) > 1
    assert calls == leaves
    for a, b in zip(theirs, ours):
        assert_same(_to_cuda(a), b)


def _tensors(batch):
    from ferry.torch.containers import map_leaves

    found = []
    map_leaves(batch, found.append, lambda x: isinstance(x, torch.Tensor))
    return found


@pytest.mark.parametrize("args, message", [
    (["--batches", "garbage"], "--batches: bad batch"),
    (["--batches", "uint8:0x3"], "--batches: bad batch"),
    (["--workers", "0"], "--workers"),
    (["--workers", "x"], "--workers"),
    (["--seconds", "0"], "--seconds"),
])
def test_bench_dataloader_checks_arguments_first(args, message):
    """A typo is caught on any machine, before the 'needs a CUDA device' waiver."""
    r = subprocess.run([sys.executable, "-m", "ferry", "bench", "dataloader", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
