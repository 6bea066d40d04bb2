"""`ferry bench pool`: pinned host memory that is fast to get and fast to reuse.

Three tables, ferry beside its baselines in the same run:
  1. time until N bytes are pinned and usable, each case in a fresh process,
     median of --repeats (3) with the pinned bytes of each row:
       ferry-target          PinnedPool(target_bytes=N) ready (wait_ready)
       ferry-target+alloc    the same, then one allocation of N (its own time: alloc ms)
       ferry-target+64       the same, then 64 allocations of N/64
       ferry-alloc           one allocation of N, no target (registration overlapping the touch)
       ferry-alloc-seq       the same, registered after the whole touch (register_lead_bytes=N)
       cudaHostAlloc         cudaHostAlloc(N)
       torch-default         torch.empty(N, dtype=torch.uint8, pin_memory=True)
       torch-best            the same with PYTORCH_CUDA_ALLOC_CONF=
                             pinned_use_cuda_host_register:True,pinned_num_register_threads:16
       (torch-pin_memory     tensor.pin_memory() of touched pageable memory: --methods)
  2. recycled alloc+free latency: C++ loops 4 KiB .. 64 MiB (ferry pool vs
     cudaHostAlloc+cudaFreeHost), and from Python in a fresh process, per call
     (median of blocks of calls): ferry pool.alloc(n)+del, the same with
     zero=True (what clearing recycled memory costs), ferry.torch.empty_pinned
     +del, beside torch.empty(n, pin_memory=True)+del (PyTorch's pinned cache);
  3. registration time by page backing (4 KiB, THP, hugetlb 2 MiB, hugetlb 1 GiB)
     at 1, 8, 32 GiB; hugetlb cases need pages reserved (--reserve-hugetlb, root;
     restored afterwards) and are waived otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ..measure import median, percentile
from ..units import GiB, KiB, MiB, parse_size_list
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, deprecated_alias, int_at_least

HUGETLB_DIR = "/sys/kernel/mm/hugepages/hugepages-{kb}kB/nr_hugepages"
TORCH_BEST = "pinned_use_cuda_host_register:True,pinned_num_register_threads:16"
METHODS = ["ferry-target", "ferry-target+alloc", "ferry-target+64", "ferry-alloc", "ferry-alloc-seq",
           "cudaHostAlloc", "torch-default", "torch-best"]
TORCH_METHODS = {"torch-default", "torch-best", "torch-pin_memory"}


# ---- 1. time to pinned ---------------------------------------------------------

def _pool_facts(pool) -> dict:
    st = pool.stats()
    return {
        "pinned_bytes": st["huge"]["reserved"]["current"] + st["small"]["reserved"]["current"],
        "touch_seconds": st["touch_seconds"],
        "register_seconds": st["register_seconds"],
        "chunks": {k: v for k, v in st["chunks"].items() if v},
    }


def _case(method: str, nbytes: int) -> dict:
    """Runs in a fresh process: time one way of getting nbytes pinned."""
    from .. import _ferry
    from ..pool import PinnedPool

    if method in TORCH_METHODS:
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")
    else:
        _ferry.cuda_warm_up(0)
    result: dict = {"method": method, "nbytes": nbytes}
    t0 = time.perf_counter()
    if method.startswith("ferry-target"):
        pool = PinnedPool(device=0, target_bytes=nbytes)
        pool.wait_ready()
        result["ready_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        if method == "ferry-target+alloc":
            bufs = [pool.alloc(nbytes)]
        elif method == "ferry-target+64":
            bufs = [pool.alloc(nbytes // 64 // 256 * 256) for _ in range(64)]
        else:
            bufs = []
        result["alloc_seconds"] = time.perf_counter() - t1
        result["seconds"] = time.perf_counter() - t0
        result.update(_pool_facts(pool))
        del bufs
    elif method in ("ferry-alloc", "ferry-alloc-seq"):
        options = {"register_lead_bytes": nbytes} if method == "ferry-alloc-seq" else {}
        pool = PinnedPool(device=0, **options)
        buf = pool.alloc(nbytes)
        result["seconds"] = time.perf_counter() - t0
        result.update(_pool_facts(pool))
        t1 = time.perf_counter()
        buf.release()
        pool.trim()
        result["free_seconds"] = time.perf_counter() - t1
    elif method == "cudaHostAlloc":
        alloc_s, free_s = _ferry.cuda_host_alloc_seconds(nbytes, 0)
        result.update(seconds=alloc_s, free_seconds=free_s, pinned_bytes=nbytes)
    elif method in ("torch-default", "torch-best"):
        import torch

        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        result["seconds"] = time.perf_counter() - t0
        stats = getattr(torch.cuda, "host_memory_stats", lambda: {})()
        result["pinned_bytes"] = stats.get("reserved_bytes.current", stats.get("allocated_bytes.current"))
        result["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        del t
    elif method == "torch-pin_memory":
        import torch

        src = torch.ones(nbytes, dtype=torch.uint8)  # touched pageable memory
        t0 = time.perf_counter()
        t = src.pin_memory()
        result["seconds"] = time.perf_counter() - t0
        del t
    else:
        raise SystemExit(f"unknown case {method}")
    return result


def run_case(method: str, nbytes: int) -> dict:
    cmd = [sys.executable, "-m", "ferry.bench.pool", "--case", method, "--bytes", str(nbytes)]
    env = dict(os.environ)
    if method == "torch-best":
        env["PYTORCH_CUDA_ALLOC_CONF"] = TORCH_BEST
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        return {"method": method, "nbytes": nbytes, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_repeated(method: str, nbytes: int, repeats: int) -> dict:
    """The median run of `repeats` fresh processes, with every run's time."""
    runs = [run_case(method, nbytes) for _ in range(repeats)]
    good = sorted((r for r in runs if "seconds" in r), key=lambda r: r["seconds"])
    if not good:
        return runs[0]
    row = dict(good[len(good) // 2])
    row["runs_seconds"] = [r["seconds"] for r in good]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        row["error"] = errors[0]
    return row


def have_torch_cuda() -> bool:
    r = subprocess.run(
        [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
        capture_output=True,
    )
    return r.returncode == 0


def time_to_pinned(sizes: list[int], methods: list[str], repeats: int) -> list[dict]:
    if not have_torch_cuda():
        methods = [m for m in methods if m not in TORCH_METHODS]
    results = []
    for n in sizes:
        for m in methods:
            progress(f"time to pinned: {m} {n // MiB} MiB x{repeats}")
            results.append(run_repeated(m, n, repeats))
    return results


# ---- 2. recycled alloc+free ----------------------------------------------------

def recycle_latency(sizes: list[int], iterations: int) -> list[dict]:
    from .. import _ferry
    from ..pool import PinnedPool

    pool = PinnedPool(device=0, zero_recycled=False)
    rows = []
    for n in sizes:
        progress(f"recycle latency {n // KiB} KiB")
        ferry_ns = _ferry.pool_recycle_ns(pool._native, n, 256, iterations)
        cuda_iters = max(5, min(iterations, int(2e8 // max(n, 1))))
        cuda_ns = _ferry.cuda_host_alloc_free_ns(n, cuda_iters, 0)
        rows.append({
            "nbytes": n,
            "ferry_median_us": median(ferry_ns) / 1e3,
            "ferry_p99_us": percentile(ferry_ns, 99) / 1e3,
            "cuda_median_us": median(cuda_ns) / 1e3,
            "cuda_p99_us": percentile(cuda_ns, 99) / 1e3,
        })
    return rows


PY_RECYCLE = {  # name: (statement timed per call, setup); `n`, `pool`, `torch`, `empty_pinned` are bound
    "ferry pool.alloc+del": "b = alloc(n); del b",
    "ferry pool.alloc(zero=True)+del": "b = alloc(n, zero=True); del b",
    "ferry empty_pinned+del": "t = empty_pinned(n, u8, pool); del t",
    "torch.empty(pin_memory=True)+del": "t = torch_empty(n, dtype=u8, pin_memory=True); del t",
}


def _python_recycle_case(sizes: list[int], blocks: int, per_block: int) -> list[dict]:
    """Runs in a fresh process: per-call time of alloc+free from Python, the
    median over `blocks` blocks of `per_block` calls (after a warm-up block)."""
    import gc

    from ..pool import PinnedPool

    try:
        import torch

        from ..torch import empty_pinned

        torch_ok = torch.cuda.is_available()
    except ImportError:
        torch_ok = False
    pool = PinnedPool(device=0)
    rows = []
    gc.disable()
    for n in sizes:
        row: dict = {"nbytes": n}
        for name, stmt in PY_RECYCLE.items():
            if not torch_ok and ("torch" in stmt or "empty_pinned" in stmt):
                continue
            env = {"alloc": pool.alloc, "n": n, "pool": pool}
            if torch_ok:
                env.update(torch_empty=torch.empty, u8=torch.uint8, empty_pinned=empty_pinned)
            src = "def loop(k):\n    for _ in range(k):\n        " + stmt.replace("; ", "\n        ")
            exec(src, env)
            loop = env["loop"]
            loop(per_block)  # warm-up: the first call reserves and pins
            per_call = []
            for _ in range(blocks):
                t0 = time.perf_counter_ns()
                loop(per_block)
                per_call.append((time.perf_counter_ns() - t0) / per_block)
            row[name] = {"median_us": median(per_call) / 1e3, "p99_us": percentile(per_call, 99) / 1e3}
        rows.append(row)
    gc.enable()
    st = pool.stats()
    return [{"sizes": rows, "zero_recycled": st["zero_recycled"], "zeroed_bytes": st["zeroed_bytes"]}]


def python_recycle(sizes: list[int]) -> dict:
    cmd = [sys.executable, "-m", "ferry.bench.pool", "--case", "python-recycle",
           "--bytes", ",".join(str(n) for n in sizes)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])[0]


# ---- 3. registration by page backing ----------------------------------------------

BACKINGS = {  # name: (pool options, chunk backing that proves it was used)
    "4k": (dict(huge_pages="off", target_huge=False, chunk_bytes=512 * MiB), "small_pages"),
    "thp": (dict(huge_pages="thp", chunk_bytes=512 * MiB), "thp"),
    "hugetlb-2m": (dict(huge_pages="hugetlb", chunk_bytes=512 * MiB), "hugetlb_2m"),
    "hugetlb-1g": (dict(huge_pages="hugetlb", chunk_bytes=GiB), "hugetlb_1g"),
}


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _write_int(path: str, value: int) -> bool:
    try:
        with open(path, "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


def registration_by_backing(sizes: list[int]) -> list[dict]:
    from ..errors import FerryError
    from ..pool import PinnedPool

    rows = []
    for n in sizes:
        for name, (opts, proof) in BACKINGS.items():
            progress(f"registration {name} {n // GiB} GiB")
            row: dict = {"backing": name, "nbytes": n}
            try:
                # Registered after the whole touch: the rate of touched memory.
                pool = PinnedPool(device=0, target_bytes=n, register_lead_bytes=n, **opts)
                pool.wait_ready()
                st = pool.stats()
                used = {k: v for k, v in st["chunks"].items() if v}
                if set(used) != {proof}:
                    row["waived"] = f"chunks came out as {used} ({'; '.join(st['notes']) or 'no note'})"
                row["register_seconds"] = st["register_seconds"]
                row["touch_seconds"] = st["touch_seconds"]
                row["register_gbps"] = n / st["register_seconds"] / 1e9 if st["register_seconds"] else None
                t0 = time.perf_counter()
                pool.trim()
                row["unregister_and_unmap_seconds"] = time.perf_counter() - t0
                del pool
            except FerryError as e:
                row["waived"] = str(e)
            rows.append(row)
    return rows


def reserve_hugetlb(total_bytes: int) -> dict:
    """Reserve enough 2 MiB and 1 GiB pages for total_bytes; returns what to restore."""
    saved = {}
    for kb, count in ((2048, total_bytes // (2 * MiB) + 8), (1048576, total_bytes // GiB + 1)):
        path = HUGETLB_DIR.format(kb=kb)
        old = _read_int(path)
        if old is None:
            continue
        saved[path] = old
        if not _write_int(path, count):
            progress(f"could not write {path} (needs root)")
        progress(f"{path}: asked {count}, got {_read_int(path)}")
    return saved


def restore_hugetlb(saved: dict) -> None:
    for path, value in saved.items():
        _write_int(path, value)


# ---- the suite ---------------------------------------------------------------------

def _ms(x):
    return x * 1e3 if isinstance(x, (int, float)) else None


def print_tables(results: dict) -> None:
    if results.get("time_to_pinned"):
        rows = []
        by_size: dict[int, dict] = {}
        for r in results["time_to_pinned"]:
            by_size.setdefault(r["nbytes"], {})[r["method"]] = r
        for n, cases in by_size.items():
            base = cases.get("cudaHostAlloc", {}).get("seconds")
            best = cases.get("torch-best", {}).get("seconds")
            for m, r in cases.items():
                s = r.get("seconds")
                runs = r.get("runs_seconds") or []
                rows.append([
                    f"{n // MiB}", m, _ms(s),
                    f"{runs[0] * 1e3:.0f}-{runs[-1] * 1e3:.0f}" if len(runs) > 1 else "-",
                    _ms(r.get("alloc_seconds")) if m.startswith("ferry-target+") else None,
                    r["pinned_bytes"] / MiB if r.get("pinned_bytes") else None,
                    base / s if base and s else None,
                    best / s if best and s else None,
                    r.get("error", ""),
                ])
        print(table("Time until N bytes are pinned and usable (fresh process each, median of the runs)",
                    ["N(MiB)", "method", "Time(ms)", "runs(ms)", "alloc(ms)", "Pinned(MiB)",
                     "x cudaHostAlloc", "x torch-best", "note"], rows))
        print()
    if results.get("recycle"):
        rows = [[r["nbytes"] // KiB, r["ferry_median_us"], r["ferry_p99_us"], r["cuda_median_us"],
                 r["cuda_median_us"] / r["ferry_median_us"] if r["ferry_median_us"] else None]
                for r in results["recycle"]]
        print(table("Recycled alloc+free latency, C++ loop (ferry pool vs cudaHostAlloc+cudaFreeHost)",
                    ["Size(KiB)", "ferry Median(us)", "ferry p99(us)", "cudaHostAlloc+Free Median(us)", "x cuda"],
                    rows))
        print()
    py = results.get("python_recycle")
    if py and py.get("sizes"):
        rows = []
        for r in py["sizes"]:
            torch_us = (r.get("torch.empty(pin_memory=True)+del") or {}).get("median_us")
            for name in PY_RECYCLE:
                if name in r:
                    us = r[name]["median_us"]
                    rows.append([r["nbytes"] // KiB, name, us, r[name]["p99_us"],
                                 us / torch_us if torch_us and "torch" not in name else None])
        print(table("Recycled alloc+free from Python, per call (fresh process; pool zero_recycled="
                    f"{py.get('zero_recycled')})",
                    ["Size(KiB)", "call", "Median(us)", "p99(us)", "x torch"], rows))
        print()
    elif py and py.get("error"):
        print(f"Recycled alloc+free from Python: failed: {py['error']}\n")
    if results.get("registration"):
        base = {r["nbytes"]: r.get("register_seconds") for r in results["registration"] if r["backing"] == "4k"}
        rows = [[r["nbytes"] // GiB, r["backing"],
                 r["register_seconds"] * 1e3 if r.get("register_seconds") else None,
                 r.get("register_gbps"),
                 base.get(r["nbytes"]) / r["register_seconds"] if base.get(r["nbytes"]) and r.get("register_seconds") else None,
                 r.get("touch_seconds", 0) * 1e3 if r.get("touch_seconds") else None,
                 r.get("waived", "")]
                for r in results["registration"]]
        print(table("cudaHostRegister time by page backing (ferry pinned pool, one target chunk)",
                    ["N(GiB)", "backing", "Register(ms)", "Register(GB/s)", "x 4k", "Touch(ms)", "waived"], rows))


def records(results: dict) -> list[dict]:
    """The run's records (bench/records.py), per table (params "table"):
      time_to_pinned: seconds until N bytes are pinned per method (metric time,
        the median run, baseline cudaHostAlloc; time_min and time_max over the
        runs; the ferry-target+ rows' allocation time as
        alloc_time; pinned bytes as pinned_bytes; a failed run as error);
      recycle: alloc+free microseconds, ferry's pool beside cudaHostAlloc+
        cudaFreeHost (latency_median, latency_p99);
      python_recycle: the same from Python per call, beside torch's pinned cache;
      registration: cudaHostRegister seconds by page backing ("register 4k",
        "register thp", ...: time, baseline "register 4k"; bandwidth; a backing
        this machine could not give: state Waived, with why).
    Lower times are better: a ratio below 1 is faster than the baseline."""
    out = Records(PoolSuite.key)
    by_size: dict[int, dict] = {}
    for r in results.get("time_to_pinned") or []:
        by_size.setdefault(r["nbytes"], {})[r["method"]] = r
    for n, cases in by_size.items():
        params = {"table": "time_to_pinned", "nbytes": n}
        out.compare(params, "time", "s", {m: r.get("seconds") for m, r in cases.items()}, baseline="cudaHostAlloc")
        for m, r in cases.items():
            if m.startswith("ferry-target+") and r.get("alloc_seconds") is not None:
                out.add(m, "alloc_time", r["alloc_seconds"], "s", **params)
            runs = r.get("runs_seconds") or []
            if len(runs) > 1:  # the spread of the fresh processes
                out.add(m, "time_min", min(runs), "s", **params)
                out.add(m, "time_max", max(runs), "s", **params)
            if r.get("pinned_bytes"):
                out.add(m, "pinned_bytes", r["pinned_bytes"], "B", **params)
            if r.get("error"):
                out.add(m, "error", r["error"], None, **params)
    for r in results.get("recycle") or []:
        params = {"table": "recycle", "nbytes": r["nbytes"]}
        out.compare(params, "latency_median", "us", {"ferry pool alloc+free": r["ferry_median_us"],
                                                     "cudaHostAlloc+cudaFreeHost": r["cuda_median_us"]},
                    baseline="cudaHostAlloc+cudaFreeHost")
        out.add("ferry pool alloc+free", "latency_p99", r["ferry_p99_us"], "us", **params)
    py = results.get("python_recycle") or {}
    torch_case = "torch.empty(pin_memory=True)+del"
    for r in py.get("sizes") or []:
        params = {"table": "python_recycle", "nbytes": r["nbytes"], "zero_recycled": py.get("zero_recycled")}
        present = [name for name in PY_RECYCLE if name in r]
        for stat in ("median", "p99"):
            out.compare(params, f"latency_{stat}", "us", {name: r[name][f"{stat}_us"] for name in present},
                        baseline={name: torch_case for name in present if name != torch_case})
    if py.get("error"):
        out.add("python recycle", "error", py["error"], None, table="python_recycle")
    for r in results.get("registration") or []:
        params = {"table": "registration", "nbytes": r["nbytes"]}
        case = f"register {r['backing']}"
        if r.get("waived"):
            out.add(case, "state", "Waived", None, why=r["waived"], **params)
        if not r.get("register_seconds"):
            continue
        base = next((b.get("register_seconds") for b in results["registration"]
                     if b["backing"] == "4k" and b["nbytes"] == r["nbytes"] and not b.get("waived")), None)
        vs = base if r["backing"] != "4k" else None
        out.add(case, "time", r["register_seconds"], "s", baseline=vs, baseline_case="register 4k", **params)
        out.add(case, "bandwidth", r.get("register_gbps"), "GB/s", **params)
        if r.get("touch_seconds") is not None:
            out.add(case, "touch_time", r["touch_seconds"], "s", **params)
    return out.items


class PoolSuite(Suite):
    key = "pool"
    description = "pinned memory fast to get and to reuse: ferry's pool beside cudaHostAlloc and torch"

    def add_arguments(self, p):
        p.add_argument("--sizes", default="1G,8G", help="time-to-pinned sizes (default: %(default)s)")
        p.add_argument("--methods", default=",".join(METHODS),
                       help="time-to-pinned rows (default: %(default)s; also torch-pin_memory)")
        add_repeats(p, 3, "fresh processes per time-to-pinned row")
        p.add_argument("--register-sizes", default="1G,8G,32G", help="registration sizes (default: %(default)s)")
        p.add_argument("--recycle-repeats", type=int_at_least(1), default=2000, metavar="N",
                       help="recycle iterations per size (default: %(default)s)")
        deprecated_alias(p, "--iterations", "--recycle-repeats", "recycle_repeats", type=int_at_least(1))
        p.add_argument("--python-sizes", default="64K,1M,16M",
                       help="sizes of the Python recycle rows (default: %(default)s)")
        p.add_argument("--only", default="pinned,recycle,registration", help="tables to run (default: %(default)s)")
        p.add_argument("--reserve-hugetlb", action="store_true",
                       help="reserve hugetlb pages for the run (root; restored afterwards), so pools may use them")
        p.add_argument("--case", help=argparse.SUPPRESS)
        p.add_argument("--bytes", help=argparse.SUPPRESS)

    def waived(self, args):
        return None if args.case else super().waived(args)  # a --case child was started by a run

    def run(self, args) -> int:
        if args.case == "python-recycle":
            print(json.dumps(_python_recycle_case([int(x) for x in args.bytes.split(",")], blocks=200, per_block=100)))
            return 0
        if args.case:
            print(json.dumps(_case(args.case, int(args.bytes))))
            return 0
        only = set(args.only.split(","))
        results: dict = {}
        reg_sizes = parse_size_list(args.register_sizes)
        pin_sizes = parse_size_list(args.sizes)
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        saved = reserve_hugetlb(max(reg_sizes + pin_sizes)) if args.reserve_hugetlb else {}
        try:
            if "pinned" in only:
                results["time_to_pinned"] = time_to_pinned(pin_sizes, methods, args.repeats)
            if "recycle" in only:
                results["recycle"] = recycle_latency([4 * KiB << (2 * i) for i in range(8)], args.recycle_repeats)
                progress("recycle latency from Python (fresh process)")
                results["python_recycle"] = python_recycle(parse_size_list(args.python_sizes))
            if "registration" in only:
                results["registration"] = registration_by_backing(reg_sizes)
        finally:
            restore_hugetlb(saved)
        print_tables(results)
        write_json(args.json, self.key, records(results))
        return 0

SUITE = PoolSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
