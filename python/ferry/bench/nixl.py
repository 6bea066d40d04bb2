"""`ferry bench nixl`: NIXL transfers between a ferry pool and another process's GPU.

Two fresh processes per setting, on this machine: A holds a ferry PinnedPool
(blocks in order), B holds GPU memory (cudaMalloc; --memory host: a ferry Pool
buffer). READ: B pulls the blocks from A's pool; WRITE: A pushes them into B's
memory. Block sizes 64 KiB, 1 MiB and 2 MiB (a vLLM KV block), --total bytes
per transfer, one NIXL request per transfer (--split N: N). Two layouts of B's
slots: `adjacent` (block k in slot k: a KV offload of consecutive blocks;
ferry.nixl.post joins such descriptors, up to 2 MiB each by default,
--coalesce sets the cap, 0 turns it off) and `shuffled` (a seeded
permutation: nothing joins, every block is its own descriptor). --device/--peer-device
place A's pool and B's memory (each process sees both GPUs, its own first,
through CUDA_VISIBLE_DEVICES: indexes as nvidia-smi numbers them).

Settings compared in one run: `ferry` (ferry.nixl.agent: UCX transports and
options chosen for this machine) beside `nixl` (ferry.nixl.make_agent: NIXL's
own UCX defaults, what NIXL's examples give), the baseline; both post through
ferry.nixl.post, so coalescing applies to both. Every case is
verified: B's memory is poisoned before each case, then every block is
compared with A's bytes. GB/s = bytes of one transfer / median seconds (post to
done, --repeats timed transfers after one untimed).

Results are records {suite, case, params, metric, value, unit, baseline,
ratio}: value is ferry's GB/s, baseline NIXL's defaults', ratio value/baseline.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time

from ..units import fmt_bytes, parse_size
from .report import progress, table, write_json
from .suite import Suite, add_repeats, deprecated_alias

DEFAULT_SIZES = "64K,1M,2M"
LAYOUTS = ("adjacent", "shuffled")
SETTINGS = ("ferry", "nixl")  # measured, baseline
OPS = ("READ", "WRITE")
POISON = 0xA5


def parse_sizes(text: str) -> list[int]:
    """'64K,1M' -> [65536, 1048576]; InvalidArgumentError quoting a bad entry."""
    from ..errors import InvalidArgumentError

    sizes = []
    for item in text.split(","):
        try:
            size = parse_size(item.strip())
        except (ValueError, InvalidArgumentError):
            raise InvalidArgumentError(f"--sizes: {item.strip()!r} is not a size (e.g. 64K, 1M)") from None
        if size < 1:
            raise InvalidArgumentError(f"--sizes: {item.strip()!r} must be at least 1 byte")
        sizes.append(size)
    return sizes


def check_args(args) -> None:
    """Refuse bad arguments (InvalidArgumentError) before anything runs."""
    from ..errors import InvalidArgumentError

    args.size_list = parse_sizes(args.sizes)
    if args.total < 1:
        raise InvalidArgumentError(f"--total={args.total}: expected at least 1 byte")
    too_big = [s for s in args.size_list if s > args.total]
    if too_big:
        raise InvalidArgumentError(f"--sizes: {fmt_bytes(too_big[0])} is more than --total "
                                   f"({fmt_bytes(args.total)}): a transfer holds at least one block")
    if args.repeats < 1:
        raise InvalidArgumentError(f"--repeats={args.repeats}: expected at least 1")
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout={args.timeout:g}: expected seconds > 0")
    for op in args.ops.split(","):
        if op.strip().upper() not in OPS:
            raise InvalidArgumentError(f"--ops: {op.strip()!r}: expected READ and/or WRITE")
    args.op_list = [op.strip().upper() for op in args.ops.split(",")]
    for s in args.settings.split(","):
        if s.strip() not in SETTINGS:
            raise InvalidArgumentError(f"--settings: {s.strip()!r}: expected ferry and/or nixl")
    args.setting_list = [s.strip() for s in args.settings.split(",")]
    args.layout_list = [x.strip() for x in args.layouts.split(",")]
    for x in args.layout_list:
        if x not in LAYOUTS:
            raise InvalidArgumentError(f"--layouts: {x!r}: expected adjacent and/or shuffled")
    args.coalesce_bytes = None
    if args.coalesce is not None:  # a size, or 0/off: no joining
        text = str(args.coalesce).strip()
        try:
            args.coalesce_bytes = 0 if text.lower() in ("0", "off", "no") else parse_size(text)
        except (ValueError, InvalidArgumentError):
            raise InvalidArgumentError(f"--coalesce: {text!r} is not a size (e.g. 2M, or 0 for off)") from None
    if args.split < 1:
        raise InvalidArgumentError(f"--split={args.split}: expected at least 1 request per transfer")
    env, backend = {}, {}
    for what, items, out in (("--ucx", args.ucx, env), ("--backend", args.backend, backend)):
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise InvalidArgumentError(f"{what} {item!r}: expected KEY=VALUE")
            if what == "--ucx" and not key.startswith("UCX_"):
                key = "UCX_" + key
            out[key] = value
    if args.device < 0 or (args.peer_device is not None and args.peer_device < 0):
        raise InvalidArgumentError(f"--device={args.device}, --peer-device={args.peer_device}: GPU indexes are >= 0")
    two = (args.peer_device is not None and args.peer_device != args.device) or args.device != 0
    if args.memory == "host" and (two or args.device):
        raise InvalidArgumentError("--device/--peer-device need --memory gpu")
    args.tuning = {"env": env, "backend": backend, "split": args.split,
                   "coalesce": True if args.coalesce_bytes is None else args.coalesce_bytes,
                   "cma": {"auto": None, "yes": True, "no": False}[args.cma],
                   "gpus": (args.device, args.device if args.peer_device is None else args.peer_device) if two else None}


# ---- the two processes --------------------------------------------------------------


def pattern(seed: int, nbytes: int):
    """nbytes of seeded bytes (numpy uint8): what A's blocks hold."""
    import numpy as np

    words = np.random.default_rng(seed).integers(0, 1 << 63, size=(nbytes + 7) // 8, dtype=np.uint64)
    return words.view(np.uint8)[:nbytes]


def slot_order(seed: int, count: int, layout: str = "shuffled") -> list[int]:
    """B's slot for A's block k: k (adjacent), or a seeded shuffle (as KV blocks
    of many requests land)."""
    import numpy as np

    if layout == "adjacent":
        return list(range(count))
    return [int(i) for i in np.random.default_rng(seed + 1).permutation(count)]


def _make_agent(name: str, setting: str, tuning: dict):
    import ferry.nixl as fn

    params = {"UCX": tuning["backend"]} if tuning["backend"] else None
    if setting == "ferry":
        return fn.agent(name, peers="local", backend_params=params, cma=tuning["cma"])
    return fn.make_agent(name, backend_params=params)


class _Side:
    """One process's memory and agent: A (pool, "a") or B (GPU or host, "b")."""

    def __init__(self, role: str, setting: str, memory: str, total: int, tuning: dict):
        import ferry
        import ferry.nixl as fn

        self.role, self.memory, self.total = role, memory, total
        self.agent = _make_agent(f"bench-{role}", setting, tuning)
        self.keep = []
        if role == "a":
            pool = ferry.Pool() if memory == "host" else ferry.PinnedPool(device=0, target_bytes=total)
            if memory != "host":
                pool.wait_ready()
            self.buf = pool.alloc(total)
            self.base = self.buf.ptr
            self.reg = fn.register_pool(self.agent, pool)
            self.keep.append(pool)
        elif memory == "host":
            pool = ferry.Pool()
            self.buf = pool.alloc(total)
            self.base = self.buf.ptr
            self.reg = fn.register_pool(self.agent, pool)
            self.keep.append(pool)
        else:
            from .. import _ferry

            self.base = _ferry.cuda_malloc(total)
            self.reg = fn.register(self.agent, fn.descs(self.base, total, mem_type="VRAM", device=0))
        self.mem_type = "VRAM" if (role == "b" and memory != "host") else "DRAM"
        self.peer = None

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def connect(self, metadata: bytes) -> None:
        import ferry.nixl as fn

        self.peer = fn.add_remote(self.agent, metadata)

    def host_view(self, nbytes: int):
        """This side's first nbytes as a numpy array on the host (a copy for GPU memory)."""
        import numpy as np

        if self.mem_type == "DRAM":
            return np.frombuffer(self.buf, np.uint8)[:nbytes]
        import ferry

        out = np.empty(nbytes, np.uint8)
        ferry.copy(out, self.base, nbytes, device=0)
        return out

    def fill(self, data) -> None:
        import numpy as np

        if self.mem_type == "DRAM":
            np.frombuffer(self.buf, np.uint8)[: len(data)] = data
        else:
            import ferry

            ferry.copy(self.base, np.ascontiguousarray(data), len(data), device=0)

    def close(self) -> None:
        self.reg.close()
        if self.mem_type == "VRAM":
            from .. import _ferry

            _ferry.cuda_free(self.base)
        else:
            self.buf.release()


def _blocks(addresses: list[int], block: int, mem_type: str):
    import ferry.nixl as fn

    return fn.blocks(addresses, block, mem_type=mem_type, device=0)


def _timed(side: _Side, op: str, local, remote, iters: int, timeout: float, split: int, coalesce) -> dict:
    import ferry.nixl as fn

    t = fn.transfer(side.agent, op, local, remote, side.peer, timeout=timeout, split=split, coalesce=coalesce)
    try:
        first = t.seconds
        times = [_spin(t.repost(), timeout).seconds for _ in range(iters)]
        posted = t.posted
    finally:
        t.release()
    return {"first_seconds": first, "seconds": times, "descriptors": posted}


def _spin(t, timeout: float):
    """Wait for `t` polling without sleeping: a 128 MiB transfer at 40 GB/s takes
    3 ms, and Transfer.wait's back-off (sleeps up to 1 ms) would blur it."""
    import ferry.nixl as fn

    deadline = time.perf_counter() + timeout
    while not t.done:
        if time.perf_counter() > deadline:
            raise fn.NixlTimeoutError(f"{t.op} of {t.nbytes} bytes not done after {timeout:g} s")
    return t


def _serve(conn, role: str, setting: str, memory: str, total: int, iters: int, timeout: float, seed: int,
           tuning: dict):
    """A child's loop: answers the parent's commands on `conn` until "quit".
    tuning: {"env": UCX_* for this process, "backend": UCX backend params,
    "cma": agent(cma=...), "split": requests per transfer}."""
    import os

    import numpy as np

    os.environ.update(tuning["env"])  # before NIXL and UCX start in this process
    if tuning["gpus"] is not None:  # both GPUs visible to both (cuda_ipc opens the peer's), this role's first
        mine, theirs = tuning["gpus"] if role == "a" else tuning["gpus"][::-1]
        os.environ["CUDA_VISIBLE_DEVICES"] = str(mine) if mine == theirs else f"{mine},{theirs}"
    side = None
    try:
        side = _Side(role, setting, memory, total, tuning)
        conn.send(("ready", side.metadata(), side.base))
        while True:
            cmd, *rest = conn.recv()
            if cmd == "quit":
                break
            if cmd == "connect":
                side.connect(rest[0])
                conn.send(("ok",))
            elif cmd == "prepare":  # (block, peer base): A fills its blocks, B poisons its slots
                block, _ = rest
                count = total // block
                if role == "a":
                    side.fill(pattern(seed + block, count * block))
                else:
                    side.fill(np.full(total, POISON, np.uint8))
                conn.send(("ok",))
            elif cmd == "transfer":  # (op, block, layout, peer base): the initiator times op
                op, block, layout, peer_base = rest
                count = total // block
                order = slot_order(seed + block, count, layout)
                a_addr = [(side.base if role == "a" else peer_base) + k * block for k in range(count)]
                b_addr = [(side.base if role == "b" else peer_base) + order[k] * block for k in range(count)]
                mine, theirs = (a_addr, b_addr) if role == "a" else (b_addr, a_addr)
                local = _blocks(mine, block, side.mem_type)
                remote = _blocks(theirs, block, "VRAM" if (role == "a" and memory != "host") else "DRAM")
                conn.send(("ok", _timed(side, op, local, remote, iters, timeout, tuning["split"],
                                        tuning["coalesce"])))
            elif cmd == "verify":  # B: every block in its slot, nothing else touched
                block, layout = rest
                count = total // block
                order = slot_order(seed + block, count, layout)
                got = side.host_view(total)
                expected = pattern(seed + block, count * block).reshape(count, block)
                slots = got[: count * block].reshape(count, block)
                bad = next((k for k in range(count) if not np.array_equal(slots[order[k]], expected[k])), None)
                tail_ok = bool((got[count * block:] == POISON).all())
                problem = None if bad is None and tail_ok else (
                    f"block {bad} (slot {order[bad]}) differs" if bad is not None else "bytes past the blocks changed")
                conn.send(("ok", problem))
    except Exception as e:  # the parent reports it; the child ends
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        if side is not None:
            try:
                side.close()
            except Exception:
                pass


class _Pair:
    """A and B for one setting: two spawned processes driven over pipes."""

    def __init__(self, setting: str, args):
        ctx = multiprocessing.get_context("spawn")
        self.timeout = args.timeout
        self.conns, self.procs = {}, {}
        for role in ("a", "b"):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(child, role, setting, args.memory, args.total, args.repeats,
                                                 args.timeout, args.seed, args.tuning), daemon=True)
            p.start()
            self.conns[role], self.procs[role] = parent, p
        ready = {role: self.ask(role, None) for role in ("a", "b")}
        self.base = {role: r[2] for role, r in ready.items()}
        self.ask("a", ("connect", ready["b"][1]))
        self.ask("b", ("connect", ready["a"][1]))

    def ask(self, role: str, message, limit: float | None = None):
        from ..nixl import NixlError, NixlTimeoutError

        conn = self.conns[role]
        if message is not None:
            conn.send(message)
        if not conn.poll(limit or 3 * self.timeout + 60):
            raise NixlTimeoutError(f"bench process {role.upper()} did not answer within "
                                   f"{limit or 3 * self.timeout + 60:g} s")
        reply = conn.recv()
        if reply[0] == "error":
            raise NixlError(f"bench process {role.upper()}: {reply[1]}")
        return reply

    def case(self, op: str, block: int, layout: str = "shuffled") -> dict:
        self.ask("a", ("prepare", block, 0))
        self.ask("b", ("prepare", block, 0))
        initiator, other = ("b", "a") if op == "READ" else ("a", "b")
        timing = self.ask(initiator, ("transfer", op, block, layout, self.base[other]))[1]
        problem = self.ask("b", ("verify", block, layout))[1]
        return {**timing, "verified": problem is None, "problem": problem}

    def close(self) -> None:
        for role, conn in self.conns.items():
            try:
                conn.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def measure(args) -> list[dict]:
    """Rows {setting, layout, op, block_bytes, blocks, descriptors, bytes, gbps, best_gbps, verified, ...}."""
    rows = []
    for setting in args.setting_list:
        progress(f"{setting}: starting two processes")
        pair = _Pair(setting, args)
        try:
            for layout in args.layout_list:
                for block in args.size_list:
                    for op in args.op_list:
                        count = args.total // block
                        progress(f"{setting}: {op} of {count} {layout} blocks of {fmt_bytes(block)}")
                        r = pair.case(op, block, layout)
                        nbytes = count * block
                        r.update({"setting": setting, "layout": layout, "op": op, "block_bytes": block,
                                  "blocks": count, "bytes": nbytes,
                                  "gbps": nbytes / statistics.median(r["seconds"]) / 1e9,
                                  "best_gbps": nbytes / min(r["seconds"]) / 1e9})
                        rows.append(r)
        finally:
            pair.close()
    return rows


def records(rows: list[dict], memory: str) -> list[dict]:
    """The common result shape: one record per (layout, op, block size),
    ferry's GB/s beside NIXL's defaults'."""
    out = []
    by = {(r["setting"], r.get("layout", "shuffled"), r["op"], r["block_bytes"]): r for r in rows}
    for (setting, layout, op, block), r in by.items():
        if setting != "ferry" and ("ferry", layout, op, block) in by:
            continue  # the baseline appears as a record's baseline
        base = by.get(("nixl", layout, op, block)) if setting == "ferry" else None
        value = r["gbps"]
        baseline = base["gbps"] if base else None
        out.append({"suite": "nixl", "case": f"{op.lower()} {fmt_bytes(block)} {layout}",
                    "params": {"op": op, "block_bytes": block, "layout": layout, "blocks": r["blocks"],
                               "descriptors": r.get("descriptors", r["blocks"]), "bytes": r["bytes"],
                               "memory": memory, "setting": setting,
                               "verified": r["verified"] and (base is None or base["verified"])},
                    "metric": "bandwidth", "value": value, "unit": "GB/s", "baseline": baseline,
                    "ratio": value / baseline if baseline else None})
    return out


class NixlSuite(Suite):
    key = "nixl"
    description = "NIXL READ/WRITE, ferry pool <-> another process's GPU: ferry.nixl.agent vs NIXL's defaults"

    def add_arguments(self, p):
        p.add_argument("--sizes", default=DEFAULT_SIZES, help="block sizes (default: %(default)s)")
        p.add_argument("--total", type=parse_size, default=parse_size("256M"),
                       help="bytes per transfer; blocks = total / size (default: 256M)")
        p.add_argument("--ops", default="READ,WRITE", help="READ and/or WRITE (default: %(default)s)")
        p.add_argument("--settings", default=",".join(SETTINGS),
                       help="ferry (ferry.nixl.agent) and/or nixl (NIXL's defaults) (default: %(default)s)")
        add_repeats(p, 5, "timed transfers per case", old=("--iters",), lo=-2**31)
        p.add_argument("--memory", choices=("gpu", "host"), default="gpu",
                       help="B's memory: gpu or host (a ferry Pool: no GPU needed) (default: %(default)s)")
        p.add_argument("--timeout", type=float, default=60.0, help="seconds per transfer (default: %(default)s)")
        p.add_argument("--layouts", default=",".join(LAYOUTS),
                       help="B's slots: adjacent (block k in slot k) and/or shuffled (default: %(default)s)")
        p.add_argument("--coalesce", default=None, metavar="SIZE",
                       help="cap on a descriptor ferry.nixl.post joins from adjacent ones (default: its own, "
                            "2M; 0: off)")
        p.add_argument("--split", type=int, default=1,
                       help="NIXL requests each transfer is posted as, ferry.nixl.post split= (default: %(default)s)")
        p.add_argument("--ucx", action="append", default=[], metavar="KEY=VALUE",
                       help="a UCX_* variable for both processes (the user's: it wins over ferry's choice; "
                            "repeatable), e.g. RNDV_FRAG_SIZE=host:4M or PROTO_INFO=y")
        p.add_argument("--backend", action="append", default=[], metavar="KEY=VALUE",
                       help="a UCX backend parameter for both agents (repeatable), e.g. num_threads=4")
        p.add_argument("--cma", choices=("auto", "yes", "no"), default="auto",
                       help="ferry.nixl.agent's cma switch; auto: off where CUDA transports start (default: %(default)s)")
        p.add_argument("--device", type=int, default=0, metavar="N",
                       help="A's GPU (its pinned pool's device) (default: %(default)s)")
        deprecated_alias(p, "--gpu", "--device", "device", type=int)
        p.add_argument("--peer-device", type=int, default=None, metavar="N",
                       help="B's GPU (default: A's; another one measures GPU -> GPU hosts with two)")
        deprecated_alias(p, "--peer-gpu", "--peer-device", "peer_device", type=int)
        p.add_argument("--seed", type=int, default=1234, help="the blocks' generator seed (default: %(default)s)")

    def check_args(self, args) -> None:
        check_args(args)  # bad arguments fail here, on any machine, before the waived check

    def waived(self, args):
        from .. import nixl

        if not nixl.available():
            return f"needs NIXL: {nixl.unavailable_reason()}"
        if args.memory == "host":
            return None
        return super().waived(args)

    def run(self, args) -> int:
        check_args(args)
        start = time.monotonic()
        rows = measure(args)
        recs = records(rows, args.memory)
        cells = []
        for rec in recs:
            p = rec["params"]
            cells.append([p["layout"], p["op"], fmt_bytes(p["block_bytes"]), p["blocks"], p["descriptors"],
                          rec["value"], rec["baseline"], rec["ratio"], "yes" if p["verified"] else "NO"])
        print(table(f"NIXL transfers, A's ferry pool <-> B's {'GPU' if args.memory == 'gpu' else 'host memory'}, "
                    f"{fmt_bytes(args.total)} per transfer (GB/s, median of {args.repeats})",
                    ["layout", "op", "block", "blocks", "posted", "ferry.nixl.agent", "NIXL defaults", "ratio",
                     "verified"], cells))
        print(f"[{time.monotonic() - start:.1f} s]")
        write_json(args.json, self.key, recs, details={"rows": rows})
        return 0 if all(r["verified"] for r in rows) else 1


SUITE = NixlSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
