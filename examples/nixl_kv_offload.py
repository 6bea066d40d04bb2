#!/usr/bin/env python3
"""KV cache blocks from one process's GPU, through its ferry pinned pool and
NIXL, into another process's GPU, verified bit for bit, with GB/s.

Two processes on this machine, started by this script (each is this script
with --role):

  offloader (A)  keeps a KV cache on its GPU: --gpu-blocks blocks of
                 --block-bytes random bytes (a seeded generator). It offloads
                 --blocks of them, in a shuffled order, into one buffer of a
                 ferry PinnedPool (ferry.copy_many, device -> pinned host),
                 registers the pool with a NIXL agent and publishes the agent's
                 metadata and where each block lies, in a file.
  puller (B)     keeps its own KV cache tensor on its GPU (poisoned), registers
                 it with its agent as VRAM, loads A's metadata and pulls the
                 blocks (NIXL READ, --mode read) into the same block slots; or
                 publishes its own metadata and A pushes them (NIXL WRITE,
                 --mode write). B checks every transferred block against the
                 generator's bytes and every other block for the poison.

The transfer is timed --iters times after a verified first one (post to done,
one NIXL request for all blocks); the median and best GB/s are printed, and
with --json written to a file. --device cpu does the same with host memory
only (ferry Pool buffers on both sides, no GPU, no torch): what CI runs.

Both agents come from ferry.nixl.agent (UCX settings chosen for this machine;
B prints what was chosen) unless --agent nixl asks for NIXL's defaults.
--ucx-tls sets UCX_TLS for both processes, --ucx KEY=VALUE any other UCX_*
variable: the user's settings, they win over ferry's choice (docs/nixl.md, "Several
nodes: ferry memory on NIXL", says which settings matter). Needs `pip install
'ferry[nixl]'`.

  python examples/nixl_kv_offload.py --blocks 1024 --block-bytes 1MiB
  python examples/nixl_kv_offload.py --mode write --ucx-tls cuda_copy,cuda_ipc,sm,self
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import ferry
import ferry.nixl as fn
from ferry.units import fmt_bytes, parse_size

POISON = 0xA5


def kv_bytes(seed: int, nbytes: int):
    """The KV cache's content: nbytes from a seeded generator (numpy uint8)."""
    import numpy as np

    return np.frombuffer(np.random.default_rng(seed).bytes(nbytes), dtype=np.uint8)


def offloaded_ids(args) -> list[int]:
    """Which GPU blocks are offloaded, in pool slot order (a seeded shuffle)."""
    import numpy as np

    order = np.random.default_rng(args.seed + 1).permutation(args.gpu_blocks)
    return [int(i) for i in order[: args.blocks]]


def say(role: str, text: str) -> None:
    print(f"[{role}] {text}", flush=True)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def make_agent(name: str, args):
    """A NIXL agent with UCX: ferry.nixl.agent (UCX settings chosen for this
    machine; --agent ferry) or NIXL's defaults (--agent nixl). --ucx-tls, --ucx
    and --ucx-error-handling are the user's settings: they win either way."""
    params = {"UCX": {"ucx_error_handling_mode": args.ucx_error_handling}} if args.ucx_error_handling else None
    if args.agent == "nixl":
        return fn.make_agent(name, backend_params=params)
    agent = fn.agent(name, peers="local", backend_params=params)
    if args.role == "puller":
        say("B", fn.settings(agent).describe())
    return agent


def timed_transfers(agent, op, local, remote, peer, args) -> dict:
    """One verified-size transfer, then --iters timed ones; their figures."""
    t = fn.transfer(agent, op, local, remote, peer, timeout=args.timeout, split=args.split)
    try:
        first = t.seconds
        backend = t.backend
        times = []
        for _ in range(args.iters):
            times.append(t.repost().wait(args.timeout).seconds)
    finally:
        t.release()
    nbytes = local.nbytes
    median = statistics.median(times) if times else first
    return {"op": op, "bytes": nbytes, "descriptors": len(local), "backend": backend, "split": args.split,
            "first_seconds": first, "seconds": times, "median_gbps": gbps(nbytes, median),
            "best_gbps": gbps(nbytes, min(times)) if times else gbps(nbytes, first),
            "first_gbps": gbps(nbytes, first)}


# ---- A: the offloader --------------------------------------------------------------


def offload(args, pool, ids):
    """The KV cache made, and the `ids` blocks copied into one pool buffer (slot k
    holds block ids[k]). Returns (buffer, the cache, seconds of the offload)."""
    bb = args.block_bytes
    content = kv_bytes(args.seed, args.gpu_blocks * bb)
    buf = pool.alloc(len(ids) * bb)
    if args.device == "cpu":
        import numpy as np

        cache = content.reshape(args.gpu_blocks, bb)
        start = time.perf_counter()
        np.frombuffer(buf, np.uint8).reshape(len(ids), bb)[:] = cache[ids]
        return buf, cache, time.perf_counter() - start
    import torch

    cache = torch.from_numpy(content.copy()).reshape(args.gpu_blocks, bb).to(f"cuda:{args.gpu}")
    torch.cuda.synchronize(args.gpu)
    dsts = [buf.ptr + k * bb for k in range(len(ids))]
    srcs = [cache.data_ptr() + i * bb for i in ids]
    ferry.copy_many(dsts, srcs, [bb] * len(ids), device=args.gpu)  # the first call starts the copy engine
    start = time.perf_counter()
    ferry.copy_many(dsts, srcs, [bb] * len(ids), device=args.gpu)  # timed: the same blocks again
    return buf, cache, time.perf_counter() - start


def run_offloader(args, exchange: pathlib.Path) -> int:
    role = "A"
    ids = offloaded_ids(args)
    total = len(ids) * args.block_bytes
    pool = ferry.Pool() if args.device == "cpu" else ferry.PinnedPool(device=args.gpu, target_bytes=total)
    if args.device != "cpu":
        pool.wait_ready()
    buf, cache, seconds = offload(args, pool, ids)
    say(role, f"offloaded {len(ids)} blocks of {fmt_bytes(args.block_bytes)} ({fmt_bytes(total)}) "
              f"{'GPU ' + str(args.gpu) + ' -> pinned pool' if args.device != 'cpu' else 'into a ferry Pool'}"
              f" in {seconds * 1e3:.1f} ms ({gbps(total, seconds):.1f} GB/s)")
    agent = make_agent("offloader", args)
    with fn.register_pool(agent, pool) as registration:
        say(role, f"pool registered with NIXL: {len(registration.regions)} chunk(s)")
        where = fn.slots(buf, range(len(ids)), args.block_bytes)
        fn.publish_metadata(agent, exchange / "offloader.json", {"blocks": where.to_dict(), "ids": ids})
        if args.mode == "write":
            peer, extra = fn.load_metadata(agent, exchange / "puller.json", args.timeout)
            remote = fn.Descs.from_dict(extra["slots"])
            result = timed_transfers(agent, "WRITE", where, remote, peer, args)
            _write_json(exchange / "result.json", result)
            (exchange / "written").touch()
        _wait_for(exchange / "verified", args.timeout, "the puller's verification")
    del cache
    return 0


# ---- B: the puller -----------------------------------------------------------------


def destination(args):
    """B's KV cache (poisoned) and what to register: a CUDA tensor (VRAM), or a
    ferry Pool buffer for --device cpu. Returns (cache, slots source, keepalive)."""
    bb = args.block_bytes
    if args.device == "cpu":
        import numpy as np

        pool = ferry.Pool()
        buf = pool.alloc(args.gpu_blocks * bb)
        view = np.frombuffer(buf, np.uint8).reshape(args.gpu_blocks, bb)
        view[:] = POISON
        return view, buf, pool
    import torch

    cache = torch.full((args.gpu_blocks, bb), POISON, dtype=torch.uint8, device=f"cuda:{args.peer_gpu}")
    torch.cuda.synchronize(args.peer_gpu)
    return cache, cache, None


def verify(args, cache, ids) -> str | None:
    """None if the blocks `ids` hold the generator's bytes and every other block the poison."""
    import numpy as np

    bb = args.block_bytes
    got = cache if args.device == "cpu" else cache.cpu().numpy()
    expected = kv_bytes(args.seed, args.gpu_blocks * bb).reshape(args.gpu_blocks, bb)
    if not np.array_equal(got[ids], expected[ids]):
        for k, i in enumerate(ids):
            if not np.array_equal(got[i], expected[i]):
                bad = int(np.flatnonzero(got[i] != expected[i])[0])
                return f"block {i} (slot {k}) differs first at byte {bad}: {got[i][bad]} != {expected[i][bad]}"
    untouched = np.ones(args.gpu_blocks, dtype=bool)
    untouched[ids] = False
    others = got[untouched]
    if others.size and not (others == POISON).all():
        return "a block that was not transferred changed"
    return None


def run_puller(args, exchange: pathlib.Path) -> int:
    role = "B"
    cache, target, keepalive = destination(args)
    agent = make_agent("puller", args)
    if args.device == "cpu":
        registration = fn.register_pool(agent, keepalive)
    else:
        registration = fn.register(agent, target)
    with registration:
        peer, extra = fn.load_metadata(agent, exchange / "offloader.json", args.timeout)
        ids = extra["ids"]
        remote = fn.Descs.from_dict(extra["blocks"])
        local = fn.slots(target, ids, args.block_bytes)
        if args.mode == "read":
            result = timed_transfers(agent, "READ", local, remote, peer, args)
        else:
            fn.publish_metadata(agent, exchange / "puller.json", {"slots": local.to_dict()})
            _wait_for(exchange / "written", args.timeout, "the offloader's writes")
            result = json.loads((exchange / "result.json").read_text())
        if args.device != "cpu":
            import torch

            torch.cuda.synchronize(args.peer_gpu)
        problem = verify(args, cache, ids)
        result["verified"] = problem is None
        _write_json(exchange / "result.json", result)
        (exchange / "verified").touch()
    if problem:
        say(role, f"VERIFY FAILED: {problem}")
        return 1
    say(role, f"{len(ids)} blocks verified bit for bit; the other {args.gpu_blocks - len(ids)} kept the poison")
    return 0


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _wait_for(path: pathlib.Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise fn.NixlTimeoutError(f"{what} did not come within {timeout:g} s ({path} is missing)")
        time.sleep(0.005)


# ---- the launcher ------------------------------------------------------------------


def child_env(args) -> dict:
    env = dict(os.environ)
    env.setdefault("NIXL_LOG_LEVEL", "WARN")  # NIXL's Python layer logs every agent at INFO
    if args.ucx_tls:
        env["UCX_TLS"] = args.ucx_tls
    for setting in args.ucx:
        key, _, value = setting.partition("=")
        key = key if key.startswith("UCX_") else "UCX_" + key
        env[key] = value
    return env


def supervise(children: list, limit: float) -> list:
    """Wait for the children; once one fails (or `limit` s pass) kill the others
    (the peer would wait for it). Exit codes, None for a killed child."""
    deadline = time.monotonic() + limit
    while None in [c.poll() for c in children]:  # poll every child, each time
        failed = any(c.returncode not in (None, 0) for c in children)
        if failed or time.monotonic() > deadline:
            for c in children:
                if c.poll() is None:
                    c.send_signal(signal.SIGKILL)
                    c.wait()
                    c.returncode = None
            break
        time.sleep(0.05)
    return [c.returncode for c in children]


def launch(args, argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="ferry-nixl-") as tmp:
        exchange = pathlib.Path(tmp)
        env = child_env(args)
        ucx = {k: v for k, v in env.items() if k.startswith("UCX_")}
        print(f"{args.mode}: {args.blocks} of {args.gpu_blocks} blocks of {fmt_bytes(args.block_bytes)}, "
              f"device {args.device}; agent {args.agent}; user UCX settings: {ucx or 'none'}, error handling "
              f"{args.ucx_error_handling or 'not set'}", flush=True)
        base = [sys.executable, os.path.abspath(__file__), *argv, "--exchange", str(exchange)]
        children = [subprocess.Popen([*base, "--role", role], env=env) for role in ("offloader", "puller")]
        codes = supervise(children, 3 * args.timeout + 60)
        result_path = exchange / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
    result.update({"mode": args.mode, "device": args.device, "block_bytes": args.block_bytes, "agent": args.agent,
                   "blocks": args.blocks, "ucx": ucx, "ucx_error_handling": args.ucx_error_handling,
                   "exit_codes": codes})
    ok = codes == [0, 0] and result.get("verified") is True
    if "median_gbps" in result:
        print(f"{result['op']} {fmt_bytes(result['bytes'])} in {result['descriptors']} descriptors "
              f"(backend {result['backend']}): median {result['median_gbps']:.2f} GB/s, best "
              f"{result['best_gbps']:.2f}, first {result['first_gbps']:.2f} (of {len(result['seconds'])} timed); "
              f"{'verified' if result.get('verified') else 'NOT VERIFIED'}", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not ok:
        print(f"FAILED: exit codes {codes} (offloader, puller; None = killed after the time limit)", flush=True)
    return 0 if ok else 1


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--block-bytes", type=parse_size, default=parse_size("1MiB"),
                   help="bytes per KV block (default 1MiB; K/M/G suffixes)")
    p.add_argument("--blocks", type=int, default=1024, help="blocks offloaded and transferred (default 1024)")
    p.add_argument("--gpu-blocks", type=int, default=None,
                   help="blocks in each KV cache (default: blocks + blocks/4)")
    p.add_argument("--mode", choices=("read", "write"), default="read",
                   help="read: B pulls from A's pool (default); write: A pushes into B's GPU")
    p.add_argument("--iters", type=int, default=5, help="timed transfers after the first (default 5)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: KV caches on GPUs (default); cpu: host memory only, no torch")
    p.add_argument("--gpu", type=int, default=0, help="A's GPU (default 0)")
    p.add_argument("--peer-gpu", type=int, default=None, help="B's GPU (default: A's)")
    p.add_argument("--ucx-tls", default=None, help="UCX_TLS for both processes, e.g. cuda_copy,cuda_ipc,sm,self")
    p.add_argument("--ucx", action="append", default=[], metavar="KEY=VALUE",
                   help="another UCX setting for both processes, e.g. RNDV_THRESH=8192 (repeatable)")
    p.add_argument("--ucx-error-handling", choices=("peer", "none"), default=None,
                   help="the UCX backend's endpoint error handling (NIXL's default: peer, which rules out "
                        "shared-memory and cuda_ipc lanes that cannot report a dead peer; none allows them)")
    p.add_argument("--agent", choices=("ferry", "nixl"), default="ferry",
                   help="ferry: ferry.nixl.agent, UCX settings chosen for this machine (default); nixl: NIXL's "
                        "own defaults")
    p.add_argument("--split", type=int, default=1, help="NIXL requests each transfer is posted as (default 1)")
    p.add_argument("--seed", type=int, default=1234, help="the KV cache generator's seed")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any one wait may take (default 120)")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--role", choices=("offloader", "puller"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--exchange", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.split < 1:
        p.error(f"--split ({args.split}) must be at least 1")
    if args.blocks < 1 or args.block_bytes < 1:
        p.error(f"--blocks ({args.blocks}) and --block-bytes ({args.block_bytes}) must be at least 1")
    if args.gpu_blocks is None:
        args.gpu_blocks = args.blocks + args.blocks // 4
    if args.gpu_blocks < args.blocks:
        p.error(f"--gpu-blocks ({args.gpu_blocks}) must be at least --blocks ({args.blocks})")
    if args.peer_gpu is None:
        args.peer_gpu = args.gpu
    if any(not s.partition("=")[1] for s in args.ucx):
        p.error(f"--ucx takes KEY=VALUE, got {args.ucx}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.role is None:
        if not fn.available():
            print(fn.unavailable_reason(), file=sys.stderr)
            return 2
        return launch(args, argv)
    exchange = pathlib.Path(args.exchange)
    try:
        return run_offloader(args, exchange) if args.role == "offloader" else run_puller(args, exchange)
    except ferry.FerryError as e:
        say("A" if args.role == "offloader" else "B", f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
