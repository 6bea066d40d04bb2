"""`ferry bench pool`: pinned host memory that is fast to get and fast to reuse.

Three tables, ferry beside its baselines in the same run:
  1. time until N bytes are pinned and usable, each case in a fresh process:
     ferry PinnedPool(target_bytes=N) ready, one ferry allocation of N,
     cudaHostAlloc(N), torch.empty(N, pin_memory=True), tensor.pin_memory();
  2. recycled alloc+free latency, 4 KiB .. 64 MiB: ferry pool vs
     cudaHostAlloc+cudaFreeHost vs PyTorch's caching host allocator;
  3. registration time by page backing (4 KiB, THP, hugetlb 2 MiB, hugetlb 1 GiB)
     at 1, 8, 32 GiB; hugetlb cases need pages reserved (--reserve-hugetlb, root;
     restored afterwards) and are waived otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from ..measure import median, percentile
from ..units import GiB, KiB, MiB, parse_size_list
from .report import progress, table, write_json
from .suite import Suite

HUGETLB_DIR = "/sys/kernel/mm/hugepages/hugepages-{kb}kB/nr_hugepages"


# ---- 1. time to pinned ---------------------------------------------------------

def _case(method: str, nbytes: int) -> dict:
    """Runs in a fresh process: time one way of getting nbytes pinned."""
    from .. import _ferry
    from ..pool import PinnedPool

    if method.startswith("torch"):
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")
    else:
        _ferry.cuda_warm_up(0)
    result: dict = {"method": method, "nbytes": nbytes}
    t0 = time.perf_counter()
    if method == "ferry-pool":
        pool = PinnedPool(device=0, target_bytes=nbytes)
        pool.wait_ready()
        result["seconds"] = time.perf_counter() - t0
        st = pool.stats()
        result["pinned_bytes"] = st["huge"]["reserved"]["current"] + st["small"]["reserved"]["current"]
        result["touch_seconds"] = st["touch_seconds"]
        result["register_seconds"] = st["register_seconds"]
        result["chunks"] = st["chunks"]
    elif method == "ferry-alloc":
        pool = PinnedPool(device=0)
        buf = pool.alloc(nbytes)
        result["seconds"] = time.perf_counter() - t0
        st = pool.stats()
        result["pinned_bytes"] = st["huge"]["reserved"]["current"] + st["small"]["reserved"]["current"]
        result["chunks"] = st["chunks"]
        t1 = time.perf_counter()
        buf.release()
        pool.trim()
        result["free_seconds"] = time.perf_counter() - t1
    elif method == "cudaHostAlloc":
        alloc_s, free_s = _ferry.cuda_host_alloc_seconds(nbytes, 0)
        result.update(seconds=alloc_s, free_seconds=free_s, pinned_bytes=nbytes)
    elif method == "torch-empty":
        import torch

        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        result["seconds"] = time.perf_counter() - t0
        stats = getattr(torch.cuda, "host_memory_stats", lambda: {})()
        result["pinned_bytes"] = stats.get("reserved_bytes.current", stats.get("allocated_bytes.current"))
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
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"method": method, "nbytes": nbytes, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def have_torch_cuda() -> bool:
    r = subprocess.run(
        [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
        capture_output=True,
    )
    return r.returncode == 0


def time_to_pinned(sizes: list[int]) -> list[dict]:
    methods = ["ferry-pool", "ferry-alloc", "cudaHostAlloc"]
    if have_torch_cuda():
        methods += ["torch-empty", "torch-pin_memory"]
    results = []
    for n in sizes:
        for m in methods:
            progress(f"time to pinned: {m} {n // MiB} MiB")
            results.append(run_case(m, n))
    return results


# ---- 2. recycled alloc+free ----------------------------------------------------

def recycle_latency(sizes: list[int], iterations: int) -> list[dict]:
    from .. import _ferry
    from ..pool import PinnedPool

    pool = PinnedPool(device=0, zero_recycled=False)
    try:
        import torch

        torch_ok = torch.cuda.is_available()
    except ImportError:
        torch_ok = False
    rows = []
    for n in sizes:
        progress(f"recycle latency {n // KiB} KiB")
        ferry_ns = _ferry.pool_recycle_ns(pool._native, n, 256, iterations)
        cuda_iters = max(5, min(iterations, int(2e8 // max(n, 1))))
        cuda_ns = _ferry.cuda_host_alloc_free_ns(n, cuda_iters, 0)
        row = {
            "nbytes": n,
            "ferry_median_us": median(ferry_ns) / 1e3,
            "ferry_p99_us": percentile(ferry_ns, 99) / 1e3,
            "cuda_median_us": median(cuda_ns) / 1e3,
            "cuda_p99_us": percentile(cuda_ns, 99) / 1e3,
        }
        if torch_ok:
            t_ns = []
            torch.empty(n, dtype=torch.uint8, pin_memory=True)  # warm the cache
            for _ in range(min(iterations, 2000)):
                t0 = time.perf_counter_ns()
                t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                del t
                t_ns.append(time.perf_counter_ns() - t0)
            row["torch_median_us"] = median(t_ns) / 1e3
            row["torch_p99_us"] = percentile(t_ns, 99) / 1e3
        rows.append(row)
    return rows


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
                pool = PinnedPool(device=0, target_bytes=n, zero_recycled=False, **opts)
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

def print_tables(results: dict) -> None:
    if results.get("time_to_pinned"):
        rows = []
        by_size: dict[int, dict] = {}
        for r in results["time_to_pinned"]:
            by_size.setdefault(r["nbytes"], {})[r["method"]] = r
        for n, cases in by_size.items():
            base = cases.get("cudaHostAlloc", {}).get("seconds")
            for m, r in cases.items():
                s = r.get("seconds")
                rows.append([
                    f"{n // MiB}", m,
                    s * 1e3 if s else None,
                    (r.get("pinned_bytes") or 0) / MiB if r.get("pinned_bytes") else None,
                    base / s if base and s else None,
                    r.get("error", ""),
                ])
        print(table("Time until N bytes are pinned and usable (fresh process each)",
                    ["N(MiB)", "method", "Time(ms)", "Pinned(MiB)", "x cudaHostAlloc", "note"], rows))
        print()
    if results.get("recycle"):
        rows = [[r["nbytes"] // KiB, r["ferry_median_us"], r["ferry_p99_us"], r["cuda_median_us"],
                 r.get("torch_median_us"), r.get("torch_p99_us"),
                 r["cuda_median_us"] / r["ferry_median_us"] if r["ferry_median_us"] else None]
                for r in results["recycle"]]
        print(table("Recycled alloc+free latency (torch: Python loop, includes ~1 us of Python)",
                    ["Size(KiB)", "ferry Median(us)", "ferry p99(us)", "cudaHostAlloc+Free Median(us)",
                     "torch Median(us)", "torch p99(us)", "x cuda"], rows))
        print()
    if results.get("registration"):
        base = {r["nbytes"]: r.get("register_seconds") for r in results["registration"] if r["backing"] == "4k"}
        rows = [[r["nbytes"] // GiB, r["backing"],
                 r["register_seconds"] * 1e3 if r.get("register_seconds") else None,
                 r.get("register_gbps"),
                 base.get(r["nbytes"]) / r["register_seconds"] if base.get(r["nbytes"]) and r.get("register_seconds") else None,
                 r.get("touch_seconds", 0) * 1e3 if r.get("touch_seconds") else None,
                 r.get("waived", "")]
                for r in results["registration"]]
        print(table("cudaHostRegister time by page backing (ferry pinned pool, 512 MiB / 1 GiB chunks)",
                    ["N(GiB)", "backing", "Register(ms)", "Register(GB/s)", "x 4k", "Touch(ms)", "waived"], rows))


class PoolSuite(Suite):
    key = "pool"
    description = "pinned memory fast to get and to reuse: ferry's pool beside cudaHostAlloc and torch"

    def add_arguments(self, p):
        p.add_argument("--sizes", default="64M,1G,8G", help="time-to-pinned sizes (default: %(default)s)")
        p.add_argument("--register-sizes", default="1G,8G,32G", help="registration sizes (default: %(default)s)")
        p.add_argument("--iterations", type=int, default=2000,
                       help="recycle iterations per size (default: %(default)s)")
        p.add_argument("--only", default="pinned,recycle,registration", help="tables to run (default: %(default)s)")
        p.add_argument("--reserve-hugetlb", action="store_true",
                       help="reserve hugetlb pages for the run (root; restored afterwards), so pools may use them")
        p.add_argument("--case", help=argparse.SUPPRESS)
        p.add_argument("--bytes", type=int, help=argparse.SUPPRESS)

    def waived(self, args):
        return None if args.case else super().waived(args)  # a --case child was started by a run

    def run(self, args) -> int:
        if args.case:
            print(json.dumps(_case(args.case, args.bytes)))
            return 0
        only = set(args.only.split(","))
        results: dict = {}
        reg_sizes = parse_size_list(args.register_sizes)
        pin_sizes = parse_size_list(args.sizes)
        saved = reserve_hugetlb(max(reg_sizes + pin_sizes)) if args.reserve_hugetlb else {}
        try:
            if "pinned" in only:
                results["time_to_pinned"] = time_to_pinned(pin_sizes)
            if "recycle" in only:
                results["recycle"] = recycle_latency([4 * KiB << (2 * i) for i in range(8)], args.iterations)
            if "registration" in only:
                results["registration"] = registration_by_backing(reg_sizes)
        finally:
            restore_hugetlb(saved)
        print_tables(results)
        write_json(args.json, self.key, results)
        return 0


SUITE = PoolSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
