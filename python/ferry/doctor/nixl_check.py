"""The NIXL part of `ferry doctor`: where NIXL is installed, the UCX it runs on,
the transports that start, the settings ferry.nixl.agent picks (and the user's
UCX settings that override them), and a short self-test: a ferry pool's blocks
moved into another process's GPU memory (host memory where there is no GPU)
between two agents with those settings, both ways, verified.

Everything that loads NIXL or UCX runs in one child process with a time limit
(`python -m ferry.doctor.nixl_check`, printing one JSON line): the doctor's own
process stays free of UCX's threads and memory hooks, and a hung UCX costs at
most CHILD_TIMEOUT. `--quick` runs no child: installation and the environment
check only.

Measurement key `nixl` (a dict): installed, module, version, location, reason
(why not installed); ucx_version, transports ({name: [devices]}), settings
(ferry.nixl.ucx.Settings.to_dict()), warnings (the user's slow settings, each
{setting, problem, fix}: the rule nixl-ucx-slow-settings reads them);
self_test: {memory, bytes, write_gbps, read_gbps, verified, error}.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

CHILD_TIMEOUT = 60.0  # seconds: the probe, two agent processes and their transfers take 3-10 s
SELF_TEST_BYTES = 32 << 20
SELF_TEST_BLOCK = 1 << 20
SELF_TEST_ITERS = 8


def installation() -> dict:
    """{"installed", "module", "version", "location"} or {"installed": False,
    "reason"}: from the import system's search, without importing NIXL."""
    from ..nixl import ucx
    from ..nixl.library import INSTALL_HINT

    for name, spec in ucx.nixl_module_specs():
        dist = name.replace("_", "-")
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"installed": True, "module": name, "version": version,
                "location": os.path.dirname(spec.origin)}
    return {"installed": False, "reason": f"NIXL is not installed ({INSTALL_HINT})"}


def self_test() -> dict:
    """Two processes (ferry bench nixl's pair, each with an agent made by
    ferry.nixl.agent for local peers): A's pool holds SELF_TEST_BYTES in
    SELF_TEST_BLOCK blocks, B's GPU memory (host memory where there is no GPU)
    receives them in shuffled slots: WRITE pushed by A, then READ pulled by B,
    SELF_TEST_ITERS timed transfers each after one untimed, every block
    verified. Two processes because UCX's cuda_ipc refuses a peer in the same
    process: agents in one process measure a fallback at ~1 GB/s (the
    2026-11-24 H200 run: 0.86 / 0.73), not the link."""
    import argparse
    import statistics

    from .. import _ferry, measure
    from ..bench import nixl as bench
    from ..nixl import ucx

    gpu = measure.gpu_absent_reason(_ferry.cuda_info()) is None
    n, block = SELF_TEST_BYTES, SELF_TEST_BLOCK
    args = argparse.Namespace(memory="gpu" if gpu else "host", total=n, repeats=SELF_TEST_ITERS, timeout=20.0,
                              seed=7, tuning={"env": {}, "backend": {}, "split": 1, "coalesce": True, "cma": None,
                                              "gpus": None})
    out = {"memory": "pinned pool -> another process's GPU" if gpu else
           "pool -> another process's host memory (no GPU)", "bytes": n, "block_bytes": block}
    pair = bench._Pair("ferry", args)
    verified = True
    try:
        for op, key in (("WRITE", "write_gbps"), ("READ", "read_gbps")):
            r = pair.case(op, block, "shuffled")
            out[key] = n / statistics.median(r["seconds"]) / 1e9
            verified = verified and r["verified"]
    finally:
        pair.close()
    out["verified"] = verified
    out["settings"] = ucx.choose(ucx.probe(), peers="local").to_dict()
    return out


def _child_main() -> int:
    """`python -m ferry.doctor.nixl_check`: probe, choose, self-test; one JSON line."""
    from ..nixl import ucx

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
    from ..nixl import ucx

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
