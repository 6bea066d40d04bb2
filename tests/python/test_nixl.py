"""ferry.nixl: the pool's chunk view, descriptor builders and their errors (no
NIXL needed), the "NIXL missing" path (a real import failure), and with NIXL
installed (scripts/test installs nixl-cu13): agents exchanging ferry Pool
memory, in one process (nixl_scenarios.py, each in a fresh interpreter) and
in two (examples/nixl_kv_offload.py --device cpu), data verified. The GPU test
runs the example from a pinned pool to another process's GPU.

NIXL tests skip, saying why, where NIXL is not installed or cannot create an
agent (its UCX backend must start; it needs no GPU).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import ferry
import ferry.nixl as fn
from ferry.measure import gpu_absent_reason

MiB = 1 << 20
HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "nixl_kv_offload.py"


def run_python(args, env=None, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NIXL_LOG_LEVEL": "WARN", **(env or {})})


# ---- the pool as a registrar sees it ------------------------------------------------


def test_pool_chunks_hold_every_allocation_and_the_generation_moves_with_them():
    pool = ferry.Pool(chunk_bytes=4 * MiB)
    assert pool.chunks() == [] and pool.chunk_generation == 0
    a = pool.alloc(MiB + 5)
    [(base, nbytes, generation)] = pool.chunks()
    assert nbytes == 4 * MiB and base <= a.ptr and a.ptr + a.nbytes <= base + nbytes
    assert generation == pool.chunk_generation > 0
    pool.alloc(100).release()  # recycling moves nothing
    assert pool.chunk_generation == generation
    b = pool.alloc(9 * MiB + 1)  # its own chunk
    chunks = pool.chunks()
    assert len(chunks) == 2 and pool.chunk_generation > generation
    assert chunks == sorted(chunks) and chunks[0][0] + chunks[0][1] <= chunks[1][0]
    assert any(s <= b.ptr and b.ptr + b.nbytes <= s + n for s, n, _ in chunks)
    b.release()
    moved = pool.chunk_generation
    pool.trim(4 * MiB)
    assert pool.chunk_generation > moved
    assert [c[0] for c in pool.chunks()] == [base]
    a.release()


# ---- descriptor builders (pure Python) ----------------------------------------------


def test_descs_of_buffers_arrays_and_addresses():
    np = pytest.importorskip("numpy")
    pool = ferry.Pool()
    buf = pool.alloc(12345)
    d = fn.descs(buf)
    assert d.mem_type == "DRAM" and d.rows == ((buf.ptr, 12345, 0),) and d.nbytes == 12345
    assert fn.descs(buf, 100).rows == ((buf.ptr, 100, 0),)
    raw = bytearray(777)
    array = np.zeros((3, 5), np.float32)
    assert fn.descs(array).rows == ((array.ctypes.data, 60, 0),)
    assert fn.descs(raw).nbytes == 777
    assert fn.descs(0x1000, 64, mem_type="VRAM", device=3).rows == ((0x1000, 64, 3),)
    assert d.array().dtype == np.uint64 and d.array().tolist() == [[buf.ptr, 12345, 0]]


def test_slots_and_blocks_give_one_row_per_block():
    np = pytest.importorskip("numpy")
    pool = ferry.Pool()
    bb = 4099  # an odd block size
    buf = pool.alloc(10 * bb + 3)
    ids = np.array([7, 0, 9, 3], dtype=np.int64)
    s = fn.slots(buf, ids, bb)
    assert s.rows == tuple((buf.ptr + int(i) * bb, bb, 0) for i in ids)
    kv = np.zeros((6, 3, 7), np.uint16)  # slots default to kv[i]
    assert fn.slots(kv, [5, 1]).rows == ((kv.ctypes.data + 5 * 42, 42, 0), (kv.ctypes.data + 42, 42, 0))
    addrs = np.array([buf.ptr + 1, buf.ptr + 1000], dtype=np.int64)
    b = fn.blocks(addrs, [10, 33], mem_type="DRAM", owner=buf)
    assert b.rows == ((buf.ptr + 1, 10, 0), (buf.ptr + 1000, 33, 0))
    assert fn.blocks([1 << 20, 2 << 20], 4096, mem_type="VRAM", device=1).rows == (
        (1 << 20, 4096, 1), (2 << 20, 4096, 1))
    joined = s + b
    assert len(joined) == 6 and joined.nbytes == 4 * bb + 43
    assert fn.Descs.from_dict(json.loads(json.dumps(joined.to_dict()))) == joined


@pytest.mark.parametrize("call, fragment", [
    (lambda buf: fn.slots(buf, [10], 100), "indices[0]=10 is outside the 10 slots"),
    (lambda buf: fn.slots(buf, [-1], 100), "indices[0]=-1"),
    (lambda buf: fn.slots(buf, [0], 0), "slot_bytes=0"),
    (lambda buf: fn.slots(buf, [0]), "slot_bytes is needed"),
    (lambda buf: fn.slots(buf, [0.5], 10), "indices[0]=0.5"),
    (lambda buf: fn.descs(buf, 1001), "nbytes=1001 is more than the 1000 bytes"),
    (lambda buf: fn.descs(buf, mem_type="VRAM"), "mem_type='VRAM', but this Buffer is DRAM"),
    (lambda buf: fn.descs(buf.ptr, 10), "needs nbytes and mem_type"),
    (lambda buf: fn.descs(buf.ptr, 10, mem_type="HBM"), "mem_type='HBM'"),
    (lambda buf: fn.blocks([buf.ptr, buf.ptr + 8], [1, 2, 3], mem_type="DRAM"), "2 addresses but 3 lengths"),
    (lambda buf: fn.blocks([buf.ptr], [0], mem_type="DRAM"), "0 bytes"),
    (lambda buf: fn.blocks([0], [5], mem_type="DRAM"), "address 0"),
    (lambda buf: fn.blocks([buf.ptr], [-4], mem_type="DRAM"), "nbytes=-4 is negative"),
    (lambda buf: fn.blocks([buf.ptr], [True], mem_type="DRAM"), "True"),
    (lambda buf: fn.blocks([(1 << 64) - 8], [16], mem_type="DRAM"), "passes the end of the address space"),
    (lambda buf: fn.Descs("DRAM", [(buf.ptr, 5)]), "is not an (address, nbytes, device) triple"),
    (lambda buf: fn.descs(buf) + fn.blocks([4096], [1], mem_type="VRAM"), "cannot join a DRAM and a VRAM"),
    (lambda buf: fn.Descs.from_dict({"rows": []}), "not a descriptor list"),
])
def test_bad_descriptors_are_refused_with_the_value(call, fragment):
    buf = ferry.Pool().alloc(1000)
    with pytest.raises(ferry.InvalidArgumentError) as e:
        call(buf)
    assert fragment in str(e.value)


def test_a_released_buffer_is_refused():
    buf = ferry.Pool().alloc(100)
    buf.release()
    with pytest.raises(ferry.InvalidArgumentError) as e:
        fn.descs(buf)
    assert "released" in str(e.value)


def test_transfer_requests_are_checked_before_nixl_is_called():
    pool = ferry.Pool()
    a, b = pool.alloc(4096), pool.alloc(8192)
    agent = object()  # never reached: every check comes first
    cases = [
        (("COPY", fn.descs(a), fn.descs(a)), "op='COPY'"),
        (("READ", fn.descs(a), fn.descs(b)), "4096 bytes locally, 8192 remotely"),
        (("READ", fn.slots(b, [0, 1], 4096), fn.descs(a)), "2 local descriptors but 1 remote"),
        (("WRITE", fn.Descs("DRAM", []), fn.Descs("DRAM", [])), "no descriptors"),
        (("WRITE", "text", fn.descs(a)), "local:"),
    ]
    for (op, local, remote), fragment in cases:
        with pytest.raises(ferry.InvalidArgumentError) as e:
            fn.post(agent, op, local, remote, "peer")
        assert fragment in str(e.value)


def test_torch_tensors_become_dram_or_vram_descriptors():
    torch = pytest.importorskip("torch")
    kv = torch.zeros((8, 16, 4), dtype=torch.float16)
    d = fn.descs(kv)
    assert d.mem_type == "DRAM" and d.rows == ((kv.data_ptr(), kv.numel() * 2, 0),)
    assert fn.slots(kv, [3]).rows == ((kv.data_ptr() + 3 * 128, 128, 0),)
    with pytest.raises(ferry.InvalidArgumentError):
        fn.descs(kv.transpose(0, 1))  # not contiguous
    if torch.cuda.is_available():
        g = torch.zeros(100, dtype=torch.uint8, device="cuda:0")
        assert fn.descs(g).mem_type == "VRAM" and fn.descs(g).rows == ((g.data_ptr(), 100, 0),)


# ---- without NIXL -----------------------------------------------------------------------

BLOCK_NIXL = """
import sys
class BlockNixl:  # a real import failure for NIXL's modules, through the import system
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("nixl", "nixl_cu12", "nixl_cu13"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, BlockNixl())
import ferry, ferry.nixl as fn
assert not fn.available()
reason = fn.unavailable_reason()
for call in (lambda: fn.make_agent("a"), fn.nixl):
    try:
        call()
    except fn.NixlUnavailableError as e:
        assert isinstance(e, ferry.NotSupportedError) and isinstance(e, ferry.FerryError), type(e).__mro__
        assert str(e) == reason, (str(e), reason)
    else:
        raise AssertionError("no NixlUnavailableError")
buf = ferry.Pool().alloc(64)
assert fn.slots(buf, [1, 0], 32).nbytes == 64  # the builders need no NIXL
print(reason)
"""


def test_without_nixl_the_module_imports_and_names_the_package():
    r = run_python(["-c", BLOCK_NIXL])
    assert r.returncode == 0, r.stdout + r.stderr
    reason = r.stdout.strip()
    assert "pip install 'ferry[nixl]'" in reason and "nixl-cu13" in reason
    assert "blocked by the test" in reason  # the import error is quoted


def test_example_help_needs_no_nixl():
    r = run_python([str(EXAMPLE), "--help"])
    assert r.returncode == 0, r.stderr
    for option in ("--block-bytes", "--blocks", "--mode", "--ucx-tls", "--ucx", "--ucx-error-handling", "--device",
                   "--agent", "--split"):
        assert option in r.stdout


# ---- with NIXL ----------------------------------------------------------------------------


def _shared_memory_tls():
    """UCX transports for host memory between processes of one machine. NIXL 1.5 refuses
    UCX_TLS without a CUDA transport where NVIDIA GPUs are present ("Invalid UCX_TLS=sm,self
    ... Add cuda_copy", seen on the H200 machine), so there cuda_copy joins them."""
    return "sm,self" if gpu_absent_reason(ferry.cuda_info()) else "cuda_copy,sm,self"


@pytest.fixture(scope="module")
def nixl_agents():
    """Skip unless NIXL imports and creates an agent here (probed in a fresh process)."""
    if not fn.available():
        pytest.skip(f"NIXL is not installed: {fn.unavailable_reason()}")
    _probe_agent({"UCX_TLS": _shared_memory_tls()}, "{'UCX': {'ucx_error_handling_mode': 'none'}}")


def _probe_agent(env, backend_params="None"):
    code = f"import ferry.nixl as fn; fn.make_agent('probe', backend_params={backend_params}); print('ok')"
    r = run_python(["-c", code], env=env, timeout=120)
    if r.returncode != 0 or "ok" not in r.stdout:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"NIXL is installed but cannot create an agent with UCX ({env}) here: {last}")


@pytest.fixture(scope="module")
def nixl_tcp(nixl_agents):
    """UCX over tcp needs a network interface besides loopback (the GPU VM has none)."""
    _probe_agent({"UCX_TLS": "tcp"})


@pytest.mark.parametrize("scenario", ["pool_follows_growth_and_trim", "plain_pool_part_release_registers_again",
                                      "write_timeout_then_completion_and_errors"])
def test_nixl_scenario(nixl_tcp, scenario):
    r = run_python([str(HERE / "nixl_scenarios.py"), scenario])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


@pytest.mark.parametrize("mode", ["read", "write"])
@pytest.mark.parametrize("transport", [("tcp", None), ("sm,self", "none")], ids=["tcp", "shared-memory"])
def test_two_processes_exchange_pool_memory(nixl_agents, request, tmp_path, mode, transport):
    tls, error_handling = transport
    if tls == "sm,self":
        tls = _shared_memory_tls()
    if tls == "tcp":
        request.getfixturevalue("nixl_tcp")
    out = tmp_path / "result.json"
    args = [str(EXAMPLE), "--device", "cpu", "--mode", mode, "--blocks", "37", "--gpu-blocks", "50",
            "--block-bytes", "20011", "--iters", "2", "--ucx-tls", tls, "--timeout", "60", "--json", str(out),
            "--seed", str(len(mode) * 1000 + len(tls))]
    if error_handling:
        args += ["--ucx-error-handling", error_handling]
    r = run_python(args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "37 blocks verified bit for bit; the other 13 kept the poison" in r.stdout
    result = json.loads(out.read_text())
    assert result["verified"] is True and result["exit_codes"] == [0, 0]
    assert result["op"] == mode.upper() and result["bytes"] == 37 * 20011 and result["descriptors"] == 37
    assert result["ucx"]["UCX_TLS"] == tls and len(result["seconds"]) == 2


# The settings that reached 34-41 GB/s on the H200 machines (docs/nixl.md).
GPU_UCX_TLS = "cuda_copy,cuda_ipc,sm,self"


@pytest.fixture(scope="module")
def nixl_gpu_agents():
    """Skip unless NIXL creates an agent with the GPU test's own UCX settings."""
    if not fn.available():
        pytest.skip(f"NIXL is not installed: {fn.unavailable_reason()}")
    _probe_agent({"UCX_TLS": GPU_UCX_TLS}, "{'UCX': {'ucx_error_handling_mode': 'none'}}")


def test_pinned_pool_to_another_process_gpu(gpu, nixl_gpu_agents, tmp_path):
    pytest.importorskip("torch")
    for mode in ("read", "write"):
        out = tmp_path / f"{mode}.json"
        r = run_python([str(EXAMPLE), "--device", "cuda", "--mode", mode, "--blocks", "48", "--block-bytes",
                        "300017", "--iters", "1", "--timeout", "120", "--json", str(out),
                        "--ucx-tls", GPU_UCX_TLS, "--ucx-error-handling", "none",
                        "--ucx", "RMA_PPLN_ENABLE=y"])
        assert r.returncode == 0, r.stdout + r.stderr
        result = json.loads(out.read_text())
        assert result["verified"] is True and result["bytes"] == 48 * 300017
