"""ferry.torch.save_safetensors, snapshot and Snapshot.save: real files, real
syscalls, random data, read back by the real safetensors package.

CPU tests run everywhere (a pageable ferry pool); GPU tests skip without a device.
"""

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import ferry.torch as ft  # noqa: E402
from ferry.errors import InvalidArgumentError, OSLayerError  # noqa: E402
from ferry.torch import save as save_mod  # noqa: E402

from random_tensors import DTYPES, rand  # noqa: E402


def random_state_dict(g, count=40, device="cpu", max_elems=70_000):
    sd = {}
    for i in range(count):
        dtype = DTYPES[i % len(DTYPES)]
        ndim = int(torch.randint(0, 4, (1,), generator=g))
        shape = tuple(int(torch.randint(1, max(2, int(max_elems ** (1 / max(ndim, 1)))), (1,), generator=g))
                      for _ in range(ndim))
        sd[f"layers.{i}.w{dtype}".replace("torch.", "")] = rand(shape, dtype, g, device)
    sd["empty"] = torch.empty((0, 3), dtype=torch.float32, device=device)
    return sd


def raw(t):
    """A tensor's bytes, as a flat uint8 tensor (bit-exact comparison: NaNs, bools, float8)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def check_file(path, sd):
    back = load_file(path)
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert same(back[k], v), k


def no_temp_files(d):
    return [n for n in os.listdir(d) if ".ferry-tmp-" in n] == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_round_trip_many_dtypes(tmp_path, seed):
    g = torch.Generator().manual_seed(seed)
    sd = random_state_dict(g)
    path = tmp_path / "model.safetensors"
    written = ft.save_safetensors(sd, path)
    assert written == [str(path)]
    check_file(str(path), sd)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    assert (8 + n) % 4096 == 0  # the data starts on a 4 KiB boundary
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert no_temp_files(tmp_path)


def test_large_tensor_crosses_slots(tmp_path, monkeypatch):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 16)  # 64 KiB slots: many slot and tensor boundaries
    g = torch.Generator().manual_seed(5)
    sd = {"big": rand((1_000_003,), torch.uint8, g), "f": rand((333, 77), torch.float32, g),
          "h": rand((12345,), torch.bfloat16, g)}
    p = tmp_path / "x.safetensors"
    ft.save_safetensors(sd, p)
    check_file(str(p), sd)
    assert os.path.getsize(p) == 8 + int.from_bytes(p.read_bytes()[:8], "little") + sum(
        v.numel() * v.element_size() for v in sd.values())


def test_two_slots_reused_many_times_land_before_refill(tmp_path, monkeypatch):
    """Two 4 KiB slots for ~1.2 MB: every slot is refilled hundreds of times, each
    time only after the writer has written it (the write pipeline's landing,
    tests/core/write_pipeline_test.cpp); the file must be byte-exact and the
    slots given back to the pool after each save (C++ owns them meanwhile)."""
    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 12)
    monkeypatch.setattr(save_mod, "SLOTS", 2)
    pool = save_mod.pageable_pool()
    g = torch.Generator().manual_seed(11)
    for round_ in range(3):
        before = pool.stats()
        sd = {f"t{i}": rand((int(torch.randint(1, 90_000, (1,), generator=g)),), torch.uint8, g) for i in range(25)}
        p = tmp_path / f"r{round_}.safetensors"
        ft.save_safetensors(sd, p)
        check_file(str(p), sd)
        after = pool.stats()
        assert after["allocations"] - before["allocations"] == 2  # the ring: 2 slots
        assert after["frees"] - before["frees"] == 2  # given back


def _fds() -> set:
    return set(os.listdir("/proc/self/fd"))


def test_unreadable_tensor_memory_mid_file_fails_the_save_and_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    """A tensor whose memory turns unreadable after its first 64 KiB (PROT_NONE
    pages, a real fault): its 4 KiB-aligned slots are written straight from
    that memory, and the kernel refuses them (EFAULT). The save fails with an
    OSLayerError naming the file, the earlier checkpoint stays whole, and
    neither a temporary file nor a descriptor is left."""
    import ctypes
    import mmap

    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 14)
    p = tmp_path / "m.safetensors"
    g = torch.Generator().manual_seed(3)
    old = {"w": rand((5000,), torch.float32, g)}
    ft.save_safetensors(old, p)
    old_bytes = p.read_bytes()
    n = 1 << 20
    m = mmap.mmap(-1, n)
    head = torch.frombuffer(m, dtype=torch.uint8, count=n)  # page aligned
    head[: 64 << 10] = torch.randint(0, 256, (64 << 10,), dtype=torch.uint8, generator=g)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = head.data_ptr() + (64 << 10)
    fds = _fds()
    assert libc.mprotect(start, n - (64 << 10), 0) == 0, ctypes.get_errno()  # PROT_NONE
    try:
        with pytest.raises(OSLayerError) as e:
            ft.save_safetensors({"w": head}, p)  # one tensor: its data starts on a 4 KiB boundary of the file
    finally:
        libc.mprotect(start, n - (64 << 10), mmap.PROT_READ | mmap.PROT_WRITE)
    assert e.value.errno == errno.EFAULT and str(p) in str(e.value), e.value
    assert p.read_bytes() == old_bytes
    assert no_temp_files(tmp_path)
    assert _fds() == fds
    del head
    m.close()


def test_buffered_file_system(tmp_path):
    """/dev/shm (tmpfs) refuses O_DIRECT: the same file, buffered."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    import tempfile

    g = torch.Generator().manual_seed(7)
    sd = random_state_dict(g, count=10)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        p = os.path.join(d, "m.safetensors")
        ft.save_safetensors(sd, p, durable=False)
        check_file(p, sd)
        assert no_temp_files(d)


def test_metadata(tmp_path):
    sd = {"a": torch.arange(10, dtype=torch.int32)}
    p = tmp_path / "m.safetensors"
    ft.save_safetensors(sd, p, metadata={"step": "100", "format": "pt"})
    with safe_open(str(p), "pt") as f:
        assert f.metadata() == {"step": "100", "format": "pt"}
    ft.save_safetensors(sd, p, metadata={"step": "7"})
    with safe_open(str(p), "pt") as f:
        assert f.metadata() == {"format": "pt", "step": "7"}
    for bad in ({"a": 1}, {1: "a"}, "x", ["a"]):
        with pytest.raises(InvalidArgumentError, match="metadata"):
            ft.save_safetensors(sd, tmp_path / "bad.safetensors", metadata=bad)
    assert not (tmp_path / "bad.safetensors").exists()


def test_shards_and_index(tmp_path):
    g = torch.Generator().manual_seed(11)
    sd = {f"t{i}": rand((1000 + i,), torch.float32, g) for i in range(10)}  # ~4 KB each
    sd["huge"] = rand((5000,), torch.float32, g)  # larger than a shard: alone
    p = tmp_path / "model.safetensors"
    written = ft.save_safetensors(sd, p, max_shard_size=12_100)
    index = tmp_path / "model.safetensors.index.json"
    assert written[-1] == str(index)
    shards = written[:-1]
    n = len(shards)
    assert n >= 4
    assert [os.path.basename(s) for s in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    idx = json.loads(index.read_text())
    assert idx["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in sd.values())
    assert set(idx["weight_map"]) == set(sd)
    back = {}
    for s in shards:
        part = load_file(s)
        size = sum(v.numel() * v.element_size() for v in part.values())
        assert size <= 12_100 or len(part) == 1
        for k in part:
            assert idx["weight_map"][k] == os.path.basename(s)
        back.update(part)
    assert all(same(back[k], v) for k, v in sd.items())
    assert list(back) and not (tmp_path / "model.safetensors").exists()
    # Boundaries: exactly at the limit stays in one shard.
    q = tmp_path / "q" / "model.safetensors"
    q.parent.mkdir()
    sd2 = {"a": torch.zeros(1024, dtype=torch.uint8), "b": torch.ones(1024, dtype=torch.uint8),
           "c": torch.ones(1, dtype=torch.uint8)}
    w = ft.save_safetensors(sd2, q, max_shard_size=2048)
    assert [os.path.basename(x) for x in w] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                                 "model.safetensors.index.json"]
    assert set(load_file(w[0])) == {"a", "b"}
    # A later unsharded save replaces the shards and the index (no stale files).
    w = ft.save_safetensors(sd2, q, max_shard_size="1G")
    assert w == [str(q)]
    assert sorted(os.listdir(q.parent)) == ["model.safetensors"]
    # ferry's own loader reads the index and the headers (its strict parser accepts the padding).
    from ferry.load import parse_shard_index, read_safetensors_header

    assert dict(parse_shard_index(index.read_text())) == idx["weight_map"]
    names = set()
    for s in shards:
        names |= {t[0] for t in read_safetensors_header(s)["tensors"]}
    assert names == set(sd)


def test_tied_weights(tmp_path):
    w = torch.randn(64, 32)
    sd = {"model.embed.weight": w, "lm_head.weight": w, "other": torch.randn(3)}
    with pytest.raises(InvalidArgumentError, match=r"\['model.embed.weight', 'lm_head.weight'\].*keep_one"):
        ft.save_safetensors(sd, tmp_path / "t.safetensors")
    assert os.listdir(tmp_path) == []
    p = tmp_path / "t.safetensors"
    ft.save_safetensors(sd, p, shared="keep_one")
    back = load_file(str(p))
    assert set(back) == {"model.embed.weight", "other"}  # the first name in the state dict
    assert torch.equal(back["model.embed.weight"], w)
    with safe_open(str(p), "pt") as f:
        assert f.metadata()["lm_head.weight"] == "model.embed.weight"
    # Overlapping views that are not the same tensor are always refused.
    base = torch.randn(100)
    with pytest.raises(InvalidArgumentError, match="overlapping"):
        ft.save_safetensors({"a": base[:60], "b": base[40:]}, tmp_path / "o.safetensors", shared="keep_one")
    # Disjoint views of one storage are not shared.
    ft.save_safetensors({"a": base[:50], "b": base[50:]}, tmp_path / "d.safetensors")
    back = load_file(str(tmp_path / "d.safetensors"))
    assert torch.equal(back["a"], base[:50]) and torch.equal(back["b"], base[50:])


def test_bad_input(tmp_path):
    good = {"a": torch.zeros(4)}
    cases = [
        ({"a": 1}, "not a tensor"),
        ({"a": torch.zeros(4, 4).t()}, "not contiguous"),
        ({"a": torch.zeros(4).to_sparse()}, "sparse"),
        ({"a": torch.zeros(2, dtype=torch.complex128)}, "complex128"),
        ({"a": torch.zeros(2, device="meta")}, "meta"),
        ({1: torch.zeros(2)}, "not a str"),
        ({"__metadata__": torch.zeros(2)}, "reserved"),
        ([torch.zeros(2)], "dict"),
    ]
    for sd, msg in cases:
        with pytest.raises(InvalidArgumentError, match=msg):
            ft.save_safetensors(sd, tmp_path / "x.safetensors")
    with pytest.raises(InvalidArgumentError, match="empty"):
        ft.save_safetensors(good, "")
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        ft.save_safetensors(good, tmp_path)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        ft.save_safetensors(good, tmp_path / "nope" / "x.safetensors")
    for bad in (0, -1, "lots", 1.5, True):
        with pytest.raises(InvalidArgumentError):
            ft.save_safetensors(good, tmp_path / "x.safetensors", max_shard_size=bad)
    with pytest.raises(InvalidArgumentError, match="ending in .safetensors"):
        ft.save_safetensors(good, tmp_path / "x.bin", max_shard_size=10)
    with pytest.raises(InvalidArgumentError, match="shared"):
        ft.save_safetensors(good, tmp_path / "x.safetensors", shared="yes")
    assert os.listdir(tmp_path) == []


def test_read_only_directory(tmp_path):
    """EROFS (a read-only mount: root ignores permission bits) or EACCES."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        try:
            with pytest.raises(OSLayerError, match="ro/x.safetensors"):
                ft.save_safetensors({"a": torch.zeros(4)}, d / "x.safetensors")
        finally:
            d.chmod(0o755)
        return
    child = ("import torch, ferry.torch as ft\nfrom ferry.errors import OSLayerError\n"
             f"try: ft.save_safetensors({{'a': torch.zeros(4)}}, '{d}/x.safetensors')\n"
             "except OSLayerError as e: print('ERRNO', e.errno, e)\n")
    script = f"mount -t tmpfs -o ro,size=1m tmpfs {d} && {sys.executable} -c \"$CHILD\""
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CHILD": child})
    if "mount:" in r.stderr or "unshare:" in r.stderr:
        pytest.skip(f"cannot mount a read-only tmpfs: {r.stderr.strip()}")
    assert "ERRNO 30 " in r.stdout and f"{d}/x.safetensors" in r.stdout, r.stdout + r.stderr


def test_existing_file_kept_on_error(tmp_path):
    p = tmp_path / "m.safetensors"
    ft.save_safetensors({"a": torch.ones(4)}, p)
    before = p.read_bytes()
    with pytest.raises(InvalidArgumentError):
        ft.save_safetensors({"a": torch.ones(4), "b": "x"}, p)
    assert p.read_bytes() == before


_CHILD = textwrap.dedent("""
    import os, sys, torch, ferry.torch as ft
    from ferry.errors import OSLayerError
    path = sys.argv[1]
    g = torch.Generator().manual_seed(3)
    sd = {f"t{i}": torch.randint(0, 255, (3 << 20,), dtype=torch.uint8, generator=g) for i in range(4)}
    try:
        ft.save_safetensors(sd, path)
    except OSLayerError as e:
        print("ERRNO", e.errno, str(e))
        sys.exit(0)
    print("NO ERROR")
""")


def _run_child(args, preexec=None, tmp=None):
    return subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec)


def test_full_disk_tmpfs(tmp_path):
    """ENOSPC on a 4 MiB private tmpfs: the error names the file, nothing is left."""
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"):
        pytest.skip("needs root and unshare to mount a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=4m tmpfs {mnt} && cp -p /dev/null {mnt}/keep && "
              f"{sys.executable} -c '{_CHILD}' {mnt}/model.safetensors; echo LEFT $(ls -A {mnt})")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount:" in r.stderr or "unshare:" in r.stderr:
        pytest.skip(f"cannot mount a private tmpfs: {r.stderr.strip()}")
    assert "ERRNO 28 " in r.stdout, r.stdout + r.stderr
    assert f"{mnt}/model.safetensors" in r.stdout
    assert r.stdout.strip().endswith("LEFT keep"), r.stdout  # no temporary file, no final file


def test_file_size_limit(tmp_path):
    """EFBIG from RLIMIT_FSIZE (a disk that fills up half way): nothing damaged."""
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"the old checkpoint")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (5 << 20, 5 << 20))

    r = _run_child([str(p)], preexec=limit)
    assert "ERRNO 27 " in r.stdout, r.stdout + r.stderr
    assert str(p) in r.stdout
    assert p.read_bytes() == b"the old checkpoint"
    assert no_temp_files(tmp_path)


def test_snapshot_cpu_reuse_and_save(tmp_path):
    g = torch.Generator().manual_seed(21)
    sd = random_state_dict(g, count=25)
    s = ft.snapshot(sd)
    assert not s.pinned  # CPU tensors: a pageable ferry pool
    for k, v in sd.items():
        assert same(s.tensors[k], v)
    ptr = s._buffer.ptr
    sd2 = {k: rand(tuple(v.shape), v.dtype, g) for k, v in sd.items()}
    s2 = ft.snapshot(sd2, out=s)
    assert s2 is s and s._buffer.ptr == ptr  # nothing reallocated
    for k, v in sd2.items():
        assert same(s.tensors[k], v)
    # The source may change once snapshot() returned.
    keep = {k: v.clone() for k, v in sd2.items()}
    for v in sd2.values():
        v.zero_() if v.dtype != torch.bool else v.fill_(False)
    fut = s.save(tmp_path / "snap.safetensors")
    assert fut.wait() == [str(tmp_path / "snap.safetensors")]
    assert fut.done()
    check_file(str(tmp_path / "snap.safetensors"), keep)
    # Same bytes as save_safetensors (the direct path writes the snapshot's memory).
    ft.save_safetensors(keep, tmp_path / "ref.safetensors")
    assert (tmp_path / "snap.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    # Sharded from a snapshot (through the ring).
    (tmp_path / "sh").mkdir()
    w = s.save(tmp_path / "sh" / "model.safetensors", max_shard_size=100_000).wait()
    assert w[-1].endswith("model.safetensors.index.json")
    back = {}
    for f in w[:-1]:
        back.update(load_file(f))
    assert set(back) == set(keep)
    # non_blocking with CPU tensors: copied before the call returns.
    assert ft.snapshot(keep, out=s, non_blocking=True) is s
    s.wait_copied()
    assert all(same(s.tensors[k], v) for k, v in keep.items())
    # to_host(out=snapshot): the same copy.
    ft.to_host(sd, out=s)
    for k, v in sd.items():
        assert same(s.tensors[k], v)


def test_snapshot_bad_input_and_errors(tmp_path):
    sd = {"a": torch.randn(10), "b": torch.randn(3, 3)}
    s = ft.snapshot(sd)
    with pytest.raises(InvalidArgumentError, match="other names"):
        ft.snapshot({"a": torch.randn(11), "b": torch.randn(3, 3)}, out=s)
    with pytest.raises(InvalidArgumentError, match="Snapshot"):
        ft.snapshot(sd, out={"a": 1})
    with pytest.raises(InvalidArgumentError, match="not a tensor"):
        ft.snapshot({"a": 3})
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        s.save(tmp_path)
    # An error in the background thread is re-raised by wait(), each time: the
    # destination directory vanishes before the thread opens its file.
    (tmp_path / "gone").mkdir()
    import threading

    gate = threading.Event()
    orig = save_mod.write_file

    def slow_write(*a, **k):
        gate.wait(10)
        return orig(*a, **k)

    save_mod.write_file = slow_write
    try:
        fut = s.save(tmp_path / "gone" / "x.safetensors")
        os.rmdir(tmp_path / "gone")
        gate.set()
        with pytest.raises(OSLayerError, match="gone/x.safetensors"):
            fut.wait()
        with pytest.raises(OSLayerError):
            fut.wait()
        assert fut.done()
    finally:
        save_mod.write_file = orig


def test_snapshot_of_parameters(tmp_path):
    model = torch.nn.Linear(7, 5)
    sd = dict(model.named_parameters())  # requires_grad tensors
    s = ft.snapshot(sd)
    assert not any(t.requires_grad for t in s.tensors.values())
    assert all(torch.equal(s.tensors[k], v.detach()) for k, v in sd.items())
    ft.snapshot(sd, out=s)
    ft.save_safetensors(sd, tmp_path / "p.safetensors")
    s.save(tmp_path / "q.safetensors").wait()
    assert (tmp_path / "p.safetensors").read_bytes() == (tmp_path / "q.safetensors").read_bytes()


def test_tied_snapshot(tmp_path):
    w = torch.randn(16, 8)
    sd = {"embed": w, "head": w}
    s = ft.snapshot(sd)
    assert s.nbytes == w.numel() * 4
    assert s.tensors["embed"].data_ptr() == s.tensors["head"].data_ptr()
    with pytest.raises(InvalidArgumentError, match="share memory"):
        s.save(tmp_path / "t.safetensors")
    with pytest.raises(InvalidArgumentError, match="tied weights"):  # untied now: not the same snapshot
        ft.snapshot({"embed": w, "head": w.clone()}, out=s)
    s.save(tmp_path / "t.safetensors", shared="keep_one").wait()
    assert torch.equal(load_file(str(tmp_path / "t.safetensors"))["embed"], w)


@pytest.mark.gpu
def test_gpu_round_trip(tmp_path, gpu, monkeypatch):
    monkeypatch.setattr(save_mod, "SLOT_BYTES", 1 << 20)
    g = torch.Generator().manual_seed(31)
    sd = random_state_dict(g, count=30, device="cuda", max_elems=600_000)
    sd["cpu"] = torch.randn(1000)  # a mix of devices
    p = tmp_path / "model.safetensors"
    ft.save_safetensors(sd, p)
    check_file(str(p), sd)
    ft.save_safetensors(sd, p, max_shard_size=3 << 20)
    back = ft.load_safetensors(str(tmp_path / "model.safetensors.index.json"))
    for k, v in sd.items():
        assert same(back[k].cpu(), v.cpu()), k


@pytest.mark.gpu
def test_gpu_snapshot(tmp_path, gpu):
    g = torch.Generator().manual_seed(41)
    sd = random_state_dict(g, count=30, device="cuda", max_elems=600_000)
    s = ft.snapshot(sd)
    assert s.pinned
    ptr = s._buffer.ptr
    # Work queued on the current stream before the call is in the snapshot.
    for v in sd.values():
        if v.dtype.is_floating_point and v.element_size() >= 2:
            v.mul_(2)
    expect = {k: v.cpu() for k, v in sd.items()}
    assert ft.snapshot(sd, out=s) is s and s._buffer.ptr == ptr
    for v in sd.values():  # training goes on: the snapshot keeps its bytes
        v.zero_() if v.dtype != torch.bool else v.fill_(False)
    fut = s.save(tmp_path / "s.safetensors")
    fut.wait()
    check_file(str(tmp_path / "s.safetensors"), expect)
    # non_blocking: queued on the current stream; the next work on that stream runs after it.
    for v in sd.values():
        if v.dtype.is_floating_point and v.element_size() >= 2:
            v.add_(1)
    expect = {k: v.cpu() for k, v in sd.items()}
    assert ft.snapshot(sd, out=s, non_blocking=True) is s
    for v in sd.values():
        v.zero_() if v.dtype != torch.bool else v.fill_(False)
    s.save(tmp_path / "nb.safetensors").wait()  # waits for the copy itself
    check_file(str(tmp_path / "nb.safetensors"), expect)
    s.wait_copied()
    assert all(same(s.tensors[k], v) for k, v in expect.items())


def test_bench_save_cpu(tmp_path, capsys):
    """`ferry bench save --device cpu`: the suite's code without a GPU; files verified."""
    from ferry.bench import save as bench

    out = tmp_path / "save.json"
    rc = bench.main(["--device", "cpu", "--sets", "moe", "--scale", "0.1", "--repeats", "1", "--disk-bytes", "64M",
                     "--savers", "ferry,save_file", "--dir", str(tmp_path), "--json", str(out)])
    assert rc == 0
    from ferry.bench.records import is_record

    records = json.loads(out.read_text())["records"]
    cases = {r["case"] for r in records}
    assert {"ferry save_safetensors", "ferry snapshot+save", "save_file", "disk O_DIRECT write"} <= cases
    for r in records:
        assert is_record(r) and r["suite"] == "save"
    durable = [r for r in records if r["metric"] == "durable_time" and r["case"] == "ferry save_safetensors"]
    assert len(durable) == 1 and durable[0]["params"]["baseline_case"] == "save_file"  # --device cpu
    assert durable[0]["ratio"] == pytest.approx(durable[0]["value"] / durable[0]["baseline"])
    verified = {r["case"]: r["value"] for r in records if r["metric"] == "verified"}
    assert verified["ferry save_safetensors"] == "Passed" and verified["ferry snapshot+save"] == "Passed"
    assert "verified" in capsys.readouterr().out
    assert [n for n in os.listdir(tmp_path) if n != "save.json"] == []


def test_bench_save_arguments_checked_before_waiving(capsys):
    from ferry.bench import save as bench

    for argv in (["--scale", "0"], ["--sets", "dense"], ["--repeats", "-1"], ["--disk-bytes", "lots"],
                 ["--dir", "/nonexistent-dir"], ["--savers", "pickle"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2, argv


def test_sharded_save_failing_midway_keeps_the_old_checkpoint(tmp_path):
    """EFBIG on the last shard: the earlier save's shards and index stay as they were."""
    d = tmp_path / "ckpt"
    d.mkdir()
    child = textwrap.dedent(f"""
        import sys, torch, ferry.torch as ft
        from ferry.errors import OSLayerError
        fill = int(sys.argv[1])
        sd = {{f"t{{i}}": torch.full(((1 if i < 3 else 4) << 20,), fill, dtype=torch.uint8) for i in range(4)}}
        try:
            print("WROTE", ft.save_safetensors(sd, "{d}/model.safetensors", max_shard_size=1 << 20))
        except OSLayerError as e:
            print("ERRNO", e.errno, e)
    """)

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))

    r = subprocess.run([sys.executable, "-c", child, "1"], capture_output=True, text=True, timeout=120)
    assert "WROTE" in r.stdout, r.stdout + r.stderr
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    assert len(before) == 5  # 4 shards and the index
    # Shards of 1, 1, 1 and 4 MiB: the last is over the 3 MiB file size limit.
    r = subprocess.run([sys.executable, "-c", child, "2"], capture_output=True, text=True, timeout=120,
                       preexec_fn=limit)
    assert "ERRNO 27 " in r.stdout, r.stdout + r.stderr
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before  # no temp file, nothing changed


def test_atomic_file(tmp_path):
    from ferry.atomic_file import AtomicFile, check_replaceable

    p = str(tmp_path / "f.bin")
    f = AtomicFile(p)
    data = os.urandom(10_001)
    f.pwrite(data[1:], 0)  # unaligned for O_DIRECT (where open allowed it): the remembered buffered fallback
    assert not os.path.exists(p)
    f.commit(10_000)
    assert open(p, "rb").read() == data[1:]
    assert f.direct is False
    g = AtomicFile(p, durable=False)
    g.pwrite(b"new", 0)
    g.abort()
    assert open(p, "rb").read() == data[1:] and no_temp_files(tmp_path)
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        check_replaceable(tmp_path)
    with pytest.raises(InvalidArgumentError, match="str or os.PathLike"):
        check_replaceable(3)


def test_snapshot_save_finishes_before_exit(tmp_path):
    """A script that ends right after save() (no wait) still gets its file."""
    p = tmp_path / "exit.safetensors"
    child = ("import torch, ferry.torch as ft\n"
             "sd = {f't{i}': torch.full((1 << 20,), i, dtype=torch.float32) for i in range(16)}\n"
             f"ft.snapshot(sd).save({str(p)!r})\n")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    back = load_file(str(p))
    assert len(back) == 16 and all(torch.equal(back[f"t{i}"], torch.full((1 << 20,), i, dtype=torch.float32))
                                   for i in range(16))
