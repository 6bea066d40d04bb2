"""The NIXL part of `ferry doctor`: where NIXL is installed, the UCX it runs on,
the transports that start, the settings ferry.nixl.agent picks (and the user's
UCX settings that override them), and a short self-test: a ferry pool's blocks
moved into GPU memory (host memory where there is no GPU) between two local
agents with those settings, both ways, verified.

Everything that loads NIXL or UCX runs in one child process with a time limit
(`python -m ferry.doctor.nixl_check`, printing one JSON line): the doctor's own
process stays free of UCX's threads and memory hooks, and a hung UCX costs at
most CHILD_TIMEOUT. `--quick` runs no child: installation and the environment
check only.

Measurement key `nixl` (a dict): installed, module, version, location, reason
(why not installed); ucx_version, transports ({name: [devices]}), settings
(ferry.ucx.Settings.to_dict()), warnings (the user's slow settings, each
{setting, problem, fix}: the rule nixl-ucx-slow-settings reads them);
self_test: {memory, bytes, write_gbps, read_gbps, verified, error}.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time

CHILD_TIMEOUT = 45.0  # seconds: the probe, two agents and ~1 s of transfers take 2-5 s
SELF_TEST_BYTES = 32 << 20
SELF_TEST_BLOCK = 1 << 20
SELF_TEST_SECONDS = 1.0


def installation() -> dict:
    """{"installed", "module", "version", "location"} or {"installed": False,
    "reason"}: from the import system's search, without importing NIXL."""
    from .. import nixl

    for name in nixl.MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            continue
        dist = name.replace("_", "-")
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"installed": True, "module": name, "version": version,
                "location": os.path.dirname(spec.origin)}
    return {"installed": False, "reason": f"NIXL is not installed ({nixl.INSTALL_HINT})"}


def _pattern(nbytes: int, seed: int):
    """nbytes (a multiple of 8) that differ from word to word: cheap to make (a
    seeded generator takes a second for 64 MiB on a small VM)."""
    import numpy as np

    words = (np.arange(nbytes // 8, dtype=np.uint64) + np.uint64(seed)) * np.uint64(0x9E3779B97F4A7C15)
    return words.view(np.uint8)


def self_test() -> dict:
    """In this process: two agents made by ferry.nixl.agent, a pool buffer of
    SELF_TEST_BYTES moved in blocks into GPU memory (WRITE, pushed by the pool's
    agent) and back (READ, pulled by the same agent into a second buffer),
    repeated for about SELF_TEST_SECONDS, verified."""
    import numpy as np

    import ferry
    import ferry.nixl as fn
    from .. import _ferry, measure

    gpu = measure.gpu_absent_reason(_ferry.cuda_info()) is None
    n, block = SELF_TEST_BYTES, SELF_TEST_BLOCK
    a, b = fn.agent("doctor-a", peers="local"), fn.agent("doctor-b", peers="local")
    pool = ferry.PinnedPool(device=0, target_bytes=2 * n) if gpu else ferry.Pool()
    if gpu:
        pool.wait_ready()
    src, back = pool.alloc(n), pool.alloc(n)
    data = _pattern(n, 7)
    np.frombuffer(src, np.uint8)[:] = data
    np.frombuffer(back, np.uint8)[:] = 0xA5
    reg_a = fn.register_pool(a, pool)
    if gpu:
        dst = _ferry.cuda_malloc(n)
        target = fn.descs(dst, n, mem_type="VRAM", device=0)
        reg_b = fn.register(b, target)
    else:
        other = ferry.Pool()
        dst_buf = other.alloc(n)
        target = fn.descs(dst_buf)
        reg_b = fn.register_pool(b, other)
    out = {"memory": "pinned pool -> GPU" if gpu else "pool -> host memory (no GPU)", "bytes": n,
           "block_bytes": block}
    try:
        peer = fn.add_remote(a, b.get_agent_metadata())
        count = n // block
        local_src = fn.slots(src, range(count), block)
        local_back = fn.slots(back, range(count), block)
        remote = fn.blocks([target.rows[0][0] + k * block for k in range(count)], block,
                           mem_type=target.mem_type, device=0)
        for op, local, key in (("WRITE", local_src, "write_gbps"), ("READ", local_back, "read_gbps")):
            times = []
            deadline = time.monotonic() + SELF_TEST_SECONDS / 2
            with fn.transfer(a, op, local, remote, peer, timeout=20) as t:
                while time.monotonic() < deadline or len(times) < 2:
                    times.append(t.repost().wait(20).seconds)
            out[key] = n / sorted(times)[len(times) // 2] / 1e9
        out["verified"] = bool(np.array_equal(np.frombuffer(back, np.uint8), data))
    finally:
        reg_a.close()
        reg_b.close()
        if gpu:
            _ferry.cuda_free(dst)
    out["settings"] = fn.settings(a).to_dict()
    return out


def _child_main() -> int:
    """`python -m ferry.doctor.nixl_check`: probe, choose, self-test; one JSON line."""
    from .. import ucx

    result: dict = {}
    p = ucx.probe()
    result["probe"] = p.to_dict()
    try:
        result["self_test"] = self_test()
    except Exception as e:  # reported in the doctor's report, not raised
        result["self_test"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result), flush=True)
    return 0


def run_child(timeout: float = CHILD_TIMEOUT) -> dict:
    """The child's JSON, or {"error": why}."""
    env = {**os.environ, "NIXL_LOG_LEVEL": os.environ.get("NIXL_LOG_LEVEL", "ERROR")}
    try:
        r = subprocess.run([sys.executable, "-m", "ferry.doctor.nixl_check"], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"the NIXL check did not finish within {timeout:g} s"}
    try:
        return json.loads((r.stdout.strip().splitlines() or [""])[-1])
    except ValueError:
        return {"error": (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]}


def check(quick: bool, gpus: int) -> dict:
    """The `nixl` measurement (see the module docstring)."""
    from .. import ucx

    out = installation()
    if not out["installed"]:
        return out
    if quick:
        probe = ucx.Probe(gpus=gpus, error="not probed in a --quick run")
        out["self_test"] = {"error": "skipped in a --quick run"}
    else:
        child = run_child()
        if "error" in child:
            probe = ucx.Probe(gpus=gpus, error=child["error"])
            out["self_test"] = {"error": child["error"]}
        else:
            p = child["probe"]
            probe = ucx.Probe(version=p["version"], library=p["library"], gpus=p["gpus"], error=p["error"],
                              transports={k: tuple(v) for k, v in p["transports"].items()})
            out["self_test"] = child["self_test"]
    settings = ucx.choose(probe, peers="any")
    out.update({"ucx_version": probe.version, "transports": probe.to_dict()["transports"],
                "probe_error": probe.error, "settings": settings.to_dict(),
                "warnings": [dict(w) for w in settings.warnings], "gpus": gpus})
    return out


if __name__ == "__main__":
    sys.exit(_child_main())
