"""save_safetensors in C++ (issue 39): Python hands C++ the file's layout and C++
does the rest (src/load/save_file.h). Round trips of random dtypes and shapes
(0-size and odd sizes, shards, small slots so that every slot is refilled many
times and aligned ones are written straight from the tensor) read back bit for
bit by safetensors' safe_open and by ferry's own header parser and index
reader (the loader's; ferry's GPU loader too where there is a GPU); faults in
the middle of a save (a full file system, a file size limit) leave the
earlier checkpoint whole, no temporary file and no descriptor; GPU saves
(mixed devices, the caller's stream order, a stream of its own) skip with the
reason where there is no GPU."""

import errno
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402

import ferry.load as fload  # noqa: E402
import ferry.torch as ft  # noqa: E402
from ferry import _ferry  # noqa: E402
from ferry.torch import save as save_mod  # noqa: E402

from random_tensors import DTYPES, rand  # noqa: E402


def random_sd(g, count, device="cpu"):
    """Random dtypes and shapes: 0-size tensors, 1-element ones, odd sizes up to ~300 KB."""
    sd = {}
    for i in range(count):
        dtype = DTYPES[int(torch.randint(0, len(DTYPES), (1,), generator=g))]
        ndim = int(torch.randint(0, 4, (1,), generator=g))
        shape = tuple(int(torch.randint(0 if i % 7 == 0 else 1, 70, (1,), generator=g)) for _ in range(ndim))
        sd[f"t{i}"] = rand(shape, dtype, g, device)
    sd["big.odd"] = rand((300_007,), torch.uint8, g, device)
    return sd


def raw(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def files_of(path):
    """The files of the checkpoint at path: {tensor: file}, through its index if any."""
    index = str(path) + ".index.json"
    if os.path.exists(index):
        with open(index, "rb") as f:
            pairs = _ferry.parse_shard_index(f.read(), index)  # ferry's loader's index reader
        return {t: os.path.join(os.path.dirname(index), s) for t, s in pairs}
    return None


def check_both_readers(path, sd):
    """safe_open and ferry's loader's header parser (offsets, dtypes, shapes) give the bytes of sd."""
    where = files_of(path) or {k: str(path) for k in sd}
    assert set(where) == set(sd)
    for file in set(where.values()):
        h = fload.read_safetensors_header(file)  # strict: refuses any malformed file
        with open(file, "rb") as f:
            data = f.read()
        assert len(data) == h["file_bytes"]
        with safe_open(file, "pt") as st:
            names = set(st.keys())
            assert {n for n, *_ in h["tensors"]} == names == {k for k, v in where.items() if v == file}
            for name, _code, shape, begin, end in h["tensors"]:
                want = sd[name]
                assert list(shape) == list(want.shape), name
                got = data[h["data_offset"] + begin: h["data_offset"] + end]
                assert got == bytes(raw(want).numpy()), name
                back = st.get_tensor(name)
                assert back.dtype == want.dtype and torch.equal(raw(back), raw(want)), name


def temps(d):
    return [n for n in os.listdir(d) if ".ferry-tmp-" in n]


def fds():
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("seed,slot,shard", [(1, 1 << 12, None), (2, 1 << 14, 200_000), (3, 1 << 25, 90_000),
                                             (4, 1 << 12, 1)])
def test_random_dtypes_and_shapes_round_trip_bit_exact(tmp_path, monkeypatch, seed, slot, shard):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", slot)
    monkeypatch.setattr(save_mod, "SLOTS", 3)
    g = torch.Generator().manual_seed(seed)
    sd = random_sd(g, 30)
    p = tmp_path / "model.safetensors"
    before = fds()
    written = ft.save_safetensors(sd, p, max_shard_size=shard)
    assert fds() == before
    if shard is not None and shard < 300_000:
        assert len(written) > 2 and str(p) + ".index.json" in written
    check_both_readers(p, sd)
    # Saved again over itself (the earlier files replaced whole), then a snapshot's save: the same bytes.
    sd2 = random_sd(g, 12)
    ft.save_safetensors(sd2, p, max_shard_size=shard)
    check_both_readers(p, sd2)
    assert temps(tmp_path) == []
    single = tmp_path / "snap.safetensors"
    ft.snapshot(sd2).save(single).wait()
    check_both_readers(single, sd2)


def test_a_file_of_only_empty_tensors_and_an_empty_state_dict(tmp_path):
    sd = {"a": torch.empty(0, dtype=torch.bfloat16), "b": torch.empty((3, 0), dtype=torch.int64)}
    ft.save_safetensors(sd, tmp_path / "e.safetensors")
    check_both_readers(tmp_path / "e.safetensors", sd)
    ft.save_safetensors({}, tmp_path / "none.safetensors")
    with safe_open(str(tmp_path / "none.safetensors"), "pt") as st:
        assert list(st.keys()) == []


def test_cpu_tensors_in_aligned_memory_are_written_without_a_copy(tmp_path, monkeypatch):
    """A tensor whose data starts on a 4 KiB boundary of the file and of memory
    (the file's data section is 4 KiB aligned) goes out of its own memory: the
    save reports how many bytes it copied into slots (only the first slot's,
    which holds the header too)."""
    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 16)
    base = torch.empty(1 << 22, dtype=torch.uint8)
    off = (-base.data_ptr()) % 4096
    t = base[off: off + (1 << 20) + 333]
    t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8))
    from ferry.torch.file_layout import Item, header

    head = header([Item("w", t, "U8")], {"format": "pt"})
    p = str(tmp_path / "a.safetensors")
    f = save_mod.AtomicFile(p, durable=False)
    r = f.save(head, [(t.data_ptr(), t.numel(), -1)], save_mod.pageable_pool(), [], slot_bytes=1 << 16, slots=4,
               writers=2)
    f.publish(False)
    assert r["bytes"] == len(head) + t.numel()
    assert r["copied_bytes"] == (1 << 16) - len(head), r  # the first slot; every other one viewed
    with safe_open(p, "pt") as st:
        assert torch.equal(st.get_tensor("w"), t)


FULL_DISK = textwrap.dedent("""
    import os, sys, torch, ferry.torch as ft
    d = sys.argv[1]
    g = torch.Generator().manual_seed(5)
    old = {"w": torch.randint(0, 256, (300_000,), dtype=torch.uint8, generator=g)}
    p = os.path.join(d, "m.safetensors")
    ft.save_safetensors(old, p)
    before = open(p, "rb").read()
    fds = set(os.listdir("/proc/self/fd"))
    big = {"w": torch.randint(0, 256, (6 << 20,), dtype=torch.uint8, generator=g), "x": torch.ones(5)}
    for shard in (None, 1 << 20):
        try:
            ft.save_safetensors(big, p, max_shard_size=shard)
            print("SAVED")
        except OSError as e:
            print("ERRNO", e.errno, type(e).__name__, str(p) in str(e) or d in str(e))
        assert open(p, "rb").read() == before, "the old checkpoint changed"
        assert sorted(os.listdir(d)) == ["m.safetensors"], os.listdir(d)
        assert set(os.listdir("/proc/self/fd")) == fds, "a descriptor leaked"
    print("OLD WHOLE")
""")


def test_a_full_file_system_mid_save_leaves_the_old_checkpoint_whole(tmp_path):
    """A real ENOSPC: a 4 MiB tmpfs (in a mount namespace of its own) holds the
    old checkpoint; a 6 MiB save (one file, then shards) fails mid-write with
    OSLayerError ENOSPC naming the file; the old file is whole, no temporary
    file or shard is left and no descriptor leaked."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small tmpfs in a namespace of its own")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    cmd = ["unshare", "-rm", "sh", "-c",
           f"mount -t tmpfs -o size=4m tmpfs '{mnt}' && exec '{sys.executable}' '{script}' '{mnt}'"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if r.returncode != 0 and "mount" in r.stderr and "OLD WHOLE" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split("\n")
    assert lines.count(f"ERRNO {errno.ENOSPC} OSLayerError True") == 2, r.stdout
    assert "OLD WHOLE" in r.stdout


# ---- GPU ------------------------------------------------------------------------


@pytest.fixture
def cuda(gpu):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device visible to PyTorch")
    return gpu


@pytest.mark.gpu
@pytest.mark.parametrize("slot", [1 << 12, 1 << 20, 32 << 20])
def test_gpu_and_cpu_tensors_mixed_round_trip(tmp_path, cuda, monkeypatch, slot):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", slot)
    g = torch.Generator().manual_seed(slot)
    sd = random_sd(g, 40)
    sd = {k: (v.cuda() if i % 3 else v) for i, (k, v) in enumerate(sd.items())}
    p = tmp_path / "m.safetensors"
    ft.save_safetensors(sd, p, max_shard_size=400_000 if slot == 1 << 20 else None)
    check_both_readers(p, sd)
    back = ft.load_safetensors(str(tmp_path), "cuda:0")  # ferry's GPU loader: the file, or the index of the shards
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert torch.equal(raw(back[k]), raw(v)), k


@pytest.mark.gpu
def test_gpu_save_reads_what_the_current_stream_queued_before_the_call(tmp_path, cuda):
    """The tensor is written by work queued on the caller's current stream (a
    side stream, behind a long sleep kernel) just before the save: the save's
    own stream waits for it, so the file holds the new values."""
    s = torch.cuda.Stream()
    t = torch.zeros(8 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        t.fill_(0x5A)
        ft.save_safetensors({"t": t}, tmp_path / "s.safetensors")
    with safe_open(str(tmp_path / "s.safetensors"), "pt") as st:
        assert bool((st.get_tensor("t") == 0x5A).all())


@pytest.mark.gpu
def test_gpu_save_in_a_thread_while_the_caller_changes_nothing_leaks_nothing(tmp_path, cuda):
    g = torch.Generator().manual_seed(9)
    sd = {k: v.cuda() for k, v in random_sd(g, 20).items()}
    before = fds()
    for i in range(5):
        ft.save_safetensors(sd, tmp_path / "m.safetensors")
    assert fds() == before
    assert temps(tmp_path) == []
    check_both_readers(tmp_path / "m.safetensors", sd)


@pytest.mark.gpu
def test_two_gpus_in_one_file(tmp_path, cuda):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    g = torch.Generator().manual_seed(4)
    sd = {k: v.to(f"cuda:{i % 2}") for i, (k, v) in enumerate(random_sd(g, 20).items())}
    ft.save_safetensors(sd, tmp_path / "m.safetensors")
    check_both_readers(tmp_path / "m.safetensors", sd)


def test_interpreter_exit_while_a_save_runs_in_a_daemon_thread(tmp_path):
    """save_safetensors of CPU tensors in daemon threads, the main thread exits
    meanwhile: the process ends cleanly (C++ holds the file, the ring's pool
    and the layout; no Python object is touched until the call returns), and
    no temporary file is left half-named under a final name."""
    code = textwrap.dedent(f"""
        import threading, time, torch, ferry.torch as ft
        sd = {{"w": torch.randint(0, 256, (24 << 20,), dtype=torch.uint8)}}
        def loop(k):
            while True:
                ft.save_safetensors(sd, "{tmp_path}/m%d.safetensors" % k, durable=False)
        for k in range(2):
            threading.Thread(target=loop, args=(k,), daemon=True).start()
        time.sleep(1.0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "terminate called" not in r.stderr and "Fatal Python error" not in r.stderr, r.stderr[-3000:]
    for n in os.listdir(tmp_path):
        if n.endswith(".safetensors"):
            with safe_open(str(tmp_path / n), "pt") as st:
                assert st.get_tensor("w").numel() == 24 << 20


def test_no_python_call_per_slot(tmp_path, monkeypatch):
    """The save is one C++ call per file: the Python calls a save makes do not
    grow with the number of slots (4 KiB slots: ~700 of them; 32 MiB: one)."""
    import threading

    g = torch.Generator().manual_seed(8)
    sd = {"a": rand((2_800_001,), torch.uint8, g), "b": rand((1001,), torch.float32, g)}

    def calls(slot):
        monkeypatch.setattr(save_mod, "SLOT_BYTES", slot)
        ft.save_safetensors(sd, tmp_path / "m.safetensors")  # imports, first use, re's cache: out of the count
        n = [0]

        def count(frame, event, arg):
            if event in ("call", "c_call"):
                n[0] += 1

        threading.setprofile(None)
        sys.setprofile(count)
        try:
            ft.save_safetensors(sd, tmp_path / "m.safetensors")
        finally:
            sys.setprofile(None)
        check_both_readers(tmp_path / "m.safetensors", sd)
        return n[0]

    small, large = calls(1 << 12), calls(32 << 20)
    assert abs(small - large) <= 10, (small, large)
