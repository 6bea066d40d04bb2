"""`ferry bench load`: a safetensors checkpoint to the GPU, ferry beside the
ways people load one today, in one run.

Writes a test checkpoint (--preset dense: 12 layers of bf16 4096x4096 q/k/v/o,
11008x4096 gate/up and 4096x11008 down matrices and two 4096-element norms,
4.86 GB in 108 tensors; --preset moe: 12 layers of 64 experts, 2,388 tensors
of 2 MiB and less in bf16 and f32, 5.24 GB in 8 shards), then loads it with:
ferry (`ferry.torch.load_safetensors`), safetensors
`load_file(device="cuda")`, `load_file` + `.to("cuda")` per tensor,
`load_file` + `ferry.torch.to_device` per tensor and on the whole dict,
and, where installed, fastsafetensors (`fastsafe_open(..., nogds=True)`),
InstantTensor (`safe_open` with its default, BUFFERED and MMAP backends),
runai-model-streamer (`SafetensorsStreamer`) and tensorizer (its own
format, written from the reference first; `num_readers` 16); a peer that
is not installed is reported as such. Page cache warm (median of --repeats),
then, where this process may drop the page cache (root), cold: the file's
sequential read rate (one thread, 16 MiB reads, like dd) and a parallel
O_DIRECT read are measured in the same run, then each path once after
`echo 3 > /proc/sys/vm/drop_caches`. Every load is compared bit for bit with
safetensors' own CPU load. "host MB" is the peak anonymous memory (RssAnon)
the load added, sampled every 5 ms. --transformers also times a
transformers model: `from_pretrained` beside `from_config` +
`load_safetensors(files, out=model.state_dict())`. --json writes records
{suite, case, params, metric, value, unit, baseline, ratio} (`records`),
with the run's details beside them.

--first-loads N (issue 40 item 2): ferry and InstantTensor MMAP (where
installed), each in N fresh processes one after another, torch, ferry and the
CUDA context ready before timing, the page cache warm: the first call (ferry:
its default loader, pinned staging and reader threads, made first and timed
apart), the second load in the same process and one after
torch.cuda.empty_cache(), beside the warm in-process median; every load bit
for bit against safetensors' CPU read. --ranks N (N >= 2, item 3): N processes
at once, one per GPU, each loading the whole checkpoint with ferry to its own
GPU, released together each of --repeats rounds (a barrier), beside one
alone: GB/s per rank, their sum and N x the checkpoint / the slowest rank;
waived where the machine has fewer than N GPUs. A process that fails or does
not answer within --child-timeout is reported and ended (load_procs.py,
load_child.py, load_modes.py). Not yet measured on a GPU.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from ..units import MiB, parse_size
from .load_checkpoint import _ST_DTYPES, PRESETS, apply_preset, checkpoint_tensors, write_checkpoint
from .load_checkpoint import layer_tensors, moe_tensors  # noqa: F401 - ferry.bench.load's names before the split
from .load_measures import drop_page_cache, parallel_direct_read_rate, sequential_read_rate
from .load_measures import DROP_CACHES, PeakAnon, rss_anon_bytes, same_bits  # noqa: F401 - as above
from .load_methods import _loader, methods, run_once, transformers_case, warm_runs, write_tensorizer_file
from . import load_modes
from .load_procs import CHILD_TIMEOUT_S
from .load_methods import TENSORIZER_FILE, TENSORIZER_READERS, _why_not  # noqa: F401 - as above (the tests use _why_not)
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, add_repeats, int_at_least, size, missing_module


# ---- main ---------------------------------------------------------------------------

class LoadSuite(Suite):
    key = "load"
    description = ("a safetensors checkpoint to the GPU: ferry beside safetensors, fastsafetensors and "
                   "InstantTensor, warm and cold")

    def add_arguments(self, p):
        p.add_argument("--dir", help="where to write the checkpoint (default: a new directory under $TMPDIR)")
        p.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
        p.add_argument("--preset", choices=sorted(PRESETS), default="dense",
                       help="the checkpoint: dense (12 Llama layers, 4.86 GB, 108 tensors) or moe (12 layers of 64 "
                            "experts, 5.24 GB, 2,388 tensors of 2 MiB, mixed dtypes, 8 shards); the options below "
                            "change it (default: %(default)s)")
        p.add_argument("--layers", type=int_at_least(1), help="layers (dense and moe: 12)")
        p.add_argument("--hidden", type=int_at_least(1), help="hidden size (dense: 4096, moe: 2048)")
        p.add_argument("--intermediate", type=int_at_least(1), help="MLP size, of each expert with --experts (dense: 11008, moe: 512)")
        p.add_argument("--experts", type=int_at_least(0), help="experts per layer, 0 for a dense MLP (dense: 0, moe: 64)")
        p.add_argument("--dtype", choices=sorted(_ST_DTYPES), default="bf16",
                       help="dtype of the matrices (default: %(default)s; moe keeps router and norms in f32)")
        p.add_argument("--shards", type=int_at_least(1), help="files (dense: 1, moe: 8)")
        add_repeats(p, 3, "timed warm loads per path")
        p.add_argument("--staging", type=size, default="512M", help="ferry's pinned staging (default: %(default)s)")
        p.add_argument("--threads", type=int_at_least(0), default=0, help="ferry's reader threads; 0 = one per core (max 16)")
        p.add_argument("--no-cold", action="store_true", help="skip the cold (page cache dropped) runs")
        p.add_argument("--only", action="append", help="only paths whose label contains this (repeatable)")
        p.add_argument("--transformers", type=int_at_least(0), default=0, metavar="LAYERS",
                       help="also time a bf16 Llama (hidden 2048) of LAYERS layers: from_pretrained vs ferry")
        p.add_argument("--first-loads", type=int_at_least(0), default=0, metavar="N",
                       help="also time the first load of a fresh process, in N processes per path (ferry, "
                            "InstantTensor MMAP), beside the second load and the warm in-process median; "
                            "0: off (default: %(default)s)")
        p.add_argument("--ranks", type=int_at_least(1), default=1, metavar="N",
                       help="N >= 2: also N processes at once, one per GPU, each loading the whole checkpoint "
                            "with ferry (--repeats rounds, started together), beside one alone; waived with "
                            "fewer GPUs (default: %(default)s)")
        p.add_argument("--child-timeout", type=int_at_least(1), default=int(CHILD_TIMEOUT_S), metavar="SECONDS",
                       help="how long --first-loads and --ranks wait for a process to be ready and for each "
                            "result; one that does not answer is reported and killed (default: %(default)s)")

    def check_args(self, args) -> None:
        load_modes.check(args)

    def waived(self, args):
        why = super().waived(args)
        if why:
            return why
        return missing_module("torch", "safetensors")

    def run(self, args) -> int:
        import torch

        args.staging = parse_size(args.staging)  # checked by argparse, kept as text for --help
        args.loaders = {}
        apply_preset(args)
        tensors = checkpoint_tensors(args)
        own_dir = args.dir is None
        directory = args.dir or tempfile.mkdtemp(prefix="ferry-bench-load-")
        os.makedirs(directory, exist_ok=True)
        try:
            status = _run(args, torch, tensors, directory)
            rec = records(args.results)
            write_json(args.json, self.key, rec, details=args.results)
            return status
        finally:
            args.loaders.clear()  # frees ferry's pinned staging
            if not args.keep:
                if own_dir:
                    shutil.rmtree(directory, ignore_errors=True)
                else:
                    for f in os.listdir(directory):
                        if f.startswith("model") and f.endswith((".safetensors", ".index.json", ".tensors")):
                            os.remove(os.path.join(directory, f))


def _run(args, torch, tensors, directory) -> int:
    t0 = time.perf_counter()
    paths = write_checkpoint(directory, tensors, args.shards, seed=1)
    os.sync()  # no writeback during the runs
    progress(f"wrote {len(paths)} file(s), {sum(os.path.getsize(x) for x in paths) / 1e9:.2f} GB, "
             f"in {time.perf_counter() - t0:.1f} s")
    from safetensors.torch import load_file

    ref = {}
    for x in paths:
        ref.update({k: v.cuda() for k, v in load_file(x).items()})  # the reference, on the GPU for comparison
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in ref.values())  # GB/s are of tensor bytes
    ms = methods(args, torch)
    if any(label.startswith("tensorizer") and not why for label, _, why, _ in ms):
        try:
            args.tensorizer_file = write_tensorizer_file(directory, ref)
        except Exception as e:  # noqa: BLE001 - a peer that cannot write its file is waived, not fatal
            why = f"could not write its file ({type(e).__name__}: {e})"
            ms = [(m[0], m[1], why if m[0].startswith("tensorizer") else m[2], m[3]) for m in ms]
    results = {"checkpoint": {"preset": args.preset, "files": len(paths), "bytes": nbytes, "tensors": len(tensors),
                              "layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate,
                              "experts": args.experts, "dtype": args.dtype,
                              "dtypes": sorted({d for _, _, d in tensors})},
               "staging_bytes": args.staging, "warm": {}, "cold": {}, "waived": {}}
    for label, fn, why, is_ferry in ms:
        if why:
            results["waived"][label] = why
            progress(f"{label}: waived: {why}")
            continue
        progress(f"warm: {label}")
        try:
            r = warm_runs(torch, fn, paths, ref, args.repeats, _loader(args, is_ferry))
        except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal; ferry's is
            if is_ferry:
                raise
            results["waived"][label] = f"failed: {type(e).__name__}: {e}"
            progress(f"{label}: failed: {e}")
            continue
        r["gb_per_s"] = nbytes / r["median_s"] / 1e9
        results["warm"][label] = r
    _fresh_processes(args, torch, paths, nbytes, results)
    _cold_runs(args, torch, ms, paths, ref, nbytes, results)
    if args.transformers:
        progress("transformers: from_pretrained vs from_config + load_safetensors")
        try:
            results["transformers"] = transformers_case(torch, directory, args.transformers)
        except Exception as e:  # noqa: BLE001
            results["transformers"] = {"failed": f"{type(e).__name__}: {e}"}
    print_report(results, nbytes)
    args.results = results  # LoadSuite.run writes them
    return 0 if (all(r.get("verified", True) for part in ("warm", "cold") for r in results[part].values())
                 and load_modes.passed(results)) else 1


def _fresh_processes(args, torch, paths, nbytes, results) -> None:
    """--first-loads and --ranks (load_modes.py): in processes of their own, the
    page cache warm (read once more here), this process's cached device memory
    given back first."""
    if not args.first_loads and args.ranks < 2:
        return
    torch.cuda.empty_cache()
    sequential_read_rate(paths)
    if args.first_loads:
        load_modes.run_first_loads(args, paths, nbytes, results,
                                   lambda label: None if label == "ferry" else _why_not("instanttensor"))
    if args.ranks > 1:
        sequential_read_rate(paths)
        load_modes.run_ranks(args, paths, nbytes, results, load_modes.gpu_count())


def _cold_runs(args, torch, ms, paths, ref, nbytes, results) -> None:
    """Each path once after the page cache is dropped, beside the file's read rates."""
    cold_why = None if not args.no_cold else "--no-cold"
    if cold_why is None:
        cold_why = drop_page_cache()
    if cold_why is not None:
        results["cold_waived"] = cold_why
        return
    results["cold"][SEQUENTIAL_READ] = {"gb_per_s": sequential_read_rate(paths)}
    drop_page_cache()
    results["cold"]["parallel O_DIRECT read (16 threads)"] = {"gb_per_s": parallel_direct_read_rate(paths)}
    for label, fn, why, is_ferry in ms:
        if why or label not in results["warm"]:
            continue
        drop_page_cache()
        progress(f"cold: {label}")
        try:
            r = run_once(torch, fn, paths, ref, _loader(args, is_ferry))
        except Exception as e:  # noqa: BLE001
            if is_ferry:
                raise
            results["cold"][label] = {"failed": f"{type(e).__name__}: {e}"}
            continue
        r["gb_per_s"] = nbytes / r["seconds"] / 1e9
        results["cold"][label] = r


SEQUENTIAL_READ = "sequential read (1 thread, 16 MiB)"


def _is_ferry(label: str) -> bool:
    return label.startswith("ferry")


def records(results: dict) -> list[dict]:
    """The run as records (bench/records.py): per path (the case) and page
    cache state (params cache: warm or cold) its bandwidth, the host memory
    it added and, for ferry, the time spent outside the loader (catalog,
    tensors, ranges). ferry's warm bandwidth has the best other path of the
    run as baseline, its cold one the file's sequential read rate; transformers:
    from_config + load_safetensors against from_pretrained, in seconds."""
    cp = results["checkpoint"]
    common = {"preset": cp["preset"], "checkpoint_bytes": cp["bytes"], "tensors": cp["tensors"], "files": cp["files"],
              "dtypes": "/".join(cp["dtypes"])}
    out = Records(LoadSuite.key)
    for cache in ("warm", "cold"):
        rows = {k: v for k, v in results[cache].items() if "gb_per_s" in v}
        peers = {k: v["gb_per_s"] for k, v in rows.items() if not _is_ferry(k) and k != SEQUENTIAL_READ
                 and not k.startswith("parallel O_DIRECT")}
        best_peer = max(peers, key=peers.get) if peers else None
        base_case = best_peer if cache == "warm" else (SEQUENTIAL_READ if SEQUENTIAL_READ in rows else None)
        for label, r in rows.items():
            base = base_case if _is_ferry(label) and base_case else None
            out.add(label, "bandwidth", r["gb_per_s"], "GB/s", baseline=rows[base]["gb_per_s"] if base else None,
                    baseline_case=base, cache=cache, verified=r.get("verified"), **common)
            if "host_added_bytes" in r:
                out.add(label, "host_memory_added", r["host_added_bytes"] / MiB, "MiB", cache=cache, **common)
            if "outside_s" in r.get("loader", {}):
                out.add(label, "time_outside_loader", r["loader"]["outside_s"] * 1e3, "ms", cache=cache, **common)
    load_modes.records(out, results, common)
    tr = results.get("transformers")
    if tr and "failed" not in tr:
        out.add("from_config + load_safetensors", "time", tr["from_config_s"] + tr["load_safetensors_s"], "s",
                baseline=tr["from_pretrained_s"], baseline_case="from_pretrained(device_map=cuda)",
                verified=tr["verified"], model_bytes=tr["bytes"], files=tr["files"])
        out.add("from_pretrained(device_map=cuda)", "time", tr["from_pretrained_s"], "s", model_bytes=tr["bytes"],
                files=tr["files"])
    return out.items


def print_report(results: dict, nbytes: int) -> None:
    cp = results["checkpoint"]
    seq = results["cold"].get(SEQUENTIAL_READ, {}).get("gb_per_s")
    rows = []
    for label, w in results["warm"].items():
        c = results["cold"].get(label, {})
        rows.append([label, w["gb_per_s"], nbytes / min(w["seconds"]) / 1e9, c.get("gb_per_s"),
                     (c["gb_per_s"] / seq) if c.get("gb_per_s") and seq else None,
                     w["host_added_bytes"] / MiB, "yes" if w["verified"] and c.get("verified", True) else "NO"])
    for label, c in results["cold"].items():
        if label not in results["warm"] and "gb_per_s" in c and label.endswith(")"):
            rows.append([label, None, None, c["gb_per_s"], (c["gb_per_s"] / seq) if seq else None, None, "-"])
    kind = f"{cp['experts']} experts x {cp['layers']} layers" if cp["experts"] else f"{cp['layers']} layers"
    print(table(f"Loading {cp['files']} file(s), {nbytes / 1e9:.2f} GB ({cp['preset']}: {cp['tensors']} "
                f"{'/'.join(cp['dtypes'])} tensors, {kind}) to cuda:0; GB/s",
                ["path", "warm GB/s", "warm best", "cold GB/s", "cold / seq read", "host MB added", "bit-exact"], rows))
    for label, why in results["waived"].items():
        print(f"  {label}: {why}")
    for part in ("warm", "cold"):
        for label, r in results[part].items():
            ld = r.get("loader")
            if not ld:
                continue
            print(f"  {part} {label}: {ld['reads']} reads ({ld['direct_reads']} O_DIRECT), "
                  f"{ld['outside_s'] * 1e3:.1f} ms outside the loader (catalog, tensors, ranges), staged "
                  f"{ld['staged_bytes'] / 1e9:.2f} GB, {ld['threads']} threads "
                  f"(NUMA node {ld['numa_node'] if ld['numa_node'] is not None and ld['numa_node'] >= 0 else '-'}), "
                  f"staging "
                  f"{ld['staging_bytes'] / MiB:.0f} MiB" + "".join(f"; note: {n}" for n in ld["notes"]))
    if "cold_waived" in results:
        print(f"  cold runs waived: {results['cold_waived']}")
    load_modes.print_first_loads(results)
    load_modes.print_ranks(results)
    warm = results["warm"]
    ferry_rows = {k: v for k, v in warm.items() if k.startswith("ferry")}
    peers = {k: v for k, v in warm.items() if not k.startswith("ferry")}
    if ferry_rows and peers:
        fk = max(ferry_rows, key=lambda k: ferry_rows[k]["gb_per_s"])
        pk = max(peers, key=lambda k: peers[k]["gb_per_s"])
        print(f"warm: {fk} {ferry_rows[fk]['gb_per_s']:.1f} GB/s vs the best other path, {pk}, "
              f"{peers[pk]['gb_per_s']:.1f} GB/s ({ferry_rows[fk]['gb_per_s'] / peers[pk]['gb_per_s']:.2f}x)")
    tr = results.get("transformers")
    if tr and "failed" not in tr:
        print(f"transformers Llama, {tr['bytes'] / 1e9:.2f} GB in {tr['files']} file(s): from_pretrained "
              f"{tr['from_pretrained_s']:.2f} s; from_config {tr['from_config_s']:.2f} s + load_safetensors "
              f"{tr['load_safetensors_s']:.2f} s = {tr['from_config_s'] + tr['load_safetensors_s']:.2f} s "
              f"({'same weights' if tr['verified'] else 'WEIGHTS DIFFER'})")
    elif tr:
        print(f"transformers: {tr['failed']}")


SUITE = LoadSuite()
main = SUITE.main

if __name__ == "__main__":
    sys.exit(main())
