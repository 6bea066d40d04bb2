"""`ferry bench uvm`: the UVM study's GCN training, under PyTorch's allocator and
ferry's.

The study (2-layer GCN, RTX 5090 32 GB, PyTorch 2.9, CUDA 12.8) measured epoch
times at 5M nodes: PyTorch's caching allocator 1.14 s, a cudaMalloc allocator
1.89 s, managed memory 34.2 s, managed memory prefetched on allocation 5.57 s.
This suite trains the same model (128 input features, hidden 256, 10 classes,
a random graph with 10 edges per node plus self loops, symmetric GCN
normalization, full-graph Adam steps) at each node count that fits the device,
under five configurations, each in its own process (PyTorch can choose its
allocator once per process):

  pytorch                 PyTorch's default caching allocator (the baseline)
  device                  ferry's cudaMalloc/cudaFree allocator
  managed                 ferry's cudaMallocManaged allocator, no prefetch
  managed+prefetch        the same, prefetched to the device on allocation
  managed_pool+prefetch   ferry's pooled managed allocator, prefetch on allocation

It prints the median epoch time after warm-up, the ratio to PyTorch's, the
study's figure and ratio beside it, and peak memory; --json writes everything,
--plot a PNG. Propagation is a sparse CSR x dense product in row chunks
(--impl sparse, plain PyTorch); --impl pyg uses torch_geometric's GCNConv on
the same normalized adjacency. A node count whose estimated footprint exceeds
the free device memory is skipped, with the reason: nothing here asks for more
managed memory than the device has (and ferry's allocators refuse to).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from .records import Records
from .report import progress, table, write_json
from .suite import NEEDS, Suite, Waived, add_repeats

GB = 1e9
FEATURES, HIDDEN, CLASSES, EDGES_PER_NODE = 128, 256, 10, 10

# name -> (ferry allocator or None, its options)
CONFIGS = {
    "pytorch": (None, {}),
    "device": ("device", {}),
    "managed": ("managed", {"prefetch": False}),
    "managed+prefetch": ("managed", {"prefetch": True}),
    "managed_pool+prefetch": ("managed_pool", {"prefetch": "alloc"}),
}

# The study's figures (RTX 5090 32 GB): epoch seconds at 5M nodes, and its
# memory estimates by node count.
STUDY = {
    "epoch_s": {5_000_000: {"pytorch": 1.14, "device": 1.89, "managed": 34.2, "managed+prefetch": 5.57}},
    "memory_gb": {5_000_000: 23, 7_000_000: 32, 10_000_000: 45, 15_000_000: 68},
    "setup": "2-layer GCN, RTX 5090 32 GB, PyTorch 2.9, CUDA 12.8",
}

DEFAULT_NODES = "1M,3M,5M,7M,10M,15M"
BYTES_PER_NODE = 8 << 10  # this implementation's peak is about 6-7 KiB per node; margin included


# ---- pure helpers (tested without a GPU) --------------------------------------------------


def parse_nodes(text: str) -> list[int]:
    """'1M,3M,500K,2000' -> [1000000, 3000000, 500000, 2000] (decimal units)."""
    from ..errors import InvalidArgumentError

    out = []
    for part in text.split(","):
        p = part.strip().upper()
        if not p:
            continue
        mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(p[-1], 1)
        num = p[:-1] if mult != 1 else p
        try:
            n = int(float(num) * mult)
        except ValueError:
            raise InvalidArgumentError(f"'{part}' is not a node count (expected e.g. 5M, 500K, 2000)") from None
        if n < 100:
            raise InvalidArgumentError(f"'{part}': at least 100 nodes")
        out.append(n)
    if not out:
        raise InvalidArgumentError("no node counts given")
    return out


def parse_configs(text: str) -> list[str]:
    """'pytorch, managed' -> ["pytorch", "managed"]; an unknown name is an error."""
    from ..errors import InvalidArgumentError

    configs = [c.strip() for c in text.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            raise InvalidArgumentError(f"unknown configuration '{c}' (configurations: {', '.join(CONFIGS)})")
    return configs


def estimate_bytes(nodes: int) -> int:
    """A conservative peak footprint of one training process at `nodes`."""
    return nodes * BYTES_PER_NODE + (1 << 30)


def plan(node_counts: list[int], configs: list[str], free_bytes: int | None, fraction: float = 0.9):
    """(runs, skipped): runs are (nodes, config) in order; node counts whose
    estimate exceeds fraction * free_bytes are skipped with the reason."""
    runs, skipped = [], []
    for n in node_counts:
        need = estimate_bytes(n)
        if free_bytes is not None and need > fraction * free_bytes:
            skipped.append({"nodes": n, "why": f"needs about {need / GB:.0f} GB, "
                                               f"{free_bytes / GB:.0f} GB free on the device"})
            continue
        runs.extend((n, c) for c in configs)
    return runs, skipped


def parse_result(stdout: str) -> dict | None:
    """The worker's last 'RESULT {json}' line."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


def add_ratios(rows: list[dict]) -> list[dict]:
    """Adds ratio_to_pytorch (this run's), study_s and study_ratio to each row."""
    base = {r["nodes"]: r.get("epoch_s_median") for r in rows if r["config"] == "pytorch"}
    for r in rows:
        b, t = base.get(r["nodes"]), r.get("epoch_s_median")
        r["ratio_to_pytorch"] = t / b if (b and t) else None
        study = STUDY["epoch_s"].get(r["nodes"], {})
        r["study_s"] = study.get(r["config"])
        r["study_ratio"] = (study[r["config"]] / study["pytorch"]) if r["config"] in study else None
        r["study_memory_gb"] = STUDY["memory_gb"].get(r["nodes"])
    return rows


def human_nodes(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}K" if n >= 10**3 else str(n)


def render(rows: list[dict], epochs: int, warmup: int) -> str:
    def x(v):
        return f"{v:.2f}x" if v else "-"

    out = [[human_nodes(r["nodes"]), r["config"], r.get("epoch_s_median"), x(r.get("ratio_to_pytorch")),
            r.get("study_s"), x(r.get("study_ratio")),
            (r["peak_bytes"] / GB) if r.get("peak_bytes") else None,
            r.get("study_memory_gb"), r.get("error", "")[:60] if r.get("error") else ""] for r in rows]
    return table(f"2-layer GCN epoch time, median of {epochs} epochs after {warmup} warm-up "
                 f"(study: {STUDY['setup']})",
                 ["nodes", "allocator", "epoch s", "vs pytorch", "study s", "study vs pytorch",
                  "peak GB", "study GB", "error"], out)


# ---- the model (any torch device; the worker runs it on CUDA) --------------------------------


def build_graph(torch, nodes: int, device, seed: int = 0, chunk_rows: int = 1_000_000):
    """Row chunks of the normalized adjacency D^-1/2 (A+I) D^-1/2 and of its
    transpose, as CSR tensors: (blocks, blocks_t), each a list of
    (row0, row1, csr). Edges are random (10 per node), degrees are in-degrees
    with self loops, as torch_geometric's gcn_norm computes them."""
    g = torch.Generator(device=device).manual_seed(seed)
    e = nodes * EDGES_PER_NODE
    src = torch.randint(0, nodes, (e,), device=device, generator=g)
    dst = torch.randint(0, nodes, (e,), device=device, generator=g)
    loops = torch.arange(nodes, device=device)
    row, col = torch.cat([dst, loops]), torch.cat([src, loops])
    del src, dst, loops
    deg = torch.bincount(row, minlength=nodes).to(torch.float32)
    dinv = deg.pow(-0.5)
    val = dinv[row] * dinv[col]
    del deg, dinv

    def chunks(r, c):
        a = torch.sparse_coo_tensor(torch.stack([r, c]), val, (nodes, nodes)).coalesce().to_sparse_csr()
        crow, cols, vals = a.crow_indices(), a.col_indices(), a.values()
        out = []
        for r0 in range(0, nodes, chunk_rows):
            r1 = min(nodes, r0 + chunk_rows)
            lo, hi = int(crow[r0]), int(crow[r1])
            out.append((r0, r1, torch.sparse_csr_tensor(crow[r0:r1 + 1] - lo, cols[lo:hi], vals[lo:hi],
                                                        (r1 - r0, nodes))))
        return out

    blocks = chunks(row, col)
    blocks_t = chunks(col, row)
    return blocks, blocks_t


def spmm(torch, blocks, x):
    out = torch.empty(blocks[-1][1], x.shape[1], device=x.device, dtype=x.dtype)
    for r0, r1, a in blocks:
        out[r0:r1] = torch.sparse.mm(a, x)
    return out


def make_propagate(torch):
    class Propagate(torch.autograd.Function):
        """y = A x; dL/dx = A^T dL/dy (A is constant)."""

        @staticmethod
        def forward(ctx, x, blocks, blocks_t):
            ctx.blocks_t = blocks_t
            return spmm(torch, blocks, x)

        @staticmethod
        def backward(ctx, grad):
            return spmm(torch, ctx.blocks_t, grad.contiguous()), None, None

    return Propagate


def make_model(torch, impl: str, blocks, blocks_t, device):
    nn = torch.nn
    if impl == "pyg":
        from torch_geometric.nn import GCNConv

        # GCNConv on the same normalized adjacency: adj_t[i, j] weighs j -> i.
        adj = torch.cat([b[2].to_sparse_coo() for b in blocks], 0) if len(blocks) > 1 else blocks[0][2]
        adj_t = adj.to_sparse_csr()

        class PygGCN(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = GCNConv(FEATURES, HIDDEN, normalize=False)
                self.c2 = GCNConv(HIDDEN, CLASSES, normalize=False)

            def forward(self, x):
                return self.c2(self.c1(x, adj_t).relu(), adj_t)

        return PygGCN().to(device)

    propagate = make_propagate(torch)

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(FEATURES, HIDDEN, bias=False)
            self.b1 = nn.Parameter(torch.zeros(HIDDEN))
            self.l2 = nn.Linear(HIDDEN, CLASSES, bias=False)
            self.b2 = nn.Parameter(torch.zeros(CLASSES))

        def forward(self, x):  # as GCNConv: transform, propagate, add bias
            h = (propagate.apply(self.l1(x), blocks, blocks_t) + self.b1).relu()
            return propagate.apply(self.l2(h), blocks, blocks_t) + self.b2

    return GCN().to(device)


def train(torch, nodes: int, device, epochs: int, warmup: int, impl: str = "sparse", seed: int = 0,
          chunk_rows: int = 1_000_000, on_epoch=None) -> dict:
    """Builds the graph, features and labels on `device` and times full-graph
    training epochs. Returns {epoch_s: [...], setup_s, loss}."""
    cuda = torch.device(device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    blocks, blocks_t = build_graph(torch, nodes, device, seed, chunk_rows)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(nodes, FEATURES, device=device, generator=g)
    y = torch.randint(0, CLASSES, (nodes,), device=device, generator=g)
    model = make_model(torch, impl, blocks, blocks_t, device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sync()
    setup_s = time.perf_counter() - t0
    times, loss = [], None
    for i in range(warmup + epochs):
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t)
        if on_epoch:
            on_epoch(i)
    return {"epoch_s": times, "setup_s": setup_s, "loss": float(loss.item())}


# ---- one configuration in this process ---------------------------------------------------------


def worker(config: str, nodes: int, epochs: int, warmup: int, impl: str, chunk_rows: int) -> dict:
    name, options = CONFIGS[config]
    if name:  # before anything touches CUDA
        from .. import torch as ft

        ft.use_allocator(name, **options)
    import torch

    dev = torch.device("cuda", 0)
    used_peak = [0]

    def sample(_):
        free, total = torch.cuda.mem_get_info(dev)
        used_peak[0] = max(used_peak[0], total - free)

    result = {"config": config, "nodes": nodes, "impl": impl}
    try:
        r = train(torch, nodes, dev, epochs, warmup, impl, chunk_rows=chunk_rows, on_epoch=sample)
        result.update(r)
        result["epoch_s_median"] = statistics.median(r["epoch_s"])
    except Exception as e:  # OOM and friends: reported in the table, not a crash
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if name:
        from .. import torch as ft

        s = ft.allocator_stats(name)
        result["peak_bytes"] = s["allocated_peak"]
        result["reserved_peak_bytes"] = s["reserved_peak"]
        result["prefetched_bytes"] = s["prefetched_bytes"]
        result["allocator_failures"] = s["failures"]
        if s["failures"]:
            result["allocator_last_failure"] = s["last_failure"]
    else:
        result["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        result["reserved_peak_bytes"] = torch.cuda.max_memory_reserved(dev)
    result["device_used_peak_bytes"] = used_peak[0]
    result["torch"] = torch.__version__
    return result


def _probe() -> dict:
    import torch

    free, total = torch.cuda.mem_get_info(0)
    try:
        import torch_geometric  # noqa: F401

        pyg = True
    except Exception:
        pyg = False
    return {"free": free, "total": total, "name": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "torch_geometric": pyg}


def _have_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _run_child(args: list[str], timeout: float) -> tuple[dict | None, str]:
    cmd = [sys.executable, "-m", "ferry.bench.uvm", *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    r = parse_result(p.stdout)
    if r is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return None, f"exit {p.returncode}: " + " | ".join(tail)
    return r, ""


def plot(path: str, rows: list[dict]) -> None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        progress("no plot: needs matplotlib (pip install matplotlib)")
        return
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for config in CONFIGS:
        pts = sorted((r["nodes"] / 1e6, r["epoch_s_median"]) for r in rows
                     if r["config"] == config and r.get("epoch_s_median"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
    for config, s in STUDY["epoch_s"][5_000_000].items():
        ax.plot([5], [s], marker="x", linestyle="none", color="gray")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (millions)")
    ax.set_ylabel("epoch time (s, log scale); x = the study at 5M")
    ax.set_title("2-layer GCN training under each allocator")
    ax.legend(fontsize=8)
    fig.savefig(path, format="png", dpi=100)
    progress(f"wrote {path}")


def records(rows: list[dict], skipped: list[dict], params: dict, probe: dict | None = None) -> list[dict]:
    """Per node count and allocator (case = the configuration): the median
    epoch time (metric epoch_time, baseline pytorch, this run's), the peak
    memories, the setup time and the final loss; a run that failed: metric error; a node count skipped: state
    Skipped with why; the study's own epoch times as cases "study: CONFIG"
    (baseline "study: pytorch"); the device's free and total bytes at the start.
    params: the model's settings (nodes, epochs, warmup, impl, chunk_rows)."""
    out = Records(UvmSuite.key)
    by_nodes: dict[int, dict] = {}
    for r in rows:
        by_nodes.setdefault(r["nodes"], {})[r["config"]] = r
    for nodes, runs in by_nodes.items():
        p = {**params, "nodes": nodes}
        out.compare(p, "epoch_time", "s", {c: r.get("epoch_s_median") for c, r in runs.items()}, baseline="pytorch")
        for c, r in runs.items():
            for key, metric, unit in (("peak_bytes", "peak_memory", "B"),
                                      ("reserved_peak_bytes", "reserved_peak_memory", "B"),
                                      ("device_used_peak_bytes", "device_used_peak_memory", "B"),
                                      ("setup_s", "setup_time", "s"), ("loss", "loss", None)):
                if isinstance(r.get(key), (int, float)):
                    out.add(c, metric, r[key], unit, **p)
            if r.get("error"):
                out.add(c, "error", r["error"], None, **p)
    for s in skipped:
        out.add("all", "state", "Skipped", None, why=s.get("why"), **{**params, "nodes": s["nodes"]})
    for nodes, study in STUDY["epoch_s"].items():
        out.compare({"nodes": nodes, "setup": STUDY["setup"]}, "epoch_time", "s",
                    {f"study: {c}": s for c, s in study.items()}, baseline="study: pytorch")
    for nodes, gb in STUDY["memory_gb"].items():
        out.add("study", "memory_estimate", gb, "GB", nodes=nodes, setup=STUDY["setup"])
    if probe:
        for key in ("free", "total"):
            if isinstance(probe.get(key), (int, float)):
                out.add("device", f"{key}_memory", probe[key], "B", name=probe.get("name"), torch=probe.get("torch"))
    return out.items


class UvmSuite(Suite):
    key = "uvm"
    description = "the UVM study's GCN training under PyTorch's allocator and ferry's managed allocators"

    def add_arguments(self, p):
        p.add_argument("--nodes", default=DEFAULT_NODES, help="node counts (default: %(default)s)")
        p.add_argument("--configs", default=",".join(CONFIGS),
                       help="configurations, in order (default: %(default)s)")
        add_repeats(p, 3, "timed epochs, the median", old=("--epochs",))
        p.add_argument("--warmup", type=int, default=1, help="untimed epochs first (default: %(default)s)")
        p.add_argument("--impl", choices=("sparse", "pyg"), default="sparse",
                       help="propagation: plain PyTorch CSR chunks, or torch_geometric's GCNConv "
                            "(default: %(default)s)")
        p.add_argument("--chunk-rows", type=int, default=1_000_000,
                       help="rows per propagation chunk (default: %(default)s)")
        p.add_argument("--timeout", type=float, default=1800,
                       help="seconds per configuration (default: %(default)s)")
        p.add_argument("--plot", metavar="FILE", help="write a PNG of epoch time by node count")
        p.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
        p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)

    def waived(self, args):
        """Bad arguments are errors even where the suite would be waived; then the
        device, then PyTorch."""
        if args.probe or args.worker:  # children the run started
            return None
        parse_configs(args.configs)
        parse_nodes(args.nodes)
        why = super().waived(args)
        if why is None and not _have_torch():
            why = NEEDS["torch"]
        return why

    def run(self, args) -> int:
        if args.probe:
            print("RESULT " + json.dumps(_probe()), flush=True)
            return 0
        if args.worker:
            n = parse_nodes(args.nodes)[0]
            print("RESULT " + json.dumps(worker(args.worker, n, args.repeats, args.warmup, args.impl,
                                                args.chunk_rows)), flush=True)
            return 0
        probe, why = _run_child(["--probe"], 300)
        if probe is None:
            print(f"ferry bench uvm: failed: the probe process could not use the GPU: {why}")
            return 1
        if args.impl == "pyg" and not probe["torch_geometric"]:
            raise Waived("--impl pyg needs torch_geometric")
        progress(f"uvm: {probe['name']}, {probe['free'] / GB:.0f} of {probe['total'] / GB:.0f} GB free, "
                 f"torch {probe['torch']}, impl {args.impl}")
        runs, skipped = plan(parse_nodes(args.nodes), parse_configs(args.configs), probe["free"])
        for s in skipped:
            progress(f"uvm: {human_nodes(s['nodes'])} nodes skipped: {s['why']}")
        rows = []
        for i, (n, config) in enumerate(runs, 1):
            progress(f"uvm: {human_nodes(n)} nodes, {config} ({i}/{len(runs)}) ...")
            t0 = time.monotonic()
            r, why = _run_child(["--worker", config, "--nodes", str(n), "--repeats", str(args.repeats),
                                 "--warmup", str(args.warmup), "--impl", args.impl,
                                 "--chunk-rows", str(args.chunk_rows)], args.timeout)
            if r is None:
                r = {"config": config, "nodes": n, "error": why}
            rows.append(r)
            done = (f"{r['epoch_s_median']:.3f} s/epoch" if r.get("epoch_s_median")
                    else f"failed: {r.get('error')}")
            progress(f"uvm: {human_nodes(n)} nodes, {config}: {done} ({time.monotonic() - t0:.0f} s)")
        add_ratios(rows)
        print(render(rows, args.repeats, args.warmup))
        for s in skipped:
            print(f"{human_nodes(s['nodes'])} nodes: skipped ({s['why']})")
        model = {"features": FEATURES, "hidden": HIDDEN, "classes": CLASSES, "edges_per_node": EDGES_PER_NODE,
                 "impl": args.impl, "chunk_rows": args.chunk_rows, "epochs": args.repeats, "warmup": args.warmup}
        write_json(args.json, self.key, records(rows, skipped, model, probe))
        if args.plot:
            plot(args.plot, rows)
        return 0


SUITE = UvmSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
