#!/usr/bin/env python3
"""Probe (issue 29): which backing makes ferry's pinned memory cheap to fork without
costing anything else. Each case in a fresh process, GPU machine only:

  anon-thp        PinnedPool() chunks as ferry makes them (anonymous, THP; with this
                  tree's code MADV_DONTFORK, with older code copied at fork)
  memfd           PinnedPool(memfd=True): shmem, MAP_SHARED (4 KiB pages where
                  shmem_enabled=never)
  memfd-hugetlb   PinnedPool(memfd=True, huge_pages="hugetlb") (needs reserved pages:
                  --reserve-hugetlb reserves them for the run and restores the count)

Per case: seconds until --bytes (default 8 GiB) are pinned and ready (target_bytes,
wait_ready), the pinned copy rate of 1 GiB of that memory to and from the GPU (torch
non_blocking copy_, median of 5, CUDA events), and os.fork() holding it (median of 5)
with the child's Private_Dirty right after fork, beside a fork holding nothing.
Prints one JSON line per case ("probe": ...) and a table.

    python3 scripts/probes/fork-candidates.py [--bytes 8G] [--cases anon-thp,memfd] [--reserve-hugetlb]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = {"anon-thp": {}, "memfd": {"memfd": True}, "memfd-hugetlb": {"memfd": True, "huge_pages": "hugetlb"}}


def private_dirty() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) << 10
    return 0


def fork_figures(n: int = 5):
    times, private = [], []
    for _ in range(n):
        r, w = os.pipe()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.write(w, str(private_dirty()).encode())
            os._exit(0)
        times.append(time.perf_counter() - t0)
        os.close(w)
        private.append(int(os.read(r, 64)))
        os.close(r)
        os.waitpid(pid, 0)
    return sorted(times)[n // 2], max(private)


def run_case(name: str, nbytes: int) -> dict:
    import ferry
    import torch

    base_fork, base_private = fork_figures()
    t0 = time.perf_counter()
    pool = ferry.PinnedPool(target_bytes=nbytes, **CASES[name])
    pool.wait_ready()
    ready_s = time.perf_counter() - t0
    buf = pool.alloc(nbytes, alignment=2 << 20)
    host = torch.from_dlpack(buf)
    host.fill_(3)
    n = min(nbytes, 1 << 30)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = {}
    for direction in ("h2d", "d2h"):
        times = []
        for _ in range(6):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            if direction == "h2d":
                dev.copy_(host[:n], non_blocking=True)
            else:
                host[:n].copy_(dev, non_blocking=True)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        rates[direction] = n / sorted(times[1:])[len(times[1:]) // 2] / 1e9
    torch.cuda.synchronize()
    held_fork, held_private = fork_figures()
    stats = pool.stats()
    return {"probe": "fork-candidates", "case": name, "bytes": nbytes, "ready_s": ready_s,
            "h2d_gbps": rates["h2d"], "d2h_gbps": rates["d2h"], "fork_s": held_fork, "fork_nothing_s": base_fork,
            "child_private_bytes": held_private, "child_private_nothing_bytes": base_private,
            "notes": stats.get("notes", []), "ferry": ferry.__file__}


def reserve_hugetlb(pages: int):
    path = "/proc/sys/vm/nr_hugepages"
    with open(path) as f:
        before = int(f.read())
    with open(path, "w") as f:
        f.write(str(before + pages))
    return before


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="8G")
    p.add_argument("--cases", default="anon-thp,memfd,memfd-hugetlb")
    p.add_argument("--reserve-hugetlb", action="store_true")
    p.add_argument("--label", default="", help="a label for the records (e.g. the tree's commit)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    from ferry.units import parse_size

    nbytes = parse_size(args.bytes)
    if args.case:
        print(json.dumps(run_case(args.case, nbytes)))
        return 0
    restore = None
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "memfd-hugetlb" in cases and args.reserve_hugetlb:
        restore = reserve_hugetlb(nbytes // (2 << 20) + 16)
    try:
        print(f"{'case':14} {'ready s':>8} {'h2d GB/s':>9} {'d2h GB/s':>9} {'fork ms':>8} {'(none)':>7} "
              f"{'child MiB':>9} {'(none)':>7}  {args.label}")
        for case in cases:
            r = subprocess.run([sys.executable, __file__, "--bytes", args.bytes, "--case", case],
                               capture_output=True, text=True, timeout=300)
            lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
            if r.returncode != 0 or not lines:
                print(f"{case:14} failed (exit {r.returncode}):")
                print("  " + "\n  ".join((r.stderr or r.stdout).strip().splitlines()[-6:]))
                continue
            rec = json.loads(lines[-1])
            rec["label"] = args.label
            print(f"{case:14} {rec['ready_s']:8.3f} {rec['h2d_gbps']:9.1f} {rec['d2h_gbps']:9.1f} "
                  f"{rec['fork_s'] * 1e3:8.1f} {rec['fork_nothing_s'] * 1e3:7.1f} "
                  f"{rec['child_private_bytes'] >> 20:9d} {rec['child_private_nothing_bytes'] >> 20:7d}"
                  f"  {'; '.join(rec['notes'])}")
            print(json.dumps(rec))
    finally:
        if restore is not None:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(restore))
    return 0


if __name__ == "__main__":
    sys.exit(main())
