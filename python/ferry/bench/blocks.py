"""`ferry bench blocks`: many small blocks between pinned memory and the GPU.

The KV-cache offload pattern: N blocks of B bytes, scattered on both sides
(host blocks in order, device blocks shuffled), pinned pool <-> device, both
directions. Compared in one run: ferry's batch as it chooses (`auto`), forced
through the copy engines (`direct`: cudaMemcpyBatchAsync) and through its SM
copy kernel (`sm`), and a loop of cudaMemcpyAsync + one stream synchronize.
GB/s = total bytes / median time of a batch.
"""

from __future__ import annotations

import random
import sys

from ..measure import median
from ..units import KiB, parse_size
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats


def measure(counts_sizes, iterations):
    from .. import _ferry
    from ..copy import engine
    from ..pool import PinnedPool

    eng = engine(0)
    eng.warm_up()
    rows = []
    for count, size in counts_sizes:
        progress(f"{count} blocks of {size // KiB} KiB")
        total = count * size
        pool = PinnedPool(device=0, zero_recycled=False)
        host = pool.alloc(total, alignment=4096)
        dev = _ferry.cuda_malloc(total)
        try:
            order = list(range(count))
            random.Random(count * size).shuffle(order)
            h = [host.ptr + i * size for i in range(count)]
            d = [dev + order[i] * size for i in range(count)]
            sizes = [size] * count
            for direction, (dsts, srcs) in (("h2d", (d, h)), ("d2h", (h, d))):
                row = {"blocks": count, "block_bytes": size, "direction": direction}
                for label, strategy in (("ferry_auto", "auto"), ("ferry_ce", "direct"), ("ferry_sm", "sm")):
                    row[label] = total / median(_ferry.batch_ns(eng, dsts, srcs, sizes, strategy, iterations))
                row["memcpy_loop"] = total / median(_ferry.memcpy_loop_ns(dsts, srcs, sizes, iterations))
                rows.append(row)
        finally:
            _ferry.cuda_free(dev)
            host.release()
    return rows


CASES = {"ferry_auto": "ferry batch auto", "ferry_ce": "ferry batch direct", "ferry_sm": "ferry batch sm",
         "memcpy_loop": "cudaMemcpyAsync loop"}


def records(rows: list[dict]) -> list[dict]:
    """GB/s of each way of copying a batch, ferry's compared with the cudaMemcpyAsync loop."""
    out = Records(BlocksSuite.key)
    for r in rows:
        out.compare({"blocks": r["blocks"], "block_bytes": r["block_bytes"], "direction": r["direction"]},
                    "bandwidth", "GB/s", {case: r.get(key) for key, case in CASES.items()},
                    baseline="cudaMemcpyAsync loop")
    return out.items


class BlocksSuite(Suite):
    key = "blocks"
    description = "many small scattered blocks, pinned pool <-> GPU: ferry's batch beside a cudaMemcpyAsync loop"

    def add_arguments(self, p):
        p.add_argument("--blocks", default="1024x16K,1024x64K,1024x256K",
                       help="COUNTxSIZE list (default: %(default)s)")
        add_repeats(p, 10, "timed batches per case", old=("--iterations",))

    def run(self, args) -> int:
        cases = []
        for item in args.blocks.split(","):
            count, size = item.lower().split("x")
            cases.append((int(count), parse_size(size)))
        rows = measure(cases, args.repeats)
        out = [[r["blocks"], r["block_bytes"] // KiB, r["direction"], r["ferry_auto"], r["ferry_ce"], r["ferry_sm"],
                r["memcpy_loop"], r["ferry_auto"] / r["memcpy_loop"]] for r in rows]
        print(table("Scattered blocks, pinned pool <-> device (GB/s)",
                    ["Blocks", "Size(KiB)", "dir", "ferry auto", "ferry CE", "ferry SM", "cudaMemcpyAsync loop",
                     "auto x loop"], out))
        write_json(args.json, self.key, records(rows))
        return 0


SUITE = BlocksSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
