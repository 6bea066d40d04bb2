"""`ferry bench load --first-loads N` and `--ranks N` (issue 40 items 2 and 3):
loads in fresh processes (load_procs.py starts them, load_child.py is each).

--first-loads N: N fresh processes one after another per path (ferry's
load_safetensors; InstantTensor's MMAP backend where installed), each with
torch, ferry and its CUDA context ready before timing, the page cache warm:
the first load_safetensors call (ferry: the default loader, its pinned staging
and reader threads, made first and timed apart), the second load in the same
process, and one after torch.cuda.empty_cache() (its device memory allocated
again). Beside the warm in-process median of the same path.

--ranks N (N >= 2): one process per GPU (device i for rank i), each loading
the whole checkpoint with load_safetensors to its own GPU with its own Loader
(--staging, --threads), one untimed load first, then --repeats rounds, each
started on every rank at once (the barrier); beside one such process alone on
GPU 0. "in all": N x the checkpoint / the slowest rank's time, per round.
Fewer GPUs than N: the mode is waived, with why.
"""

from __future__ import annotations

from ..measure import median
from .load_procs import run_together
from .report import progress, table

FIRST_PATHS = ("ferry", "InstantTensor MMAP")
# issue 40's targets for two ranks on the two-H100 machine (GB/s)
TARGET_RANK_GBPS = 45.0
TARGET_TWO_RANKS_GBPS = 90.0


def first_load_paths(only: list[str] | None) -> list[str]:
    """The paths --first-loads times, after --only."""
    return [p for p in FIRST_PATHS if not only or any(w.lower() in p.lower() for w in only)]


def check(args) -> None:
    """--first-loads and --ranks against --only (InvalidArgumentError on any machine)."""
    from ..errors import InvalidArgumentError

    if args.first_loads and not first_load_paths(args.only):
        raise InvalidArgumentError(f"--first-loads times {' and '.join(FIRST_PATHS)}; --only "
                                   f"{', '.join(args.only)} leaves out both")
    if args.ranks > 1 and not any(w.lower() in "ferry" for w in (args.only or ["ferry"])):
        raise InvalidArgumentError(f"--ranks loads with ferry; --only {', '.join(args.only)} leaves it out")


def gpu_count() -> int:
    """The CUDA devices this process sees; 0 without a driver or a device."""
    from .. import _ferry
    from ..errors import NoDeviceError

    try:
        return _ferry.device_count()
    except NoDeviceError:
        return 0


def ranks_waiver(ranks: int, gpus: int) -> str | None:
    """Why --ranks cannot run on a machine of `gpus` GPUs, or None (also for
    ranks < 2: the mode is off)."""
    if ranks < 2 or ranks <= gpus:
        return None
    return (f"--ranks {ranks} needs {ranks} GPUs (one process per GPU); this machine has {gpus}: "
            "the mode is waived")


# ---- running --------------------------------------------------------------------------

def run_first_loads(args, paths: list[str], nbytes: int, results: dict, installed) -> None:
    """results["first_loads"][path]: the summary of args.first_loads fresh
    processes; `installed(label)`: None, or why the path cannot run."""
    out = results.setdefault("first_loads", {})
    for label in first_load_paths(args.only):
        why = installed(label)
        if why:
            results["waived"][f"{label}, first load in a fresh process"] = why
            continue
        runs = []
        for k in range(args.first_loads):
            progress(f"first load in a fresh process: {label} ({k + 1} of {args.first_loads})")
            runs += run_together([{"mode": "first", "method": label, "paths": list(paths), "device": 0}],
                                 timeout=args.child_timeout)
        out[label] = summarize_first(runs, nbytes)


def run_ranks(args, paths: list[str], nbytes: int, results: dict, gpus: int) -> None:
    """results["ranks"]: --ranks processes at once, beside one alone; or why not."""
    why = ranks_waiver(args.ranks, gpus)
    if why:
        results["ranks"] = {"ranks": args.ranks, "waived": why}
        progress(f"ranks: waived: {why}")
        return

    def job(i: int) -> dict:
        return {"mode": "rank", "method": "ferry", "paths": list(paths), "device": i, "rounds": args.repeats,
                "staging_bytes": args.staging, "threads": args.threads}

    progress(f"ranks: one rank alone on GPU 0, {args.repeats} rounds")
    alone = run_together([job(0)], rounds=args.repeats, timeout=args.child_timeout)
    progress(f"ranks: {args.ranks} ranks at once, {args.repeats} rounds")
    together = run_together([job(i) for i in range(args.ranks)], rounds=args.repeats, timeout=args.child_timeout)
    results["ranks"] = summarize_ranks(alone, together, nbytes)


def passed(results: dict) -> bool:
    """False when a fresh process loaded wrong bytes, or one of ferry's failed
    (a peer's process that fails is reported, as its in-process row is)."""
    for label, s in (results.get("first_loads") or {}).items():
        if s.get("mismatch") or (label == "ferry" and not s["verified"]):
            return False
    rk = results.get("ranks") or {}
    return "waived" in rk or not rk or bool(rk.get("verified"))


# ---- figures ----------------------------------------------------------------------------

def _gbps(nbytes: int, seconds: float | None) -> float | None:
    return nbytes / seconds / 1e9 if seconds else None


def _verified(msgs: list[dict]) -> tuple[bool, str | None]:
    flags = [v for m in msgs for k, v in m.items() if k.endswith("_verified")]
    bad = next((m["mismatch"] for m in msgs if m.get("mismatch")), None)
    return bool(flags) and all(flags), bad


def summarize_first(runs: list[dict], nbytes: int) -> dict:
    """The medians over the processes of run_together's answers for "first"
    jobs: first call (loader made + first load), first load alone, second,
    after empty_cache (GB/s), the loader's creation (ms), first call / second."""
    res = [r["results"][0] for r in runs if not r["error"] and r["results"]]
    out = {"processes": len(runs), "completed": len(res), "errors": [r["error"] for r in runs if r["error"]]}
    if not res:
        out["verified"] = False
        return out
    first_call = [x.get("loader_s", 0.0) + x["first_s"] for x in res]
    out["first_call_gbps"] = median([_gbps(nbytes, s) for s in first_call])
    out["first_load_gbps"] = median([_gbps(nbytes, x["first_s"]) for x in res])
    out["second_gbps"] = median([_gbps(nbytes, x["second_s"]) for x in res])
    if all("after_empty_cache_s" in x for x in res):
        out["after_empty_cache_gbps"] = median([_gbps(nbytes, x["after_empty_cache_s"]) for x in res])
    if all("loader_s" in x for x in res):
        out["loader_ms"] = median([x["loader_s"] * 1e3 for x in res])
    out["first_over_second"] = median([x["second_s"] / s for x, s in zip(res, first_call)])
    out["verified"], out["mismatch"] = _verified(res)
    out["verified"] = out["verified"] and len(res) == len(runs)
    out["runs"] = [{**r["ready"], **r["results"][0]} for r in runs if not r["error"] and r["results"]]
    return out


def summarize_ranks(alone: list[dict], together: list[dict], nbytes: int) -> dict:
    """Per rank its median GB/s; per round the sum of the ranks' rates and "in
    all" (ranks x nbytes / the slowest rank's seconds), the spread of the
    ranks' starts; their medians; one rank alone's median."""
    n = len(together)
    errors = [f"rank {k}: {r['error']}" for k, r in enumerate(together) if r["error"]]
    errors += [f"alone: {r['error']}" for r in alone if r["error"]]
    out = {"ranks": n, "errors": errors, "devices": [r["job"].get("device", 0) for r in together]}
    rounds = min([len(r["results"]) for r in together] or [0])
    if alone and alone[0]["results"]:
        out["alone_gbps"] = median([_gbps(nbytes, m["load_s"]) for m in alone[0]["results"]])
    if not rounds:
        out["verified"] = False
        return out
    per = [[r["results"][k] for r in together] for k in range(rounds)]  # per round, per rank
    out["rounds"] = rounds
    out["per_rank_gbps"] = [median([_gbps(nbytes, per[k][r]["load_s"]) for k in range(rounds)]) for r in range(n)]
    out["per_rank_seconds"] = [[per[k][r]["load_s"] for k in range(rounds)] for r in range(n)]
    out["sum_gbps"] = median([sum(_gbps(nbytes, m["load_s"]) for m in row) for row in per])
    out["in_all_gbps"] = median([n * nbytes / max(m["load_s"] for m in row) / 1e9 for row in per])
    out["start_spread_ms"] = median([(max(m["load_start"] for m in row) - min(m["load_start"] for m in row)) * 1e3
                                     for row in per])
    ok, bad = _verified([m for r in together + alone for m in [r["ready"] or {}] + r["results"]])
    out["verified"], out["mismatch"] = ok and not errors, bad
    return out


def rank_targets(rk: dict) -> list[tuple[str, str, str]]:
    """[(target, measured, met / missed)]: issue 40's two-rank targets (H100), for 2 ranks only."""
    if rk.get("ranks") != 2 or "per_rank_gbps" not in rk:
        return []
    worst = min(rk["per_rank_gbps"])
    return [(f"two ranks at once: >= {TARGET_TWO_RANKS_GBPS:g} GB/s in all (issue 40, 2x H100)",
             f"{rk['in_all_gbps']:.1f} GB/s", "met" if rk["in_all_gbps"] >= TARGET_TWO_RANKS_GBPS else "missed"),
            (f"two ranks at once: each >= {TARGET_RANK_GBPS:g} GB/s (issue 40, 2x H100)",
             f"{worst:.1f} GB/s (slowest rank)", "met" if worst >= TARGET_RANK_GBPS else "missed")]


# ---- report ----------------------------------------------------------------------------

def print_first_loads(results: dict) -> None:
    fl = results.get("first_loads") or {}
    if not fl:
        return
    rows = []
    for label, s in fl.items():
        warm = results["warm"].get(label, {}).get("gb_per_s")
        first = s.get("first_call_gbps")
        rows.append([label, first, s.get("loader_ms"), s.get("first_load_gbps"), s.get("second_gbps"),
                     s.get("after_empty_cache_gbps"), s.get("first_over_second"), warm,
                     first / warm if first and warm else None, "yes" if s["verified"] else "NO",
                     f"{s['completed']}/{s['processes']}"])
    print(table("First load in a fresh process (torch, ferry and the CUDA context ready; page cache warm; "
                "median over the processes); GB/s",
                ["path", "first call", "loader ms", "first load", "second load", "after empty_cache",
                 "first / second", "warm in-process", "first / warm", "bit-exact", "processes"], rows))
    print("  first call: the default loader made (pinned staging, threads) + the first load; first load: "
          "the load alone; after empty_cache: a third load, the device memory allocated again")
    for label, s in fl.items():
        for e in s["errors"]:
            print(f"  {label}: a process failed: {e}")
        if s.get("mismatch"):
            print(f"  {label}: NOT BIT-EXACT: {s['mismatch']}")


def print_ranks(results: dict) -> None:
    rk = results.get("ranks")
    if not rk:
        return
    if "waived" in rk:
        print(f"  ranks: {rk['waived']}")
        return
    rows = [[f"rank {r}", f"cuda:{d}", g, median(s)] for r, (d, g, s) in
            enumerate(zip(rk["devices"], rk.get("per_rank_gbps", []), rk.get("per_rank_seconds", [])))]
    rows += [["sum of the ranks", "-", rk.get("sum_gbps"), None],
             [f"in all ({rk['ranks']} x the checkpoint / slowest rank)", "-", rk.get("in_all_gbps"), None],
             ["one rank alone", "cuda:0", rk.get("alone_gbps"), None]]
    print(table(f"{rk['ranks']} ranks at once, one process per GPU, each loading the whole checkpoint "
                f"(ferry load_safetensors, page cache warm, median of {rk.get('rounds', 0)} rounds)",
                ["rank", "GPU", "GB/s", "s"], rows))
    if "start_spread_ms" in rk:
        print(f"  the ranks' starts within {rk['start_spread_ms']:.2f} ms of each other (median over the rounds); "
              f"bit-exact: {'yes' if rk['verified'] else 'NO'}")
    for e in rk["errors"]:
        print(f"  ranks: {e}")
    for target, measured, state in rank_targets(rk):
        print(f"  target: {target}: {measured}: {state}")


def records(out, results: dict, common: dict) -> None:
    """The modes' records into `out` (a Records of the load suite)."""
    fl = results.get("first_loads") or {}
    for label, s in fl.items():
        params = {"cache": "warm", "process": "fresh", "processes": s["processes"], "verified": s["verified"],
                  **common}
        peer = fl.get("InstantTensor MMAP", {}).get("first_call_gbps") if label == "ferry" else None
        if s.get("first_call_gbps") is not None:
            out.add(label, "first_call_bandwidth", s["first_call_gbps"], "GB/s", baseline=peer,
                    baseline_case="InstantTensor MMAP", **params)
        for key, metric, unit in (("first_load_gbps", "first_load_bandwidth", "GB/s"),
                                  ("second_gbps", "second_load_bandwidth", "GB/s"),
                                  ("after_empty_cache_gbps", "after_empty_cache_bandwidth", "GB/s"),
                                  ("loader_ms", "loader_creation_time", "ms")):
            if s.get(key) is not None:
                out.add(label, metric, s[key], unit, **params)
    rk = results.get("ranks") or {}
    if "per_rank_gbps" in rk:
        params = {"cache": "warm", "process": "rank", "ranks": rk["ranks"], "rounds": rk["rounds"],
                  "verified": rk["verified"], **common}
        for r, g in enumerate(rk["per_rank_gbps"]):
            out.add("ferry", "bandwidth", g, "GB/s", rank=r, device=rk["devices"][r], **params)
        out.add("ferry", "bandwidth", rk["in_all_gbps"], "GB/s", rank="all", **params)
        out.add("ferry", "sum_of_ranks_bandwidth", rk["sum_gbps"], "GB/s", rank="all", **params)
        if rk.get("alone_gbps") is not None:
            out.add("ferry", "bandwidth", rk["alone_gbps"], "GB/s", **{**params, "ranks": 1}, rank=0, device=0)
    for target, measured, state in rank_targets(rk):
        out.add(target, "target", state, None, measured=measured)
