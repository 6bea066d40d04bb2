"""ferry's PyTorch allocators from Python.

Everywhere: the path of libferry.so and its extern "C" entry points (called
through ctypes: size 0, negative sizes, NULL and foreign frees, and NULL with a
reason where there is no device), configuration errors, option conversion, and
use_allocator / mem_pool's logic against a stand-in `torch` module (the too-late
error and its fix, once per process, MemPool).

With PyTorch and a GPU: each allocator runs the same tensor operations in its
own process (the allocator can be chosen once per process) and must give the
results of PyTorch's default allocator, with its stats back at zero; the
too-late error in a real process; a MemPool region; and an allocation beyond
free memory is refused with the reason.
"""

import ctypes
import json
import os
import subprocess
import sys
import types

import pytest

import ferry
import ferry.torch as ft
from ferry import _ferry
from ferry.errors import InvalidArgumentError, NotSupportedError

NAMES = ("device", "managed", "managed_pool")


def _have_device() -> bool:
    info = ferry.cuda_info()
    return bool(info and info.get("devices"))


@pytest.fixture(autouse=True)
def _defaults_after():
    yield
    for n in NAMES:
        _ferry.managed_configure(n, "")


# ---- libferry.so and its C entry points ----------------------------------------------


def test_library_is_next_to_the_native_module_and_is_the_loaded_one():
    path = ft.library_path()
    assert os.path.isfile(path)
    assert os.path.dirname(path) == os.path.dirname(os.path.abspath(_ferry.__file__))
    loaded = _ferry.library_path()
    assert loaded, "dladdr found no path for libferry.so"
    assert os.path.samefile(path, loaded), "PyTorch would load another copy of libferry than ferry uses"


def _entry_points(name):
    lib = ctypes.CDLL(ft.library_path())
    alloc = getattr(lib, f"ferry_torch_alloc_{name}")
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = getattr(lib, f"ferry_torch_free_{name}")
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free


@pytest.mark.parametrize("name", NAMES)
def test_entry_points_never_crash_on_bad_input(name):
    alloc, free = _entry_points(name)
    before = ft.allocator_stats(name)
    assert alloc(0, 0, None) is None  # empty tensors
    assert alloc(-1, 0, None) is None
    free(None, 0, 0, None)
    local = ctypes.create_string_buffer(64)
    free(ctypes.addressof(local), 64, 0, None)  # not ours: reported, nothing freed
    after = ft.allocator_stats(name)
    assert after["failures"] == before["failures"] + 1  # the negative size
    assert after["frees"] == before["frees"]
    assert "not one of its live allocations" in after["last_failure"]


@pytest.mark.parametrize("name", NAMES)
def test_without_a_device_allocation_returns_null_with_the_reason(name):
    if _have_device():
        pytest.skip("a CUDA device is present")
    alloc, _ = _entry_points(name)
    before = ft.allocator_stats(name)
    assert alloc(1 << 20, 0, None) is None
    s = ft.allocator_stats(name)
    assert s["failures"] == before["failures"] + 1
    assert "returning NULL to PyTorch" in s["last_failure"] and "CUDA" in s["last_failure"]
    assert s["allocated"] == 0 and s["reserved"] == 0


# ---- configuration ------------------------------------------------------------------


def test_configure_refuses_bad_names_and_options_quoting_them():
    with pytest.raises(InvalidArgumentError, match="unknown allocator 'cuda'"):
        _ferry.managed_configure("cuda", "")
    with pytest.raises(InvalidArgumentError, match="'sometimes'"):
        _ferry.managed_configure("managed", "prefetch=sometimes")
    with pytest.raises(InvalidArgumentError, match="unknown option 'chunk_bytes'"):
        _ferry.managed_configure("managed", "chunk_bytes=64M")
    with pytest.raises(InvalidArgumentError, match="takes no options"):
        _ferry.managed_configure("device", "prefetch=1")
    _ferry.managed_configure("managed_pool", "prefetch=chunk,chunk_bytes=128M")
    assert _ferry.managed_options("managed_pool") == (
        "prefetch=chunk,advise=none,oversubscribe=0,chunk_bytes=134217728,stream_wait=1")


def test_options_are_written_the_way_the_library_reads_them():
    text = ft.allocators._options_text({"prefetch": True, "advise": ["preferred_location", "accessed_by"],
                             "oversubscribe": False, "chunk_bytes": "256M", "stream_wait": None})
    assert text == "prefetch=1,advise=preferred_location+accessed_by,oversubscribe=0,chunk_bytes=256M"
    assert ft.allocators._options_text({"advise": []}) == "advise=none"
    _ferry.managed_configure("managed_pool", text)
    with pytest.raises(InvalidArgumentError, match="not allowed"):
        ft.allocators._options_text({"advise": "a,b"})


def test_stats_have_the_documented_keys():
    s = ft.allocator_stats("managed_pool", device=0)
    for key in ("allocated", "allocated_peak", "requested", "reserved", "reserved_peak", "allocations",
                "frees", "failures", "prefetched_bytes", "prefetches", "chunks", "reuse_same_stream",
                "reuse_after_fence", "reuse_by_wait", "last_failure", "options"):
        assert key in s
    with pytest.raises(InvalidArgumentError):
        ft.allocator_stats("nope")


# ---- use_allocator / mem_pool against a stand-in torch -----------------------------------


class FakeTorch(types.ModuleType):
    """What use_allocator and mem_pool touch of torch, recording the calls."""

    def __init__(self, initialized=False, swap_error=None):
        super().__init__("torch")
        self.__version__ = "2.11.0+fake"
        self.calls = []
        fake = self

        class Pluggable:
            def __init__(self, path, alloc, free):
                fake.calls.append(("CUDAPluggableAllocator", path, alloc, free))
                self.names = (alloc, free)

            def allocator(self):
                return ("raw", self.names)

        class MemPool:
            def __init__(self, allocator=None):
                fake.calls.append(("MemPool", allocator))

        def change_current_allocator(a):
            fake.calls.append(("change_current_allocator", a.names))
            if swap_error:
                raise RuntimeError(swap_error)

        self.cuda = types.SimpleNamespace(
            is_initialized=lambda: initialized,
            memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                         change_current_allocator=change_current_allocator),
            MemPool=MemPool,
        )


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(ft.allocators, "_current", None)
    monkeypatch.setattr(ft.allocators, "_last_pool_name", None)
    monkeypatch.setattr(ft.allocators, "_keepalive", [])

    def install(**kw):
        t = FakeTorch(**kw)
        monkeypatch.setitem(sys.modules, "torch", t)
        return t

    return install


def test_use_allocator_installs_the_pluggable_allocator(fresh):
    t = fresh()
    ft.use_allocator("managed_pool", prefetch="chunk", chunk_bytes="128M")
    assert t.calls[0] == ("CUDAPluggableAllocator", ft.library_path(), "ferry_torch_alloc_managed_pool",
                          "ferry_torch_free_managed_pool")
    assert t.calls[1] == ("change_current_allocator",
                          ("ferry_torch_alloc_managed_pool", "ferry_torch_free_managed_pool"))
    assert "prefetch=chunk" in _ferry.managed_options("managed_pool")
    assert ft.current_allocator() == "managed_pool"
    assert ft.allocator_stats()["allocator"] == "managed_pool"
    # The same call again is a no-op; another allocator is refused (once per process).
    ft.use_allocator("managed_pool", prefetch="chunk", chunk_bytes="128M")
    assert len(t.calls) == 2
    with pytest.raises(ft.AllocatorTooLateError, match="once per process"):
        ft.use_allocator("device")


def test_too_late_says_so_and_how_to_fix_it(fresh):
    t = fresh(initialized=True)
    with pytest.raises(ft.AllocatorTooLateError) as e:
        ft.use_allocator("managed", prefetch=True)
    msg = str(e.value)
    assert "too late" in msg
    assert "before any CUDA tensor is created" in msg
    assert "ferry.torch.mem_pool('managed')" in msg and "torch.cuda.use_mem_pool" in msg
    assert isinstance(e.value, ferry.FerryError) and isinstance(e.value, RuntimeError)
    assert t.calls == []  # nothing was changed
    assert ft.current_allocator() is None


def test_torch_refusing_the_swap_becomes_the_too_late_error(fresh):
    fresh(swap_error="Can't swap an already initialized allocator")
    with pytest.raises(ft.AllocatorTooLateError, match="PyTorch said: Can't swap"):
        ft.use_allocator("device")
    assert ft.current_allocator() is None


def test_bad_names_and_options_fail_before_torch_is_touched(fresh):
    t = fresh()
    with pytest.raises(InvalidArgumentError, match="unknown allocator"):
        ft.use_allocator("unified")
    with pytest.raises(InvalidArgumentError, match="'whenever'"):
        ft.use_allocator("managed", prefetch="whenever")
    assert not [c for c in t.calls if c[0] == "change_current_allocator"]


def test_mem_pool_wraps_the_raw_allocator(fresh):
    t = fresh(initialized=True)  # a pool works after CUDA is initialized
    ft.mem_pool("managed_pool", prefetch=True)
    assert t.calls[-1] == ("MemPool", ("raw", ("ferry_torch_alloc_managed_pool", "ferry_torch_free_managed_pool")))
    assert len(ft.allocators._keepalive) == 1  # the allocator outlives the pool's blocks
    assert ft.allocator_stats()["allocator"] == "managed_pool"


def test_mem_pool_needs_a_recent_torch(fresh):
    t = fresh()
    del t.cuda.MemPool
    with pytest.raises(NotSupportedError, match="2.5"):
        ft.mem_pool("managed")


def test_empty_cache_without_cuda_releases_nothing():
    assert ft.empty_cache("managed_pool") == 0


# ---- with PyTorch and a GPU: each allocator in its own process -------------------------

_SCRIPT = r"""
import gc, json, sys
import torch
import ferry.torch as ft

cfg = json.loads(sys.argv[1])
out = sys.argv[2]
if cfg["name"] != "default":
    ft.use_allocator(cfg["name"], **cfg["options"])
dev = torch.device("cuda", 0)
g = torch.Generator().manual_seed(1234)
a = torch.randn(777, 383, generator=g)
b = torch.randn(383, 129, generator=g)
idx = torch.randint(0, 777, (20000,), generator=g)
ints = torch.randint(-1000, 1000, (1 << 20,), generator=g)
A, B = a.to(dev), b.to(dev)
r = {}
r["matmul"] = (A @ B).cpu()
r["softmax"] = torch.softmax(A, 1).cpu()
r["colsum"] = A.sum(0).cpu()
r["gather"] = A[idx.to(dev)].cpu()
r["sort"] = torch.sort(A.flatten()).values.cpu()
r["cumsum_int"] = torch.cumsum(ints.to(dev), 0).cpu()
r["elementwise"] = (A * 3 + 1).relu().cpu()
i = torch.randint(0, 777, (2, 5000), generator=g)
S = torch.sparse_coo_tensor(i, torch.randn(5000, generator=g), (777, 777)).coalesce().to(dev)
r["spmm"] = torch.sparse.mm(S, A).cpu()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    X = A.clone() * 2
side.synchronize()
r["side_stream"] = X.cpu()
# alloc/free cycles on two streams, each checked
for k in range(300):
    s = side if k % 2 else torch.cuda.current_stream()
    with torch.cuda.stream(s):
        t = torch.empty(1 + (k * 7919) % (1 << 18), device=dev)
        t.fill_(float(k))
        assert t[-1].item() == float(k)
        del t
# a few steps of training
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(383, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
y = torch.randint(0, 10, (777,), generator=g).to(dev)
losses = []
for _ in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(A), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
r["losses"] = torch.tensor(losses)
torch.save(r, out)
result = {}
if cfg["name"] != "default":
    del A, B, S, X, y, model, opt, loss, side
    gc.collect()
    torch.cuda.synchronize()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    gc.collect()
    torch.cuda.synchronize()
    s = ft.allocator_stats()
    result["after_free"] = {k: s[k] for k in ("allocated", "requested", "failures", "allocations", "frees",
                                             "prefetched_bytes", "reserved")}
    result["released"] = ft.empty_cache()
    result["after_trim"] = {k: ft.allocator_stats()[k] for k in ("reserved", "chunks")}
print("RESULT " + json.dumps(result))
"""

CONFIGS = [
    ("device", {}),
    ("managed", {}),
    ("managed", {"prefetch": True, "advise": ["preferred_location", "accessed_by"]}),
    ("managed_pool", {}),
    ("managed_pool", {"prefetch": "chunk", "stream_wait": False, "chunk_bytes": "32M"}),
]


def _torch_gpu():
    torch = pytest.importorskip("torch")
    if not _have_device():
        pytest.skip("needs a CUDA device")
    return torch


def _run(name, options, out, timeout=300):
    p = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps({"name": name, "options": options}), out],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{name} {options}:\n{p.stdout}\n{p.stderr}"
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def default_results(tmp_path_factory):
    torch = _torch_gpu()
    out = str(tmp_path_factory.mktemp("managed") / "default.pt")
    _run("default", {}, out)
    return torch.load(out)


@pytest.mark.parametrize("name,options", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_tensor_ops_match_the_default_allocator(default_results, tmp_path, name, options):
    torch = _torch_gpu()
    out = str(tmp_path / "r.pt")
    result = _run(name, options, out)
    mine = torch.load(out)
    exact = ("gather", "sort", "cumsum_int", "elementwise", "side_stream")
    for key, ref in default_results.items():
        if key in exact:
            assert torch.equal(mine[key], ref), key
        else:  # reductions, GEMM, SpMM: same kernels, but atomics may reorder sums
            assert torch.allclose(mine[key], ref, rtol=1e-5, atol=1e-5), \
                f"{key}: max diff {(mine[key] - ref).abs().max().item()}"
    after = result["after_free"]
    assert after["failures"] == 0
    assert after["allocated"] == 0 and after["requested"] == 0, f"live allocations left: {after}"
    assert after["allocations"] == after["frees"]
    if options.get("prefetch"):
        assert after["prefetched_bytes"] > 0
    if name == "managed_pool":
        assert result["after_trim"] == {"reserved": 0, "chunks": 0}
    else:
        assert after["reserved"] == 0


def test_too_late_in_a_real_process():
    _torch_gpu()
    code = ("import torch, ferry.torch as ft\n"
            "x = torch.ones(4, device='cuda')\n"
            "try:\n"
            "    ft.use_allocator('managed_pool')\n"
            "except ft.AllocatorTooLateError as e:\n"
            "    print('TOO LATE:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "TOO LATE:" in p.stdout and "mem_pool" in p.stdout


def test_mem_pool_region_uses_ferry_memory():
    _torch_gpu()
    code = ("import torch, ferry.torch as ft\n"
            "x = torch.ones(4, device='cuda')\n"  # too late for use_allocator, fine for a pool
            "pool = ft.mem_pool('managed_pool')\n"
            "with torch.cuda.use_mem_pool(pool):\n"
            "    y = torch.full((1 << 20,), 3.0, device='cuda')\n"
            "s = ft.allocator_stats('managed_pool')\n"
            "assert s['allocated'] >= 4 << 20, s\n"
            "assert y.sum().item() == 3.0 * (1 << 20)\n"
            "print('OK', s['allocated'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("OK")


def test_allocation_beyond_free_memory_is_refused_with_the_reason():
    # The guard refuses before cudaMallocManaged is called, and prefetch is off,
    # so even a broken guard would only reserve address space.
    _torch_gpu()
    code = ("import torch, ferry.torch as ft\n"
            "ft.use_allocator('managed')\n"
            "free, total = torch.cuda.mem_get_info()\n"
            "try:\n"
            "    t = torch.empty(free + (1 << 30), dtype=torch.uint8, device='cuda')\n"
            "    print('PTR', t.data_ptr())\n"  # PyTorch may hand out NULL instead of raising
            "    del t\n"
            "except Exception as e:\n"
            "    print('RAISED', type(e).__name__)\n"
            "s = ft.allocator_stats()\n"
            "print('FAILURES', s['failures'])\n"
            "print('WHY', s['last_failure'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FAILURES 1" in p.stdout
    assert "refused to ask cudaMallocManaged" in p.stdout and "free" in p.stdout
    assert "PTR 0" in p.stdout or "RAISED" in p.stdout, p.stdout
