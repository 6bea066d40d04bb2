"""`ferry bench thp`: the gVisor report's table (gVisor issue 12804) for this machine.

Pageable device->host, pinned device->host and pageable host->device, for host
buffers backed by 4 KiB anonymous pages, THP anonymous pages, memfd (shmem) and
memfd with shmem THP, through CUDA's path (cudaMemcpy) and ferry's, in one run.
Under gVisor with shmem_enabled=always, CUDA's pageable device->host loses about
half its bandwidth because the driver's chunked pinning splits THP pages.

memfd with shmem THP needs /sys/kernel/mm/transparent_hugepage/shmem_enabled to
be advise (or always); with --set-shmem-advise (root) the setting is changed for
the run and always restored; without it, that row is waived when the setting
does not allow shmem THP.
"""

from __future__ import annotations

import sys

from ..measure import HostBuffer, median
from ..units import MiB, parse_size
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats

SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def shmem_setting() -> str | None:
    from ..facts.parsers import parse_thp_setting

    try:
        with open(SHMEM_ENABLED) as f:
            return parse_thp_setting(f.read())
    except OSError:
        return None


def set_shmem(value: str) -> bool:
    try:
        with open(SHMEM_ENABLED, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def measure(nbytes: int, iterations: int, backings: list[str]) -> list[dict]:
    from .. import _ferry
    from ..copy import engine

    eng = engine(0)
    eng.warm_up()
    dev = _ferry.cuda_malloc(nbytes)
    pinned = _ferry.cuda_host_alloc(nbytes)
    rows = []
    try:
        pinned_d2h = nbytes / median(_ferry.cuda_memcpy_async_ns(pinned, dev, nbytes, iterations))
        for backing in backings:
            progress(f"thp table: {backing}")
            buf = HostBuffer(nbytes, backing)
            row = {"backing": backing, "huge_bytes": buf.huge_bytes(), "pinned_d2h": pinned_d2h}
            row["cuda_pageable_d2h"] = nbytes / median(_ferry.cuda_memcpy_ns(buf.addr, dev, nbytes, iterations))
            row["cuda_pageable_h2d"] = nbytes / median(_ferry.cuda_memcpy_ns(dev, buf.addr, nbytes, iterations))
            row["ferry_pageable_d2h"] = nbytes / median(_ferry.copy_ns(eng, buf.addr, dev, nbytes, "auto", iterations))
            row["ferry_pageable_h2d"] = nbytes / median(_ferry.copy_ns(eng, dev, buf.addr, nbytes, "auto", iterations))
            rows.append(row)
            buf.close()
    finally:
        _ferry.cuda_free(dev)
        _ferry.cuda_free_host(pinned)
    return rows


def records(rows: list[dict], nbytes: int, shmem_enabled: str | None, waived: dict) -> list[dict]:
    """GB/s per backing and direction: ferry's pageable copy and CUDA's
    (cudaMemcpy, the baseline) on the same buffer, and pinned memory's d2h;
    params carry the buffer's huge bytes and the shmem_enabled setting; a
    backing this machine cannot give: state Waived, with why."""
    out = Records(ThpSuite.key)
    for r in rows:
        common = {"backing": r["backing"], "nbytes": nbytes, "huge_bytes": r["huge_bytes"],
                  "shmem_enabled": shmem_enabled}
        for direction in ("d2h", "h2d"):
            values = {"ferry pageable": r[f"ferry_pageable_{direction}"],
                      "cudaMemcpy pageable": r[f"cuda_pageable_{direction}"]}
            if direction == "d2h":
                values["cudaMemcpyAsync pinned"] = r["pinned_d2h"]
            out.compare({**common, "direction": direction}, "bandwidth", "GB/s", values,
                        baseline={"ferry pageable": "cudaMemcpy pageable"})
    for backing, why in waived.items():
        out.add("backing", "state", "Waived", None, backing=backing, nbytes=nbytes, shmem_enabled=shmem_enabled,
                why=why)
    return out.items


class ThpSuite(Suite):
    key = "thp"
    description = "copies by host page backing (4 KiB, THP, memfd, memfd + shmem THP): the gVisor report's table"

    def add_arguments(self, p):
        p.add_argument("--size", default="256M", help="buffer size (default: %(default)s)")
        add_repeats(p, 5, "timed copies per case", old=("--iterations",))
        p.add_argument("--set-shmem-advise", action="store_true",
                       help="set shmem_enabled=advise for the memfd-thp row (root), restored afterwards")

    def run(self, args) -> int:
        nbytes = parse_size(args.size)
        backings = ["4k", "thp", "memfd"]
        waived = {}
        original = shmem_setting()
        changed = False
        if original in ("advise", "always", "within_size", "force"):
            backings.append("memfd-thp")
        elif args.set_shmem_advise and original is not None:
            changed = set_shmem("advise")
            if changed:
                backings.append("memfd-thp")
            else:
                waived["memfd-thp"] = f"could not write {SHMEM_ENABLED} (needs root)"
        else:
            waived["memfd-thp"] = (f"shmem_enabled={original}: shmem THP is off "
                                   "(pass --set-shmem-advise to allow it for this run)")
        try:
            rows = measure(nbytes, args.repeats, backings)
        finally:
            if changed:
                set_shmem(original)
                progress(f"restored shmem_enabled={shmem_setting()}")
        out = [[r["backing"], r["huge_bytes"] // MiB, r["cuda_pageable_d2h"], r["ferry_pageable_d2h"],
                r["pinned_d2h"], r["cuda_pageable_h2d"], r["ferry_pageable_h2d"]] for r in rows]
        out += [[b, "-", "-", "-", "-", "-", f"waived: {why}"] for b, why in waived.items()]
        print(table(f"Copies of {nbytes // MiB} MiB by host backing (GB/s; shmem_enabled={original})",
                    ["backing", "huge MiB", "CUDA pageable d2h", "ferry pageable d2h", "pinned d2h",
                     "CUDA pageable h2d", "ferry pageable h2d"], out))
        write_json(args.json, self.key, records(rows, nbytes, original, waived))
        return 0


SUITE = ThpSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
