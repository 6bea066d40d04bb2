"""`ferry bench dataloader`: batches from worker processes to the GPU, the way a
training loop takes them.

The loaders:

  torch                 torch.utils.data.DataLoader(pin_memory=False), then .to(device, non_blocking=True)
  torch pin_memory      the same with pin_memory=True (PyTorch's pin thread)
  ferry                 ferry.torch.DataLoader(device="cuda"): workers collate into shared pinned slots

The dataset is cheap on purpose (each sample a slice of a per-worker random
pool), so what is measured is the loader's path, not the dataset. Each case
runs in a fresh process: batches/s and GB/s delivered to the GPU (batch bytes
over wall time, the GPU synchronized at the end), the main process's CPU time
per second of wall time (cores), its peak RSS growth over the run, and the
checksums of sampled batches, which must equal PyTorch's (same seed, same order).
GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .report import progress, table, write_json
from .suite import Suite, add_repeats, missing_module

DEFAULT_BATCHES = "uint8:256x3x224x224,float32:64x3x224x224,uint8:26x3x224x224"
LOADERS = ("torch", "torch pin_memory", "ferry")
SAMPLED = 8  # batches whose checksums are compared


def parse_batches(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """'uint8:256x3x224x224,...' -> [("uint8", (256, 3, 224, 224)), ...]."""
    from ..errors import InvalidArgumentError

    out = []
    for part in text.split(","):
        dtype, _, shape_text = part.strip().partition(":")
        try:
            shape = tuple(int(d) for d in shape_text.split("x"))
        except ValueError:
            shape = ()
        if dtype not in ("uint8", "float32", "float16", "bfloat16") or len(shape) < 2 or min(shape) < 1:
            raise InvalidArgumentError(f"--batches: bad batch {part!r} (expected e.g. uint8:256x3x224x224)")
        out.append((dtype, shape))
    return out


def default_workers(cpus: int) -> str:
    """The worker counts measured unless --workers says: min(8, CPUs) and min(14,
    CPUs - 2) (the main process and PyTorch's pin thread keep two): 8,14 on the
    16-CPU H200 machine the figures come from, 2 on a 2-CPU one."""
    counts = {min(8, cpus), min(14, cpus - 2)}
    return ",".join(str(n) for n in sorted(n for n in counts if n >= 1))


def parse_workers(text: str) -> list[int]:
    from ..errors import InvalidArgumentError

    try:
        out = [int(w) for w in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise InvalidArgumentError(f"--workers: expected worker counts >= 1 like 8,14, not {text!r}")
    return out


class Frames:
    """Samples that are slices of a random pool made once per worker (a
    torch.utils.data map-style dataset; the DataLoader tests use it too)."""

    def __init__(self, n: int, shape, dtype: str, pool_items: int = 32):
        self.n, self.shape, self.dtype, self.pool_items = n, tuple(shape), dtype, pool_items
        self._pool = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._pool is None:
            import torch

            g = torch.Generator().manual_seed(1234)
            pool = torch.randint(0, 256, (self.pool_items, *self.shape), generator=g, dtype=torch.uint8)
            self._pool = pool.to(getattr(torch, self.dtype))
        return self._pool[i % self.pool_items]


def run_case(loader_name: str, dtype: str, shape, workers: int, seconds: float, prefetch: int) -> dict:
    """One loader, one batch shape, one worker count; runs in its own process."""
    import resource
    import time

    import torch

    batch, sample = shape[0], shape[1:]
    ds = Frames(1 << 30, sample, dtype)
    common = dict(batch_size=batch, shuffle=False, num_workers=workers, prefetch_factor=prefetch,
                  persistent_workers=False)
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=dev)  # the CUDA context before the clock starts
    if loader_name == "ferry":
        import ferry.torch as ft

        loader = ft.DataLoader(ds, device=dev, **common)
    else:
        loader = torch.utils.data.DataLoader(ds, pin_memory=loader_name == "torch pin_memory", **common)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sums = []
    it = iter(loader)
    batches = 0
    warm = 2 * workers * prefetch  # the first windows: workers starting, slots being made
    start = cpu0 = None
    profile = None
    if os.environ.get("FERRY_BENCH_PROFILE"):  # where the main process's time goes (cProfile, top 25 to stderr)
        import cProfile

        profile = cProfile.Profile()
    for x in it:
        x = x if x.is_cuda else x.to(dev, non_blocking=True)
        if len(sums) < SAMPLED:
            sums.append(int(x.view(torch.uint8).view(-1)[::4099].long().sum()))
        batches += 1
        if batches == warm:
            torch.cuda.synchronize()
            start, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            counted = 0
            if profile:
                profile.enable()
        elif start is not None:
            counted += 1
            if counted % 16 == 0 and time.perf_counter() - start >= seconds:
                break
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if profile:
        import pstats

        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    del it
    nbytes = batch * int(torch.tensor([], dtype=getattr(torch, dtype)).element_size())
    for d in sample:
        nbytes *= d
    return {
        "batches_per_s": counted / wall,
        "gbps": counted * nbytes / wall / 1e9,
        "main_cores": (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / wall,
        "peak_rss_growth_bytes": (cpu1.ru_maxrss - rss0) * 1024,
        "batch_bytes": nbytes,
        "checksums": sums,
    }


class DataLoaderSuite(Suite):
    key = "dataloader"
    description = "worker batches to the GPU: ferry.torch.DataLoader beside PyTorch's (pin_memory on/off)"

    def add_arguments(self, p):
        p.add_argument("--batches", default=DEFAULT_BATCHES,
                       help="dtype:shape of each batch (default: %(default)s)")
        from ..measure import usable_cpus

        cpus = usable_cpus()
        p.add_argument("--workers", default=default_workers(cpus),
                       help=f"worker counts (default: {default_workers(cpus)}, from the {cpus} CPUs this "
                            "process may use: min(8, CPUs) and min(14, CPUs - 2))")
        p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run of a case (default: %(default)s)")
        add_repeats(p, 1, "timed runs per case, each in a fresh process; the run of median GB/s is shown")
        p.add_argument("--prefetch", type=int, default=2, help="prefetch_factor, PyTorch's (default: %(default)s)")
        p.add_argument("--loaders", default=",".join(LOADERS),
                       help="which loaders, comma-separated (default: %(default)s)")
        p.add_argument("--case", help=argparse_suppress())

    def check_arguments(self, args):
        from ..errors import InvalidArgumentError

        args.batch_list = parse_batches(args.batches)
        args.worker_list = parse_workers(args.workers)
        args.loader_list = [x.strip() for x in args.loaders.split(",")]
        unknown = [x for x in args.loader_list if x not in LOADERS]
        if unknown or not args.loader_list:
            raise InvalidArgumentError(f"--loaders: unknown {unknown}; known: {', '.join(LOADERS)}")
        if not args.seconds > 0 or args.prefetch < 1:
            raise InvalidArgumentError("--seconds must be > 0 and --prefetch >= 1")

    def waived(self, args):
        self.check_arguments(args)  # a typo is caught on any machine
        why = missing_module("torch")
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA device (torch.cuda.is_available() is False)"
        return None

    def run(self, args) -> int:
        if args.case:  # a child: one case, JSON on stdout
            c = json.loads(args.case)
            print(json.dumps(run_case(c["loader"], c["dtype"], c["shape"], c["workers"], args.seconds, args.prefetch)))
            return 0
        records, rows, failed = [], [], False
        for dtype, shape in args.batch_list:
            for workers in args.worker_list:
                got = {}
                for name in args.loader_list:
                    progress(f"{name}: {dtype} {'x'.join(map(str, shape))}, {workers} workers")
                    case = json.dumps({"loader": name, "dtype": dtype, "shape": shape, "workers": workers})
                    runs = []
                    for _ in range(args.repeats):
                        r = subprocess.run([sys.executable, "-m", "ferry.bench.dataloader", "--case", case,
                                            "--seconds", str(args.seconds), "--prefetch", str(args.prefetch)],
                                           capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
                        if r.returncode != 0:
                            print(f"{name} failed:\n{r.stderr[-3000:]}", file=sys.stderr)
                            failed = True
                            break
                        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
                    if len(runs) == args.repeats:  # the run of median GB/s (the lower middle of an even count)
                        got[name] = sorted(runs, key=lambda x: x["gbps"])[(len(runs) - 1) // 2]
                base = got.get("torch pin_memory")
                ours = got.get("ferry")
                verified = bool(base and ours and base["checksums"] == ours["checksums"])
                if base and ours and not verified:
                    print(f"checksums differ: torch {base['checksums']} ferry {ours['checksums']}", file=sys.stderr)
                    failed = True
                label = f"{dtype} {'x'.join(map(str, shape))}"
                for name, res in got.items():
                    ratio = ours["gbps"] / res["gbps"] if ours and name != "ferry" else None
                    rows.append([label, workers, name, res["batch_bytes"] / 1e6, res["batches_per_s"], res["gbps"],
                                 res["main_cores"], res["peak_rss_growth_bytes"] / 1e9,
                                 "-" if name == "ferry" else (f"{ratio:.1f}x" if ratio else "-"),
                                 "yes" if verified else "no"])
                    params = {"loader": name, "dtype": dtype, "shape": list(shape), "workers": workers,
                              "prefetch_factor": args.prefetch}
                    baseline = base["gbps"] if name == "ferry" and base else None
                    for metric, value, unit in (("delivered", res["gbps"], "GB/s"),
                                                ("batches", res["batches_per_s"], "batches/s"),
                                                ("main_process_cpu", res["main_cores"], "cores"),
                                                ("peak_rss_growth", res["peak_rss_growth_bytes"], "bytes")):
                        records.append({"suite": self.key, "case": f"{name} {label} w{workers}", "params": params,
                                        "metric": metric, "value": value, "unit": unit,
                                        "baseline": baseline if metric == "delivered" else None,
                                        "ratio": value / baseline if metric == "delivered" and baseline else None})
        print(table("batches to the GPU (GB/s = 1e9 B/s; ferry/x = ferry's GB/s over this loader's)",
                    ["batch", "workers", "loader", "MB", "batches/s", "GB/s", "main cores", "peak RSS +GB",
                     "ferry/x", "same data"], rows))
        write_json(args.json, self.key, records)
        return 1 if failed else 0


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


SUITE = DataLoaderSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
