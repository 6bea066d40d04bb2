"""`ferry bench node`: one node pool shared by every rank (ferry.node) beside each
rank on its own (today's ferry) and beside NIXL, in one run.

The suite spawns --ranks processes (rank i uses GPU i % the GPU count; ranks
that share a GPU are said so in the output and the records) and measures:

(a) attach: every rank, at once, attaches to one NodePool and registers a
    --bytes region of it with its GPU (seconds per rank), beside every rank
    making its own ferry.PinnedPool(target_bytes=--bytes); with the host memory
    each way used (the drop of MemAvailable in /proc/meminfo while the ranks hold
    it: the pool's pages exist once, the pinned pools' once per rank).
(b) DMA: every rank, at once, copies --dma-bytes host->device and back between
    its GPU and its part of the shared region, beside its own pinned buffer (GB/s
    per rank, median of --repeats).
(c) KV handoff: rank 0's GPU -> rank 1's GPU through a ferry.node.Handoff
    (--slots slots of --slot-bytes; one batched copy per slot), each case on
    each of --handoff-routes: "pool" (through the node pool's pinned slots) and
    "auto" (GPU to GPU through the consumer's device ring where the GPUs reach
    each other, else the pool: the route that ran is printed; its copies by an
    SM kernel on --peer-sms SMs, 0: copy engines). Cases: blocks of
    each --blocks size (--handoff-bytes per transfer) and --mixed-blocks blocks
    of mixed sizes (64 KiB-2 MiB, log-uniform) at shuffled places on both GPUs;
    end to end (rank 1's time from the start to its last block in place), every
    block checked. Beside, for the same bytes: a torch `.to()` of one tensor
    from GPU 0 to GPU 1 (a contiguous peer copy), the host path a rank takes
    without the handoff (GPU 0 -> pinned host -> GPU 1, ferry.copy_many each
    way, in one process), and ferry.nixl (`ferry bench nixl`'s own code: a
    WRITE of the same uniform blocks from a ferry pinned pool to another
    process's GPU) where NIXL is installed.
(d) with --checkpoint PATH: load_safetensors on every rank at once, with
    node= (the shared pool) and without, page cache warm (an untimed load first),
    and rank 0 alone; then, where the page cache can be dropped (root; not with
    --no-cold), every rank at once with and without node=, cold.

The issue's targets (issue 33) are printed with met / missed. Records: suite
"node", value ferry's figure, baseline today's (or NIXL's), ratio value/baseline.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import statistics
import sys
import time

from ..units import fmt_bytes, parse_size, parse_size_list
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, choices_list, int_at_least, size, size_list

PARTS = ("attach", "dma", "handoff", "load")
GB = 1e9

# issue 33's targets: (part, what, check on the measured figures)
TARGET_ATTACH_S = 0.5
TARGET_DMA_RATIO = 0.9
TARGET_HANDOFF_GBPS = 48.0  # 2 MiB blocks, through the pool (issue 39)
TARGET_HANDOFF_MIXED_GBPS = 45.0  # mixed 64 KiB-2 MiB blocks, through the pool (issue 39)
TARGET_HANDOFF_PEER_RATIO = 0.8  # mixed blocks GPU to GPU / torch .to() of the same bytes (issue 39)
HANDOFF_ROUTES = ("pool", "auto")
TARGET_NIXL_RATIO = 2.0  # 64 KiB blocks
TARGET_COLD_RATIO = 0.6  # node= time / each rank alone, page cache dropped
TARGET_WARM_RATIO = 1.6  # all ranks' GB/s with node= / one rank alone, warm
TARGET_WARM_VS_ALONE = 1.0  # node= time / each rank alone, page cache warm (issue 39: never slower)


def check_args(args) -> None:
    """Refuse arguments that argparse's types cannot (InvalidArgumentError), on any machine."""
    from ..errors import InvalidArgumentError

    args.nbytes, args.dma_nbytes = parse_size(args.bytes), parse_size(args.dma_bytes)
    args.handoff_nbytes, args.slot_nbytes = parse_size(args.handoff_bytes), parse_size(args.slot_bytes)
    args.peer_slot_nbytes = parse_size(args.peer_slot_bytes)
    args.block_list = parse_size_list(args.blocks)
    args.part_list = [p for p in args.parts.split(",") if p]
    args.route_list = [r for r in args.handoff_routes.split(",") if r]
    if args.mixed_blocks < 0:
        raise InvalidArgumentError(f"--mixed-blocks={args.mixed_blocks}: expected a count >= 0")
    if args.nbytes < 1 << 20:
        raise InvalidArgumentError(f"--bytes={args.bytes}: expected at least 1M")
    too_big = [b for b in args.block_list if b > args.handoff_nbytes]
    if too_big:
        raise InvalidArgumentError(f"--blocks: {fmt_bytes(too_big[0])} is more than --handoff-bytes "
                                   f"({fmt_bytes(args.handoff_nbytes)}): a transfer holds at least one block")
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout={args.timeout:g}: expected seconds > 0")
    if args.checkpoint is not None and not os.path.exists(args.checkpoint):
        raise InvalidArgumentError(f"--checkpoint={args.checkpoint!r}: no such file or directory")
    # each rank's DMA uses its own part of the region
    args.dma_nbytes = min(args.dma_nbytes, args.nbytes // args.ranks)


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def host_available(m: dict) -> int:
    """Bytes of memory a new allocation could still take: MemAvailable plus the
    free 2 MiB hugetlb pages (which MemAvailable leaves out: a hugetlb node pool
    takes from those)."""
    return m["MemAvailable"] + m.get("HugePages_Free", 0) * m.get("Hugepagesize", 0)


def load_has_node() -> bool:
    """Whether ferry.torch.load_safetensors takes node= (issue 33 item 2)."""
    try:
        from ..torch import load_safetensors
    except ImportError:
        return False
    return "node" in inspect.signature(load_safetensors).parameters


class _Ranks:
    """The spawned ranks, driven over pipes."""

    def __init__(self, ranks: int, timeout: float):
        from . import node_ranks

        ctx = multiprocessing.get_context("spawn")
        self.timeout = timeout
        everyone, pair = ctx.Barrier(ranks), ctx.Barrier(2)
        self.conns, self.procs = [], []
        for r in range(ranks):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=node_ranks.serve, args=(child, r, ranks, everyone, pair, timeout), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        self.devices = [self.reply(r)["device"] for r in range(ranks)]

    def reply(self, r: int):
        from ..errors import FerryError

        limit = 3 * self.timeout + 60
        if not self.conns[r].poll(limit):
            raise FerryError(f"bench rank {r} did not answer within {limit:g} s")
        kind, value = self.conns[r].recv()
        if kind == "error":
            raise FerryError(f"bench rank {r}: {value}")
        return value

    def all(self, *command, ranks=None) -> list:
        """Sends command to every rank (or `ranks`, each with its own args when command is a
        function of the rank), then collects the replies in rank order."""
        targets = range(len(self.conns)) if ranks is None else ranks
        for r in targets:
            self.conns[r].send(command[0](r) if callable(command[0]) else command)
        replies, errors = [], []
        for r in targets:  # every rank's answer before raising: the first error is often a symptom
            try:
                replies.append(self.reply(r))
            except Exception as e:  # noqa: BLE001 - gathered, raised below
                errors.append(e)
        if errors:
            from ..errors import FerryError

            raise FerryError("; ".join(str(e) for e in errors))
        return replies

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("quit",))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def _gbps(nbytes: int, times: list[float]) -> float:
    return nbytes / statistics.median(times) / GB


def nixl_handoff(args) -> tuple[dict[int, float] | None, str | None]:
    """{block: GB/s} of `ferry bench nixl`'s WRITE, shuffled, ferry.nixl.agent, from
    its own measure(), or (None, why not)."""
    from .. import nixl as fn
    from . import nixl

    if not fn.available():
        return None, f"nixl not installed ({fn.unavailable_reason()})"
    argv = ["--sizes", ",".join(str(b) for b in args.block_list), "--total", str(args.handoff_nbytes),
            "--ops", "WRITE", "--settings", "ferry", "--layouts", "shuffled", "--repeats", str(args.repeats),
            "--timeout", str(args.timeout)]
    if len(set(args.devices)) > 1:
        argv += ["--device", str(args.devices[0]), "--peer-device", str(args.devices[1])]
    nargs = nixl.SUITE.parser().parse_args(argv)
    nixl.check_args(nargs)
    rows = nixl.measure(nargs)
    bad = [r for r in rows if not r["verified"]]
    if bad:
        return None, f"ferry.nixl's transfer was not bit-exact: {bad[0]['problem']}"
    return {r["block_bytes"]: r["gbps"] for r in rows}, None


def measure(args) -> dict:
    """Every part's figures (the JSON's details)."""
    out: dict = {"ranks": args.ranks}
    ranks = _Ranks(args.ranks, args.timeout)
    try:
        args.devices = out["devices"] = ranks.devices
        out["shared_gpu"] = len(set(ranks.devices)) < len(ranks.devices)
        name = f"ferry-bench-{os.getpid()}"
        capacity = args.nbytes + args.slots * max(args.slot_nbytes, args.peer_slot_nbytes) + (64 << 20)
        before = host_available(meminfo())  # every part needs the pool
        progress(f"attach: {args.ranks} ranks attach to one node pool, register {fmt_bytes(args.nbytes)}")
        att = ranks.all("attach", name, capacity, args.nbytes)
        node_used = before - host_available(meminfo())
        out["pages"] = {"page_bytes": att[0]["stats"]["page_bytes"], "piece_bytes": att[0]["stats"]["piece_bytes"]}
        if "attach" in args.part_list:
            out["attach"] = {"node_seconds": [a["seconds"] for a in att], "node_host_bytes": node_used,
                             "rss_shmem_bytes": [a["rss_shmem_bytes"] for a in att]}
        if {"attach", "dma"} & set(args.part_list):
            before = host_available(meminfo())
            progress(f"attach: each rank its own PinnedPool of {fmt_bytes(args.nbytes)}")
            own = ranks.all("own_pinned", args.nbytes)
            out.setdefault("attach", {}).update(pinned_seconds=[a["seconds"] for a in own],
                                                pinned_host_bytes=before - host_available(meminfo()))
        if "dma" in args.part_list:
            dma = out["dma"] = {}
            for direction in ("h2d", "d2h"):
                for where in ("node", "pinned"):
                    progress(f"dma: {direction}, {args.ranks} ranks at once, {where}")
                    times = ranks.all("dma", where, direction, args.dma_nbytes, args.repeats)
                    dma[f"{where} {direction}"] = [_gbps(args.dma_nbytes, t) for t in times]
        if "handoff" in args.part_list:
            out["handoff"] = handoff(args, ranks)
    finally:
        ranks.close()
    if "handoff" in args.part_list:
        try:
            out["nixl"], out["nixl_note"] = nixl_handoff(args)
        except Exception as e:  # the baseline failing leaves ferry's figures standing, and says why
            out["nixl"], out["nixl_note"] = None, f"ferry.nixl's run failed: {type(e).__name__}: {e}"
    if "load" in args.part_list and args.checkpoint:
        out["load"] = load(args)
    return out


def handoff_cases(args) -> list[tuple[str, list[int]]]:
    """(case, block sizes): each --blocks size, then --mixed-blocks of mixed sizes."""
    from .node_ranks import mixed_sizes

    cases = [(fmt_bytes(b), [b] * (args.handoff_nbytes // b)) for b in args.block_list]
    if args.mixed_blocks:
        cases.append(("mixed 64 KiB-2 MiB", mixed_sizes(args.seed, args.mixed_blocks)))
    return cases


def handoff(args, ranks: _Ranks) -> dict:
    """{"rows": one per (case, route asked), "baselines": {case: {torch .to(), host path}}}."""
    rows, baselines = [], {}
    for case, sizes in handoff_cases(args):
        nbytes = sum(sizes)
        for route in args.route_list:
            progress(f"handoff: {case}, {len(sizes)} blocks, {fmt_bytes(nbytes)}, route={route}, "
                     f"GPU {args.devices[0]} -> GPU {args.devices[1]}")

            slot_bytes = args.peer_slot_nbytes if route == "auto" else args.slot_nbytes

            def command(r, sizes=sizes, route=route, case=case, slot_bytes=slot_bytes):
                return ("handoff", "producer" if r == 0 else "consumer", f"kv-{case}-{route}".replace(" ", "_"),
                        sizes, args.slots, slot_bytes, args.repeats, args.seed, route, args.peer_sms)

            prod, cons = ranks.all(command, ranks=[0, 1])
            rows.append({"case": case, "blocks": len(sizes), "bytes": nbytes, "route_asked": route,
                         "slot_bytes": slot_bytes, "peer_sms": args.peer_sms,
                         "route": cons["route"], "gbps": _gbps(nbytes, cons["seconds"]),
                         "producer_gbps": _gbps(nbytes, prod["seconds"]), "verified": cons["verified"],
                         "problem": cons["problem"], "stats": cons["stats"],
                         "route_note": cons["stats"].get("route_note") or prod["stats"].get("route_note"),
                         "block_bytes": sizes[0] if len(set(sizes)) == 1 else None})
        base = baselines[case] = {}
        for key, cmd in (("torch_peer_gbps", ("peer_copy", nbytes, args.repeats)),
                         ("host_path_gbps", ("host_path", sizes, args.repeats, args.seed))):
            try:
                t = ranks.all(*cmd, ranks=[0])[0]
                base[key] = None if t is None else _gbps(nbytes, t)
                if t is None:
                    base[key.replace("gbps", "note")] = "one GPU (or too few region bytes): not measured"
            except Exception as e:  # torch missing or failing: the reference is left out, said why
                base[key], base[key.replace("gbps", "note")] = None, f"{type(e).__name__}: {e}"
    return {"rows": rows, "baselines": baselines}


def _handoff_row(h: dict, case: str, route: str) -> dict | None:
    return next((r for r in h.get("rows", []) if r["case"] == case and r["route_asked"] == route), None)


def checkpoint_bytes(path: str) -> int:
    """Bytes of a safetensors file, or of the .safetensors files of a directory."""
    if os.path.isdir(path):
        return sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".safetensors"))
    return os.path.getsize(path)


def load(args) -> dict:
    """load_safetensors on every rank at once, alone then with node=, page cache
    warm; then one rank alone (the warm target's baseline); then, where this
    process may drop the page cache (root) and --no-cold is not given, the
    same two with the page cache dropped before each. Fresh ranks."""
    if not load_has_node():
        return {"note": "load_safetensors has no node= here (issue 33 item 2 not in this build)"}
    from .load_measures import drop_page_cache

    ranks = _Ranks(args.ranks, args.timeout)
    try:
        capacity = max(args.nbytes, checkpoint_bytes(args.checkpoint)) + (256 << 20)
        ranks.all("attach", f"ferry-bench-load-{os.getpid()}", capacity, 1 << 20)
        out = {}

        def timed(setting, node, only=None, cold=False, route="auto"):
            progress(f"load: {args.checkpoint} on " + ("rank 0 alone" if only else f"{args.ranks} ranks at once")
                     + f", {setting}")
            if cold:
                drop_page_cache()
            got = ranks.all("load", args.checkpoint, node, only is None, route, ranks=only)
            out[setting] = {"seconds": [g["seconds"] for g in got], "bytes": got[0]["bytes"],
                            "routes": got[0]["routes"]}

        timed("warm-up", False)  # fills the page cache: the warm runs are warm
        timed("alone", False)
        timed("node", True)  # node= as a user calls it: warm files go each rank alone (node_plan)
        # The pool's first use here: its pieces are pinned during the load.
        timed("node pool", True, route="pool")
        progress(f"load: {args.ranks} ranks pin the rest of the pool ({fmt_bytes(capacity)} in all)")
        out["pin_seconds"] = [g["seconds"] for g in ranks.all("pin_all")]
        timed("node pinned", True, route="pool")  # every piece pinned already, as after pin_all at start-up
        timed("one rank", False, only=[0])
        cold_why = "--no-cold" if args.no_cold else drop_page_cache()
        if cold_why is None:
            timed("cold alone", False, cold=True)
            timed("cold node", True, cold=True)
        else:
            out["cold_note"] = f"cold loads skipped: {cold_why}"
        return out
    finally:
        ranks.close()


def load_targets(ld: dict, ranks: int) -> list[tuple[str, str, str]]:
    """issue 33's checkpoint targets from load()'s figures."""
    out = []
    if "cold node" in ld:
        node, alone = max(ld["cold node"]["seconds"]), max(ld["cold alone"]["seconds"])
        r = node / alone
        out.append((f"checkpoint, page cache dropped: node= <= {TARGET_COLD_RATIO}x each rank alone",
                    f"{r:.2f}x ({node:.2f} s vs {alone:.2f} s, slowest rank)",
                    "met" if r <= TARGET_COLD_RATIO else "missed"))
    else:
        out.append((f"checkpoint, page cache dropped: node= <= {TARGET_COLD_RATIO}x each rank alone", "-",
                    "not measured (" + ld.get("cold_note", "no cold runs") + ")"))
    if "alone" in ld and "node" in ld:
        node, alone = max(ld["node"]["seconds"]), max(ld["alone"]["seconds"])
        r = node / alone
        out.append((f"checkpoint, page cache warm: node= <= {TARGET_WARM_VS_ALONE}x each rank alone",
                    f"{r:.2f}x ({node:.2f} s vs {alone:.2f} s, slowest rank; routes {ld['node'].get('routes')})",
                    "met" if r <= TARGET_WARM_VS_ALONE else "missed"))
    if "one rank" in ld:
        nbytes = ld["node"]["bytes"]
        one = nbytes / ld["one rank"]["seconds"][0] / GB
        for key, what in (("node", ""), ("node pool", ", through the pool"),
                          ("node pinned", ", through the pool pinned beforehand")):
            if key not in ld:
                continue
            together = ranks * nbytes / max(ld[key]["seconds"]) / GB
            r = together / one
            out.append((f"checkpoint, warm{what}: node= on all ranks >= {TARGET_WARM_RATIO}x one rank's GB/s",
                        f"{r:.2f}x ({together:.1f} GB/s in all vs {one:.1f} GB/s)",
                        "met" if r >= TARGET_WARM_RATIO else "missed"))
    return out


def handoff_targets(h: dict, m: dict) -> list[tuple[str, str, str]]:
    """Issue 39's handoff targets, and issue 33's 64 KiB one beside ferry.nixl."""
    out = []
    mixed = "mixed 64 KiB-2 MiB"
    for case, target in (("2 MiB", TARGET_HANDOFF_GBPS), (mixed, TARGET_HANDOFF_MIXED_GBPS)):
        row = _handoff_row(h, case, "pool")
        out.append((f"KV handoff through the pool, {case} blocks: >= {target:g} GB/s end to end",
                    f"{row['gbps']:.1f} GB/s" if row else "-",
                    "not measured (no such case or route pool)" if not row else
                    ("met" if row["gbps"] >= target else "missed")))
    row, torch = _handoff_row(h, mixed, "auto"), (h.get("baselines", {}).get(mixed) or {}).get("torch_peer_gbps")
    what = f"KV handoff GPU to GPU, mixed blocks: >= {TARGET_HANDOFF_PEER_RATIO:g}x a torch .to() of the same bytes"
    if row and torch and row["route"] == "peer":
        r = row["gbps"] / torch
        out.append((what, f"{r:.2f}x ({row['gbps']:.1f} vs {torch:.1f} GB/s)",
                    "met" if r >= TARGET_HANDOFF_PEER_RATIO else "missed"))
    else:
        why = ("no mixed case or route auto" if not row else "no torch peer copy" if not torch else
               f"route auto ran {row['route']}: the GPUs do not reach each other here")
        out.append((what, "-", f"not measured ({why})"))
    small, nixl = _handoff_row(h, "64 KiB", "pool"), (m.get("nixl") or {}).get(64 << 10)
    if small and nixl:
        r = small["gbps"] / nixl
        out.append((f"KV handoff, 64 KiB blocks: >= {TARGET_NIXL_RATIO:g}x ferry.nixl", f"{r:.2f}x",
                    "met" if r >= TARGET_NIXL_RATIO else "missed"))
    else:
        out.append((f"KV handoff, 64 KiB blocks: >= {TARGET_NIXL_RATIO:g}x ferry.nixl",
                    "-", "not measured (" + (m.get("nixl_note") or "--blocks has no 64K") + ")"))
    return out


def targets(m: dict, args) -> list[tuple[str, str, str]]:
    """[(target, measured, met / missed / not measured)] of issue 33's targets."""
    out = []
    a = m.get("attach") or {}
    if "node_seconds" in a:
        worst = max(a["node_seconds"])
        out.append((f"attach + register {fmt_bytes(args.nbytes)}: <= {TARGET_ATTACH_S} s per rank",
                    f"{worst:.3f} s (slowest rank)", "met" if worst <= TARGET_ATTACH_S else "missed"))
        once = a["node_host_bytes"] <= 1.25 * args.nbytes
        out.append(("host memory used once, not per rank",
                    f"{a['node_host_bytes'] / GB:.2f} GB for {args.ranks} ranks (region {args.nbytes / GB:.2f} GB)",
                    "met" if once else "missed"))
    d = m.get("dma")
    if d:
        ratios = [n / p for key in ("h2d", "d2h") for n, p in zip(d[f"node {key}"], d[f"pinned {key}"])]
        out.append((f"DMA, all ranks at once: >= {TARGET_DMA_RATIO:.0%} of the pinned rate",
                    f"{min(ratios):.2f}x (worst rank and direction)",
                    "met" if min(ratios) >= TARGET_DMA_RATIO else "missed"))
    h = m.get("handoff") or {}
    if "handoff" in args.part_list:
        out += handoff_targets(h, m)
    ld = m.get("load") or {}
    if "node" in ld:
        out += load_targets(ld, args.ranks)
    if m.get("shared_gpu"):
        out = [(t, v, f"{s} (ranks share a GPU)") for t, v, s in out]
    return out


def records(m: dict, args) -> Records:
    out = Records("node")
    common = {"ranks": args.ranks, "shared_gpu": m.get("shared_gpu"),
              "page_bytes": (m.get("pages") or {}).get("page_bytes")}
    a = m.get("attach") or {}
    for r, t in enumerate(a.get("node_seconds", [])):
        own = a.get("pinned_seconds")
        out.compare({**common, "rank": r, "bytes": args.nbytes}, "time", "s",
                    {"node pool attach+register": t, "own PinnedPool": own[r] if own else None},
                    baseline="own PinnedPool")
    if "node_host_bytes" in a:
        out.compare({**common, "bytes": args.nbytes}, "host_memory", "GB",
                    {"node pool": a["node_host_bytes"] / GB,
                     "own PinnedPool": a["pinned_host_bytes"] / GB if "pinned_host_bytes" in a else None},
                    baseline="own PinnedPool")
    for key, values in (m.get("dma") or {}).items():
        where, direction = key.split()
        if where != "node":
            continue
        for r, v in enumerate(values):
            out.compare({**common, "rank": r, "direction": direction, "nbytes": args.dma_nbytes}, "bandwidth",
                        "GB/s", {"node pool": v, "own pinned buffer": m["dma"][f"pinned {direction}"][r]},
                        baseline="own pinned buffer")
    h = m.get("handoff") or {}
    for row in h.get("rows", []):
        base = h["baselines"].get(row["case"]) or {}
        nixl = (m.get("nixl") or {}).get(row["block_bytes"]) if row["route_asked"] == "pool" else None
        out.compare({**common, "handoff": row["case"], "blocks": row["blocks"], "bytes": row["bytes"],
                     "route_asked": row["route_asked"], "route": row["route"], "slots": args.slots,
                     "slot_bytes": row.get("slot_bytes", args.slot_nbytes), "verified": row["verified"]},
                    "bandwidth", "GB/s",
                    {"ferry.node handoff": row["gbps"], "torch .to() peer": base.get("torch_peer_gbps"),
                     "host path GPU->pinned->GPU": base.get("host_path_gbps"), "ferry.nixl WRITE": nixl},
                    baseline={"ferry.node handoff": "torch .to() peer" if row["route"] == "peer"
                              else "host path GPU->pinned->GPU"})
    ld = m.get("load") or {}
    for cache, node_key, alone_key in (("warm", "node", "alone"), ("warm, through the pool", "node pool", "alone"),
                                       ("warm, pool pinned", "node pinned", "alone"),
                                       ("cold", "cold node", "cold alone")):
        if node_key not in ld:
            continue
        for r, (t, alone) in enumerate(zip(ld[node_key]["seconds"], ld[alone_key]["seconds"])):
            out.compare({**common, "rank": r, "bytes": ld[node_key]["bytes"], "checkpoint": args.checkpoint,
                         "page_cache": cache, "routes": ld[node_key].get("routes")},
                        "time", "s", {"load_safetensors node=": t, "load_safetensors alone": alone},
                        baseline="load_safetensors alone")
    for target, value, state in targets(m, args):
        out.add(target, "target", state, None, measured=value)
    return out


class NodeSuite(Suite):
    key = "node"
    description = "one node pool shared by every rank: attach, DMA, KV handoff GPU->GPU vs each rank alone and NIXL"

    def add_arguments(self, p):
        p.add_argument("--ranks", type=int_at_least(2), default=2, help="rank processes (default: %(default)s)")
        p.add_argument("--bytes", type=size, default="1G",
                       help="the shared region, and each rank's own PinnedPool (default: %(default)s; the "
                            "issue's figure: 16G)")
        p.add_argument("--dma-bytes", type=size, default="256M",
                       help="bytes per DMA copy, per rank (default: %(default)s; at most --bytes / --ranks)")
        p.add_argument("--handoff-bytes", type=size, default="256M",
                       help="bytes per handoff transfer (default: %(default)s)")
        p.add_argument("--blocks", type=size_list, default="2M,64K",
                       help="handoff block sizes (default: %(default)s)")
        p.add_argument("--mixed-blocks", type=int, default=600,
                       help="a handoff case of this many blocks of mixed sizes, 64 KiB-2 MiB (default: %(default)s; "
                            "0: none)")
        p.add_argument("--handoff-routes", type=choices_list(HANDOFF_ROUTES), default=",".join(HANDOFF_ROUTES),
                       help="the handoff's routes to measure (default: %(default)s; auto: GPU to GPU where the "
                            "GPUs reach each other)")
        p.add_argument("--slots", type=int_at_least(1), default=4, help="handoff ring slots (default: %(default)s)")
        p.add_argument("--slot-bytes", type=size, default="16M",
                       help="bytes per slot (default: %(default)s: smaller slots fill the pipeline sooner, bigger ones "
                            "cost fewer copy calls)")
        p.add_argument("--peer-slot-bytes", type=size, default="64M",
                       help="bytes per slot for route auto (default: %(default)s: the GPU-to-GPU copies run at "
                            "NVLink speed, so each slot's fixed costs need a bigger slot to hide)")
        add_repeats(p, 5, "timed runs per figure", old=("--iters",))
        p.add_argument("--peer-sms", type=int_at_least(0), default=None,
                       help="SMs of the GPU-to-GPU route's copy kernel (Handoff peer_sms; 0: copy engines only; "
                            "default: Handoff's, ferry.node_handoff.PEER_SMS)")
        p.add_argument("--parts", type=choices_list(PARTS), default=",".join(PARTS),
                       help="what to measure (default: %(default)s)")
        p.add_argument("--checkpoint", default=None, metavar="PATH",
                       help="a safetensors file or directory for part load (none: load is skipped)")
        p.add_argument("--no-cold", action="store_true", help="skip the cold (page cache dropped) loads")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds a rank may wait (default: %(default)s)")
        p.add_argument("--seed", type=int, default=1234, help="the blocks' seed (default: %(default)s)")

    def check_args(self, args) -> None:
        check_args(args)  # on any machine, before the waiver

    def run(self, args) -> int:
        check_args(args)
        start = time.monotonic()
        m = measure(args)
        recs = records(m, args)
        gpus = ", ".join(f"rank {r}: GPU {d}" for r, d in enumerate(m["devices"]))
        print(f"ferry bench node: {args.ranks} ranks ({gpus})"
              + (" -- ranks SHARE a GPU: correctness only, not the issue's figures" if m["shared_gpu"] else ""))
        by = {}
        for rec in recs.items:
            by.setdefault(rec["metric"], []).append(rec)
        cells = [[r["case"] + (" (s)" if r["metric"] == "time" else ", host memory (GB)"),
                  r["params"].get("rank", "all"), r["value"], r["baseline"], r["ratio"]]
                 for r in by.get("time", []) + by.get("host_memory", [])
                 if r["params"].get("baseline_case") == "own PinnedPool"]
        if cells:
            print(table(f"(a) attach + register {fmt_bytes(args.nbytes)}, every rank at once",
                        ["ferry", "rank", "value", "own PinnedPool", "ratio"], cells))
            pages = m.get("pages") or {}
            if pages:
                kind = "2 MiB hugetlb" if pages["page_bytes"] == 2 << 20 else "4 KiB shmem (THP where shmem allows)"
                print(f"  node pool pages: {kind}; pinned in pieces of {fmt_bytes(pages['piece_bytes'])} "
                      "(FERRY_HUGE_PAGES, FERRY_NODE_PIN_PIECE)")
        cells = [[r["params"]["direction"], r["params"]["rank"], r["value"], r["baseline"], r["ratio"]]
                 for r in by.get("bandwidth", []) if r["case"] == "node pool"]
        if cells:
            print(table(f"(b) DMA, all ranks at once, {fmt_bytes(args.dma_nbytes)} per copy (GB/s, median of "
                        f"{args.repeats})", ["direction", "rank", "node pool", "own pinned", "ratio"], cells))
        h = m.get("handoff") or {}
        cells = []
        for row in h.get("rows", []):
            base = h["baselines"].get(row["case"]) or {}
            nixl = (m.get("nixl") or {}).get(row["block_bytes"]) if row["route_asked"] == "pool" else None
            cells.append([row["case"], row["blocks"], row["route_asked"], row["route"] or "-", row["gbps"],
                          base.get("torch_peer_gbps"), base.get("host_path_gbps"), nixl,
                          "yes" if row["verified"] else "NO"])
        if cells:
            print(table(f"(c) KV handoff GPU {m['devices'][0]} -> GPU {m['devices'][1]}, scattered blocks, "
                        f"{args.slots} slots of {fmt_bytes(args.slot_nbytes)} (auto: "
                        f"{fmt_bytes(args.peer_slot_nbytes)}, copy kernel on "
                        f"{'the default' if args.peer_sms is None else args.peer_sms} SMs) "
                        f"(GB/s end to end, median of {args.repeats})",
                        ["blocks", "count", "route asked", "route ran", "ferry.node", "torch .to()",
                         "host path", "ferry.nixl WRITE", "verified"], cells))
            notes = {m.get("nixl_note")} | {v for b in h["baselines"].values() for k, v in b.items()
                                            if k.endswith("note")}
            for note in sorted(n for n in notes if n):
                print(f"  {note}")
            for row in h.get("rows", []):
                if row["route_asked"] == "auto" and row["route"] != "peer" and row.get("route_note"):
                    print(f"  {row['case']}: route auto ran {row['route']}: {row['route_note']}")
            print("  host path: GPU 0 -> pinned host -> GPU 1 in one process (ferry.copy_many each way), what a "
                  "rank does without the handoff; torch .to(): one contiguous tensor of the same bytes")
        ld = m.get("load") or {}
        if "note" in ld:
            print(f"(d) load: {ld['note']}")
        elif ld:
            cold = "cold node" in ld
            cells = [[r, t, a] + ([ld["cold node"]["seconds"][r], ld["cold alone"]["seconds"][r]] if cold else [])
                     for r, (t, a) in enumerate(zip(ld["node"]["seconds"], ld["alone"]["seconds"]))]
            print(table(f"(d) load_safetensors {args.checkpoint} ({fmt_bytes(ld['node']['bytes'])}), all ranks at "
                        f"once (s); rank 0 alone, warm: {ld['one rank']['seconds'][0]:.3f} s",
                        ["rank", "node= warm", "alone warm"] + (["node= cold", "alone cold"] if cold else []),
                        cells))
            print("  node= routes (files): warm " + str(ld["node"].get("routes"))
                  + (f", cold {ld['cold node'].get('routes')}" if cold else "")
                  + " (alone: in the page cache, each rank reads it itself; pool: read once for the node)")
            if "node pool" in ld:
                print("  node= through the pool (FERRY_NODE_LOAD=pool), warm: "
                      + ", ".join(f"rank {r} {t:.3f} s" for r, t in enumerate(ld["node pool"]["seconds"])))
            if "node pinned" in ld:
                print("  node= through the pool again, every piece of the pool pinned already (the first load pinned what it "
                      f"used, pin_all() the rest in {max(ld['pin_seconds']):.2f} s): "
                      + ", ".join(f"rank {r} {t:.3f} s" for r, t in enumerate(ld["node pinned"]["seconds"])))
            if ld.get("cold_note"):
                print(f"  {ld['cold_note']}")
        print(table("targets (issues 33, 39)", ["target", "measured", "state"], targets(m, args)))
        print(f"[{time.monotonic() - start:.1f} s]")
        write_json(args.json, self.key, recs.items, details={"measured": _jsonable(m)})
        verified = all(row["verified"] for row in h.get("rows", []))
        return 0 if verified else 1


def _jsonable(m: dict) -> dict:
    """Block sizes as string keys (JSON object keys)."""
    out = {}
    for k, v in m.items():
        out[k] = {str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v
    return out


SUITE = NodeSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
