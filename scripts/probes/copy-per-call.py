"""copy-per-call.py — ferry's copies as a Python user makes them, beside PyTorch's,
per call, and where the Python side's time goes. Median microseconds and GB/s.
Usage: python3 scripts/probes/copy-per-call.py [OUT.json]
"""

import json
import statistics
import sys
import time

import torch

import importlib

import ferry
import ferry.torch

fcopy = importlib.import_module("ferry.copy")  # the module (ferry.copy is also the function)

dev = torch.device("cuda", 0)
results = []


def med(f, reps):
    for _ in range(min(reps, 10)):
        f()
    t = []
    for _ in range(reps):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    return statistics.median(t) * 1e6


def report(what, n, us):
    gbps = n / us / 1e3 if n else 0
    results.append({"what": what, "bytes": n, "us": us, "gbps": gbps})
    print(f"{what:<52} {n >> 10:>8} KiB {us:10.2f} us {gbps:7.2f} GB/s", flush=True)


sizes = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20]
eng = fcopy.engine(0)
eng.warm_up()
for n in sizes:
    reps = 200 if n <= (1 << 20) else 40
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).random_(0, 255)
    pageable = torch.empty(n, dtype=torch.uint8).random_(0, 255)
    torch.cuda.synchronize()
    report("h2d pinned torch copy_", n, med(lambda: d.copy_(pinned), reps))
    report("h2d pinned ferry.copy(tensor)", n, med(lambda: ferry.copy(d, pinned), reps))
    report("h2d pinned engine.copy(int)", n, med(lambda: eng.copy(d.data_ptr(), pinned.data_ptr(), n), reps))
    s = torch.cuda.current_stream()
    report("h2d pinned ferry.copy_async(cur stream).wait", n,
           med(lambda: ferry.copy_async(d, pinned, stream=s).wait(), reps))
    report("d2h pinned torch copy_", n, med(lambda: pinned.copy_(d), reps))
    report("d2h pinned ferry.copy(tensor)", n, med(lambda: ferry.copy(pinned, d), reps))
    report("h2d pageable torch copy_", n, med(lambda: d.copy_(pageable), reps))
    report("h2d pageable ferry.copy auto", n, med(lambda: ferry.copy(d, pageable), reps))
    for st in ("staged", "pin-in-place"):
        report(f"h2d pageable ferry.copy {st}", n, med(lambda: ferry.copy(d, pageable, strategy=st), reps))
    report("d2h pageable torch copy_", n, med(lambda: pageable.copy_(d), reps))
    report("d2h pageable ferry.copy auto", n, med(lambda: ferry.copy(pageable, d), reps))
    report("d2h pageable ferry.copy staged", n, med(lambda: ferry.copy(pageable, d, strategy="staged"), reps))
    if n == 4 << 10:
        report("python: resolve(tensor)", 0, med(lambda: fcopy.resolve(d), 2000))
        report("python: engine() lookup", 0, med(lambda: fcopy.engine(0), 2000))
        report("python: d.data_ptr()", 0, med(lambda: d.data_ptr(), 2000))

# Batches from Python: 1024 x 64 KiB, lists of ints.
blk = 64 << 10
count = 1024
host = ferry.PinnedPool(device=0).alloc(blk * count * 2)
hb = torch.from_dlpack(host)
hb.random_(0, 255)
devb = torch.empty(blk * count * 2, dtype=torch.uint8, device=dev)
import random

idx = random.sample(range(count * 2), count)
base_h, base_d = hb.data_ptr(), devb.data_ptr()
srcs = [base_h + i * blk for i in idx]
dsts = [base_d + i * blk for i in idx]
sizes_l = [blk] * count
s = torch.cuda.current_stream()
report("batch 1024x64KiB h2d from Python lists", blk * count,
       med(lambda: ferry.copy_many(dsts, srcs, sizes_l, stream=s), 50))
report("batch 1024x64KiB d2h from Python lists", blk * count,
       med(lambda: ferry.copy_many(srcs, dsts, sizes_l, stream=s), 50))
import numpy as np

da, sa, za = np.array(dsts, dtype=np.int64), np.array(srcs, dtype=np.int64), np.array(sizes_l, dtype=np.int64)
report("batch 1024x64KiB h2d from int64 arrays", blk * count, med(lambda: ferry.copy_many(da, sa, za, stream=s), 50))
report("batch 1024x64KiB h2d: async call only (no wait)", 0,
       med(lambda: ferry.copy_many_async(dsts, srcs, sizes_l, stream=s), 50))
torch.cuda.synchronize()

# A transformer-shaped state dict (2 layers' worth), one call vs a loop.
shapes = [(4096, 4096)] * 4 + [(11008, 4096), (4096, 11008), (11008, 4096)] + [(4096,)] * 2
sd = {f"l{l}.{i}": torch.randn(sh).to(torch.bfloat16) for l in range(2) for i, sh in enumerate(shapes)}
nb = sum(t.numel() * t.element_size() for t in sd.values())
torch.cuda.synchronize()
report("state dict (2 layers) ferry.torch.to_device(dict)", nb,
       med(lambda: (ferry.torch.to_device(sd), torch.cuda.synchronize()), 5))
report("state dict (2 layers) .to('cuda') loop", nb,
       med(lambda: ({k: v.to("cuda") for k, v in sd.items()}, torch.cuda.synchronize()), 5))

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
