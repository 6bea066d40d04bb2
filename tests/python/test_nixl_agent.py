"""ferry.nixl.agent and what decides it (ferry.nixl.ucx): the choice, table-driven on
probe results (no NIXL needed); the precedence of the user's UCX_* variables and
backend_params; describe(); the doctor's NIXL section and its finding; `ferry bench
nixl`'s argument checks. With NIXL installed (scripts/test installs nixl-cu13): the
real probe, agents made by agent() exchanging data (post split=), the doctor's
NIXL check and a host-memory bench run, each in a fresh process.
"""

import json
import os
import subprocess
import sys

import pytest

import ferry
import ferry.nixl as fn
from ferry import rules
from ferry.bench import nixl as bench_nixl
from ferry.doctor import nixl_check, steps
from ferry.doctor.model import Block, Figures
from ferry.nixl import ucx
from ferry.nixl.library import MODULES

CPU_BOX = {"self": ("memory",), "tcp": ("eth0", "lo"), "sysv": ("memory",), "posix": ("memory",),
           "cma": ("memory",)}
GPU_VM = {"self": ("memory",), "tcp": ("lo",), "sysv": ("memory",), "posix": ("memory",), "cma": ("memory",),
          "cuda_copy": ("cuda",), "cuda_ipc": ("cuda",)}
RDMA_NODE = {**GPU_VM, "tcp": ("eth0", "lo"), "gdr_copy": ("cuda",), "rc_mlx5": ("mlx5_0:1",),
             "ud_mlx5": ("mlx5_0:1",), "dc_mlx5": ("mlx5_0:1",)}


def probe(transports, gpus=0, error=None):
    return ucx.Probe(version="1.23.0", library="/x/libucp.so", transports=transports, gpus=gpus, error=error)


# ---- the choice, from probe results ---------------------------------------------------

CHOICES = [
    # (case, transports, gpus, peers, cma, UCX_TLS chosen (None: left to UCX), error handling, RMA pipeline)
    ("cpu host, any peers", CPU_BOX, 0, "any", None, "sm,tcp,self", "none", None),
    ("cpu host, remote peers", CPU_BOX, 0, "remote", None, "tcp,self", "peer", None),
    ("cpu host, local peers", CPU_BOX, 0, "local", None, "sm,self", "none", None),
    ("GPU VM (no NIC), any peers", GPU_VM, 1, "any", None, "cuda_copy,cuda_ipc,posix,sysv,self", "none", "y"),
    ("GPU VM, cma allowed", GPU_VM, 1, "local", True, "cuda_copy,cuda_ipc,sm,self", "none", "y"),
    ("GPU VM, remote peers: loopback tcp only", GPU_VM, 1, "remote", None, "cuda_copy,cuda_ipc,tcp,self", "peer",
     "y"),
    ("RDMA node, remote peers", RDMA_NODE, 8, "remote", None, "cuda_copy,cuda_ipc,gdr_copy,ib,tcp,self", "peer",
     "y"),
    ("RDMA node, any peers", RDMA_NODE, 8, "any", None,
     "cuda_copy,cuda_ipc,gdr_copy,posix,sysv,ib,tcp,self", "none", "y"),
    ("loopback tcp only", {"self": ("memory",), "tcp": ("lo",)}, 0, "local", None, "tcp,self", "peer", None),
    ("nothing for messages", {"self": ("memory",)}, 0, "any", None, None, "peer", None),
]


@pytest.mark.parametrize("case, transports, gpus, peers, cma, tls, mode, ppln", CHOICES, ids=[c[0] for c in CHOICES])
def test_choice_from_probe_results(case, transports, gpus, peers, cma, tls, mode, ppln):
    s = ucx.choose(probe(transports, gpus), peers=peers, env={}, cma=cma)
    assert s.env.get("UCX_TLS") == tls
    assert s.error_handling == mode and s.backend_params == {"ucx_error_handling_mode": mode}
    assert s.env.get("UCX_RMA_PPLN_ENABLE") == ppln
    assert s.user == {} and s.warnings == ()
    assert s.reasons and all(isinstance(r, str) for r in s.reasons)


FRAG_CASES = [
    # (case, transports, gpus, peers, 4 MiB fragments chosen)
    ("GPU VM, local peers", GPU_VM, 1, "local", True),
    ("RDMA node, any peers", RDMA_NODE, 8, "any", True),
    ("RDMA node, remote peers: not measured there, UCX's default", RDMA_NODE, 8, "remote", False),
    ("cpu host", CPU_BOX, 0, "local", False),
    ("GPUs but no cuda_ipc", {**CPU_BOX, "cuda_copy": ("cuda",)}, 1, "local", False),
]


@pytest.mark.parametrize("case, transports, gpus, peers, frag", FRAG_CASES, ids=[c[0] for c in FRAG_CASES])
def test_rendezvous_fragments_for_local_gpu_traffic(case, transports, gpus, peers, frag):
    s = ucx.choose(probe(transports, gpus), peers=peers, env={})
    if frag:
        assert s.env["UCX_RNDV_FRAG_SIZE"] == "host:4M,cuda:4M"
        assert s.env["UCX_RNDV_FRAG_ALLOC_COUNT"] == "host:16,cuda:128"
        assert any("UCX_RNDV_FRAG_SIZE=host:4M,cuda:4M" in r for r in s.reasons)
    else:
        assert "UCX_RNDV_FRAG_SIZE" not in s.env and "UCX_RNDV_FRAG_ALLOC_COUNT" not in s.env


def test_user_fragment_size_wins_and_takes_the_count_with_it():
    s = ucx.choose(probe(GPU_VM, gpus=1), peers="local", env={"UCX_RNDV_FRAG_SIZE": "host:1M"})
    assert "UCX_RNDV_FRAG_SIZE" not in s.env and "UCX_RNDV_FRAG_ALLOC_COUNT" not in s.env
    assert s.effective_env["UCX_RNDV_FRAG_SIZE"] == "host:1M"
    assert any("the user's 'host:1M' wins over ferry's 'host:4M,cuda:4M'" in r for r in s.reasons)
    s = ucx.choose(probe(GPU_VM, gpus=1), peers="local", env={"UCX_RNDV_FRAG_ALLOC_COUNT": "host:4"})
    assert s.env["UCX_RNDV_FRAG_SIZE"] == "host:4M,cuda:4M" and "UCX_RNDV_FRAG_ALLOC_COUNT" not in s.env
    assert set(ucx.CHOSEN_KEYS) >= {"UCX_RNDV_FRAG_SIZE", "UCX_RNDV_FRAG_ALLOC_COUNT"}


def test_a_failed_probe_leaves_the_transports_to_ucx_but_keeps_the_pipeline_on_gpus():
    s = ucx.choose(probe({}, gpus=1, error="UCX did not start within 30 s"), env={})
    assert "UCX_TLS" not in s.env and s.env["UCX_RMA_PPLN_ENABLE"] == "y"
    assert any("probe failed" in r for r in s.reasons)
    assert "probe failed: UCX did not start" in s.describe()


def test_peers_is_checked():
    with pytest.raises(ferry.InvalidArgumentError, match="peers='lan'"):
        ucx.choose(probe(CPU_BOX), peers="lan", env={})


def test_parse_context_info():
    text = """#
# UCP context
#            md 0  :  component 0  self
#      resource 0  :  md 0  dev 0  flags -- self/memory
#      resource 1  :  md 1  dev 1  flags -- tcp/eth0
#      resource 2  :  md 1  dev 2  flags -- tcp/lo
#      resource 3  :  md 5  dev 3  flags -- rc_mlx5/mlx5_0:1
#      resource 4  :  md 6  dev 4  flags -- cuda_copy/cuda
"""
    assert ucx.parse_context_info(text) == {"self": ("memory",), "tcp": ("eth0", "lo"),
                                            "rc_mlx5": ("mlx5_0:1",), "cuda_copy": ("cuda",)}
    assert ucx.parse_context_info("") == {}


# ---- the user's settings win -----------------------------------------------------------


def test_user_environment_wins_and_is_reported():
    env = {"UCX_TLS": "tcp", "UCX_PROTO_INFO": "y", "PATH": "/bin"}
    s = ucx.choose(probe(CPU_BOX), env=env)
    assert "UCX_TLS" not in s.env  # ferry sets nothing the user set
    assert s.user == {"UCX_TLS": "tcp", "UCX_PROTO_INFO": "y"}
    assert s.effective_env["UCX_TLS"] == "tcp"
    assert s.error_handling == "peer"  # tcp reports dead peers: NIXL's default stays
    assert any("the user's 'tcp' wins over ferry's 'sm,tcp,self'" in r for r in s.reasons)


def test_user_backend_params_win():
    s = ucx.choose(probe(CPU_BOX), env={}, backend_params={"ucx_error_handling_mode": "peer", "num_workers": 2})
    assert s.backend_params == {"ucx_error_handling_mode": "peer", "num_workers": "2"}
    assert s.user == {"backend_params.ucx_error_handling_mode": "peer", "backend_params.num_workers": "2"}
    assert s.env["UCX_TLS"] == "sm,tcp,self"


@pytest.mark.parametrize("env, params, fragment", [
    ({"UCX_TLS": "sm,self"}, {}, "no CUDA transport"),
    ({"UCX_TLS": "cuda_copy,sm,self"}, {}, "no cuda_ipc"),
    ({"UCX_RMA_PPLN_ENABLE": "n"}, {}, "RMA rendezvous protocol is off"),
    ({}, {"ucx_error_handling_mode": "peer"}, "peer error handling rules out"),
])
def test_slow_user_settings_on_a_gpu_machine_are_warned_about(env, params, fragment):
    s = ucx.choose(probe(GPU_VM, gpus=1), env=env, backend_params=params)
    assert any(fragment in w["problem"] for w in s.warnings), s.warnings
    assert all(w["fix"] for w in s.warnings)
    assert "warning:" in s.describe()
    # the same settings on a machine without GPU: nothing to warn about
    assert ucx.choose(probe(CPU_BOX), env=env, backend_params=params).warnings == ()


def test_describe_says_what_and_why():
    s = ucx.choose(probe(GPU_VM, gpus=1), env={"UCX_PROTO_INFO": "y"})
    text = s.describe()
    assert "UCX 1.23.0, 1 GPU" in text
    assert ("UCX_TLS=cuda_copy,cuda_ipc,posix,sysv,self, error handling none, RMA pipeline y, rendezvous "
            "fragments host:4M,cuda:4M") in text
    assert "the user's (they win): UCX_PROTO_INFO=y" in text
    assert "why: error handling none" in text and "cuda_ipc (cuda)" in text
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d and d["probe"]["transports"]["cuda_ipc"] == ["cuda"]


def test_agent_arguments_are_checked_before_nixl():
    with pytest.raises(ferry.InvalidArgumentError, match="non-empty name"):
        fn.agent("")
    with pytest.raises(ferry.InvalidArgumentError, match="UCX backend only"):
        fn.agent("a", backend_params={"GDS": {}})
    with pytest.raises(ferry.InvalidArgumentError, match="not made by ferry.nixl.agent"):
        fn.settings(object())


def test_split_is_checked_before_nixl():
    buf = ferry.Pool().alloc(4096)
    for split, fragment in ((0, "split=0"), (-1, "split=-1 is negative"), ("2", "split='2'")):
        with pytest.raises(ferry.InvalidArgumentError, match=fragment):
            fn.post(object(), "WRITE", fn.descs(buf), fn.descs(buf), "peer", split=split)


# ---- the doctor ----------------------------------------------------------------------------


def report_of(nixl: dict) -> list:
    return steps.NIXL.report(Figures({"measurements": {"nixl": nixl}}), None)


def test_doctor_section_without_nixl():
    [block] = report_of({"installed": False, "reason": "NIXL is not installed (pip install 'ferry[nixl]')"})
    assert isinstance(block, Block) and block.heading == "NIXL"
    assert block.rows[0].value == "no" and "pip install" in block.rows[0].items[0]


def test_doctor_section_with_figures_and_settings():
    s = ucx.choose(probe(GPU_VM, gpus=1), env={"UCX_PROTO_INFO": "y"})
    nixl = {"installed": True, "module": "nixl_cu13", "version": "1.5.1", "location": "/site/nixl_cu13",
            "ucx_version": "1.23.0", "transports": s.probe.to_dict()["transports"], "probe_error": None,
            "settings": s.to_dict(), "warnings": [],
            "self_test": {"memory": "pinned pool -> GPU", "bytes": 32 << 20, "block_bytes": 1 << 20,
                          "write_gbps": 41.5, "read_gbps": 40.2, "verified": True}}
    [block] = report_of(nixl)
    rows = {r.label: r for r in block.rows}
    assert rows["installed"].value.startswith("nixl_cu13 1.5.1")
    assert "cuda_ipc (cuda)" in rows["transports that start"].value
    assert rows["ferry.nixl.agent picks"].value.startswith("UCX_TLS=cuda_copy,cuda_ipc,posix,sysv,self")
    assert rows["ferry.nixl.agent picks"].items == ("the user's UCX_PROTO_INFO=y wins",)
    [test] = [r for r in block.rows if r.label.startswith("self-test")]
    assert test.value == "WRITE 41.5 GB/s, READ 40.2 GB/s, verified"
    [quick] = report_of({**nixl, "transports": {}, "probe_error": "not probed in a --quick run",
                         "self_test": {"error": "skipped in a --quick run"}})
    assert any("not run: skipped" in r.value for r in quick.rows)


def test_finding_fires_on_forced_slow_settings_and_names_the_fix():
    s = ucx.choose(probe(GPU_VM, gpus=1), env={"UCX_TLS": "sm,self"})
    m = {"nixl": {"installed": True, "warnings": [dict(w) for w in s.warnings]}}
    [finding] = [f for f in rules.evaluate({}, m) if f.id == "nixl-ucx-slow-settings"]
    assert finding.severity == "warning" and "UCX_TLS=sm,self" in finding.evidence[0]
    assert "cuda_copy" in finding.fix and "ferry.nixl.agent" in finding.fix
    quiet = {"nixl": {"installed": True, "warnings": []}}
    assert not [f for f in rules.evaluate({}, quiet) if f.id == "nixl-ucx-slow-settings"]
    assert not [f for f in rules.evaluate({}, {}) if f.id == "nixl-ucx-slow-settings"]


def test_doctor_quick_check_runs_no_child_and_reads_the_environment(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "sm,self")
    got = nixl_check.check(quick=True, gpus=1)
    if not got["installed"]:
        assert "pip install" in got["reason"]
        return
    assert got["probe_error"] == "not probed in a --quick run" and got["transports"] == {}
    assert got["self_test"] == {"error": "skipped in a --quick run"}
    assert [w["setting"] for w in got["warnings"]] == ["UCX_TLS=sm,self"]


# ---- ferry bench nixl: arguments first ----------------------------------------------------


@pytest.mark.parametrize("argv, fragment", [
    (["--sizes", "64K,1Q"], "'1Q' is not a size"),
    (["--sizes", "4M", "--total", "1M"], "more than --total"),
    (["--repeats", "0"], "--repeats=0"),
    (["--ops", "READ,COPY"], "'COPY'"),
    (["--settings", "ferry,fast"], "'fast'"),
    (["--split", "0"], "--split=0"),
    (["--layouts", "adjacent,strided"], "'strided'"),
    (["--coalesce", "2Q"], "--coalesce: '2Q' is not a size"),
    (["--ucx", "TLS"], "expected KEY=VALUE"),
    (["--backend", "=3"], "expected KEY=VALUE"),
    (["--timeout", "0"], "--timeout=0"),
    (["--device", "-1"], "GPU indexes are >= 0"),
    (["--memory", "host", "--peer-device", "1"], "need --memory gpu"),
])
def test_bench_refuses_bad_arguments_before_the_waived_check(capsys, argv, fragment):
    assert bench_nixl.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "waived" not in err


def test_bench_records_have_the_common_shape():
    rows = [{"setting": s, "layout": layout, "op": op, "block_bytes": 1 << 20, "blocks": 8,
             "descriptors": posted, "bytes": 8 << 20, "gbps": g, "verified": True}
            for s, layout, op, g, posted in (("ferry", "shuffled", "READ", 40.0, 8),
                                             ("nixl", "shuffled", "READ", 0.8, 8),
                                             ("ferry", "shuffled", "WRITE", 20.0, 8),
                                             ("ferry", "adjacent", "READ", 42.0, 4))]
    recs = bench_nixl.records(rows, "gpu")
    assert [set(r) for r in recs] == [{"suite", "case", "params", "metric", "value", "unit", "baseline",
                                       "ratio"}] * 3
    read, write, joined = recs
    assert read["case"] == "read 1 MiB shuffled" and read["unit"] == "GB/s" and read["baseline"] == 0.8
    assert read["ratio"] == pytest.approx(50.0) and read["params"]["verified"] is True
    assert write["baseline"] is None and write["ratio"] is None
    assert joined["case"] == "read 1 MiB adjacent" and joined["params"]["descriptors"] == 4
    assert joined["params"]["layout"] == "adjacent" and joined["baseline"] is None


# ---- with NIXL ----------------------------------------------------------------------------

AGENT_SCRIPT = r"""
import os, numpy as np, ferry, ferry.nixl as fn
before = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
a = fn.agent("A", peers="local")
b = fn.agent("B", peers="local", backend_params={"UCX": {"num_workers": "1"}})
assert {k: v for k, v in os.environ.items() if k.startswith("UCX_")} == before, "agent() leaked UCX_* variables"
s = fn.settings(a)
assert s.env.get("UCX_TLS"), s.describe()
assert fn.settings(b).user == {"backend_params.num_workers": "1"}
pa, pb = ferry.Pool(), ferry.Pool()
src, dst = pa.alloc(7 * 40009), pb.alloc(7 * 40009)
data = np.frombuffer(np.random.default_rng(5).bytes(7 * 40009), np.uint8)
np.frombuffer(src, np.uint8)[:] = data
np.frombuffer(dst, np.uint8)[:] = 0xA5
ra, rb = fn.register_pool(a, pa), fn.register_pool(b, pb)
peer = fn.add_remote(a, b.get_agent_metadata())
with fn.write(a, fn.slots(src, range(7), 40009), fn.slots(dst, [6, 5, 4, 3, 2, 1, 0], 40009), peer,
              split=3, timeout=60) as t:
    assert t.parts == 3
    got = np.frombuffer(dst, np.uint8).reshape(7, 40009)
    assert all(np.array_equal(got[6 - k], data.reshape(7, 40009)[k]) for k in range(7))
    t.repost().wait(60)
print(s.describe())
print("ok")
"""


@pytest.fixture(scope="module")
def nixl_installed():
    if not fn.available():
        pytest.skip(f"NIXL is not installed: {fn.unavailable_reason()}")


def run_python(args, env=None, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NIXL_LOG_LEVEL": "WARN", **(env or {})})


def test_real_probe_lists_what_starts(nixl_installed):
    p = ucx.run_probe()
    if p.error:
        pytest.skip(f"UCX does not start here: {p.error}")
    assert p.version and p.has("self") and p.library
    assert ucx.probe() is ucx.probe()  # cached per process


def test_agents_from_agent_exchange_data_and_leave_the_environment_alone(nixl_installed):
    r = run_python(["-c", AGENT_SCRIPT])
    if r.returncode != 0 and "NIXL_ERR_BACKEND" in r.stderr:
        pytest.skip(f"NIXL's UCX backend does not start here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    assert "ferry.nixl agent settings for local peers" in r.stdout


def test_user_ucx_tls_wins_in_a_real_agent(nixl_installed):
    code = ("import ferry.nixl as fn; a = fn.agent('A'); s = fn.settings(a); "
            "assert 'UCX_TLS' not in s.env and s.user['UCX_TLS'] == 'tcp', s.describe(); "
            "assert s.error_handling == 'peer'; print('ok')")
    r = run_python(["-c", code], env={"UCX_TLS": "tcp"})
    if r.returncode != 0 and "NIXL_ERR_BACKEND" in r.stderr:
        pytest.skip("UCX over tcp does not start here")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_doctor_nixl_check_self_test(nixl_installed):
    got = nixl_check.check(quick=False, gpus=0)
    assert got["installed"] and got["module"] in MODULES
    if got["probe_error"]:
        pytest.skip(f"UCX does not start here: {got['probe_error']}")
    assert got["ucx_version"] and "self" in got["transports"]
    t = got["self_test"]
    assert "error" not in t, t
    assert t["verified"] is True and t["write_gbps"] > 0 and t["read_gbps"] > 0


def test_bench_nixl_host_memory_run(nixl_installed, tmp_path):
    out = tmp_path / "bench.json"
    r = run_python(["-m", "ferry.bench.nixl", "--memory", "host", "--sizes", "64K,1M", "--total", "2M",
                    "--repeats", "2", "--timeout", "60", "--json", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    recs = doc["records"]
    # ops, sizes, layouts, settings
    assert set(doc["suites"]) == {"nixl"} and len(doc["details"]["nixl"]["rows"]) == 2 * 2 * 2 * 2
    assert {r["case"] for r in recs} == {f"{op} {size} {layout}" for op in ("read", "write")
                                         for size in ("64 KiB", "1 MiB") for layout in ("adjacent", "shuffled")}
    assert all(r["params"]["verified"] and r["value"] > 0 and r["baseline"] > 0 for r in recs)
    posted = {(r["params"]["layout"], r["params"]["block_bytes"]): r["params"]["descriptors"] for r in recs}
    assert posted[("adjacent", 65536)] == 1 and posted[("shuffled", 65536)] > 1  # 2 MiB: one joined descriptor
    assert "NIXL defaults" in r.stdout and "ferry.nixl.agent" in r.stdout and "posted" in r.stdout
