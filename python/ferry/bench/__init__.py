"""`ferry bench SUITE`: each suite prints ferry beside its baseline, measured in
the same run, with the ratio, and writes JSON with the machine's facts."""

SUITES = {
    "apiperf": "ferry.bench.apiperf",
    "blocks": "ferry.bench.blocks",
    "copy": "ferry.bench.copy",
    "latency": "ferry.bench.latency",
    "load": "ferry.bench.load",
    "sanity": "ferry.bench.sanity",
    "thp": "ferry.bench.thp",
    "pool": "ferry.bench.pool",
    "uvm": "ferry.bench.uvm",
}
