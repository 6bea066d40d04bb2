"""`ferry bench load`: a safetensors checkpoint to the GPU, ferry beside the
ways people load one today, in one run.

Writes a test checkpoint (--preset dense: 12 layers of bf16 4096x4096 q/k/v/o,
11008x4096 gate/up and 4096x11008 down matrices and two 4096-element norms,
4.86 GB in 108 tensors; --preset moe: 12 layers of 64 experts, 2,388 tensors
of 2 MiB and less in bf16 and f32, 5.24 GB in 8 shards), then loads it with:
ferry (``ferry.torch.load_safetensors``), safetensors
``load_file(device="cuda")``, ``load_file`` + ``.to("cuda")`` per tensor,
``load_file`` + ``ferry.torch.to_device`` per tensor and on the whole dict,
and, where installed, fastsafetensors (``fastsafe_open(..., nogds=True)``),
InstantTensor (``safe_open`` with its default, BUFFERED and MMAP backends),
runai-model-streamer (``SafetensorsStreamer``) and tensorizer (its own
format, written from the reference first; ``num_readers`` 16); a peer that
is not installed is reported as such. Page cache warm (median of --repeats),
then, where this process may drop the page cache (root), cold: the file's
sequential read rate (one thread, 16 MiB reads, like dd) and a parallel
O_DIRECT read are measured in the same run, then each path once after
``echo 3 > /proc/sys/vm/drop_caches``. Every load is compared bit for bit with
safetensors' own CPU load. "host MB" is the peak anonymous memory (RssAnon)
the load added, sampled every 5 ms. --transformers also times a
transformers model: ``from_pretrained`` beside ``from_config`` +
``load_safetensors(files, out=model.state_dict())``. --json writes records
{suite, case, params, metric, value, unit, baseline, ratio} (``records``),
with the run's details beside them.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import threading
import time

from ..measure import median
from ..units import MiB, parse_size
from .records import Records
from .report import progress, table, write_json
from .suite import Suite, int_at_least, size

DROP_CACHES = "/proc/sys/vm/drop_caches"
_ST_DTYPES = {"bf16": ("BF16", "bfloat16", 2), "f16": ("F16", "float16", 2), "f32": ("F32", "float32", 4)}


# ---- the checkpoint ------------------------------------------------------------

def layer_tensors(layers: int, hidden: int, intermediate: int, dtype: str = "bf16") -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of a Llama-shaped stack, in file order."""
    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{n}_proj.weight", (hidden, hidden), dtype) for n in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (intermediate, hidden), dtype),
                (p + "mlp.up_proj.weight", (intermediate, hidden), dtype),
                (p + "mlp.down_proj.weight", (hidden, intermediate), dtype)]
        out += [(p + "input_layernorm.weight", (hidden,), dtype), (p + "post_attention_layernorm.weight", (hidden,), dtype)]
    return out


def moe_tensors(layers: int, hidden: int, experts: int, expert_intermediate: int,
                dtype: str = "bf16") -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of a Mixtral/Qwen-MoE-shaped stack, in file order:
    per layer the attention matrices and `experts` gate/up/down matrices of
    `dtype`, the router and the norms in f32 (mixed dtypes, as MoE checkpoints
    keep them)."""
    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{n}_proj.weight", (hidden, hidden), dtype) for n in "qkvo"]
        out.append((p + "mlp.gate.weight", (experts, hidden), "f32"))
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (expert_intermediate, hidden), dtype),
                    (q + "up_proj.weight", (expert_intermediate, hidden), dtype),
                    (q + "down_proj.weight", (hidden, expert_intermediate), dtype)]
        out += [(p + "input_layernorm.weight", (hidden,), "f32"), (p + "post_attention_layernorm.weight", (hidden,), "f32")]
    return out


# --preset: the checkpoint's shape; each value is the default of its option.
PRESETS = {
    # 12 Llama layers of bf16 4096x4096, 11008x4096, 4096x11008 matrices: 4.86 GB, 108 tensors
    "dense": {"layers": 12, "hidden": 4096, "intermediate": 11008, "experts": 0, "shards": 1},
    # 12 MoE layers of 64 experts, bf16 512x2048 / 2048x512 matrices (2 MiB each), bf16
    # 2048x2048 attention, f32 router and norms: 5.24 GB, 2,388 tensors in 8 shards
    "moe": {"layers": 12, "hidden": 2048, "intermediate": 512, "experts": 64, "shards": 8},
}


def apply_preset(args) -> None:
    """Fills the checkpoint options left unset from --preset."""
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name in ("layers", "hidden", "intermediate", "shards"):
        if getattr(args, name) < 1:
            raise SystemExit(f"ferry bench load: --{name}={getattr(args, name)}: expected >= 1")
    if args.experts < 0:
        raise SystemExit(f"ferry bench load: --experts={args.experts}: expected >= 0")


def checkpoint_tensors(args) -> list[tuple[str, tuple, str]]:
    if args.experts:
        return moe_tensors(args.layers, args.hidden, args.experts, args.intermediate, args.dtype)
    return layer_tensors(args.layers, args.hidden, args.intermediate, args.dtype)


def write_checkpoint(directory: str, tensors: list, shards: int, seed: int) -> list[str]:
    """Streams random tensors [(name, shape, dtype)] into `shards` safetensors
    files (header first, padded to 8 bytes as safetensors does); never holds
    more than one tensor."""
    import torch

    gen_device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=gen_device).manual_seed(seed)
    per = [tensors[i::shards] for i in range(shards)]  # interleave so shards are even
    paths = []
    for s, group in enumerate(per):
        name = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt", "writer": "ferry bench load"}}, 0
        for tname, shape, dtype in group:
            st_name, _, n = _ST_DTYPES[dtype]
            for d in shape:
                n *= d
            header[tname] = {"dtype": st_name, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * ((8 - (8 + len(raw)) % 8) % 8)
        path = os.path.join(directory, name)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _, shape, dtype in group:
                tdt = getattr(torch, _ST_DTYPES[dtype][1])
                t = torch.randn(shape, generator=g, device=gen_device, dtype=torch.float32).to(tdt)
                f.write(t.cpu().contiguous().view(torch.uint8).numpy().tobytes())
        paths.append(path)
    if shards > 1:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {t: os.path.basename(paths[i % shards])
                                                      for i, (t, _, _) in enumerate(tensors)}}, f)
    return paths


# ---- measuring -------------------------------------------------------------------

def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """Peak RssAnon growth over a block, sampled every 5 ms by a thread."""

    def __enter__(self):
        self.base = self.peak = rss_anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_anon_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_bytes())
        self.added = self.peak - self.base
        return False


def drop_page_cache() -> str | None:
    """None when the page cache was dropped, else why not."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"cannot write {DROP_CACHES} ({e.strerror}; needs root)"


def sequential_read_rate(paths: list[str]) -> float:
    """GB/s of one thread reading the files in 16 MiB blocks (dd bs=16M)."""
    buf = bytearray(16 * MiB)
    view = memoryview(buf)
    total, t0 = 0, time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while n := os.readv(fd, [view]):
                total += n
        finally:
            os.close(fd)
    return total / (time.perf_counter() - t0) / 1e9


def parallel_direct_read_rate(paths: list[str], threads: int = 16) -> float:
    """GB/s of `threads` threads reading 16 MiB O_DIRECT blocks (the disk's
    parallel rate; the page cache is bypassed)."""
    jobs = []
    for p in paths:
        size = os.path.getsize(p)
        jobs += [(p, off) for off in range(0, size, 16 * MiB)]
    lock, total = threading.Lock(), [0]

    def work(k):
        buf = mmap.mmap(-1, 16 * MiB)  # page aligned, as O_DIRECT needs
        fds = {}
        try:
            for p, off in jobs[k::threads]:
                if p not in fds:
                    fds[p] = os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
                n = os.preadv(fds[p], [buf], off)
                with lock:
                    total[0] += n
        finally:
            for fd in fds.values():
                os.close(fd)
            buf.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0] / (time.perf_counter() - t0) / 1e9


def same_bits(torch, got: dict, ref: dict) -> str | None:
    """None when `got` holds exactly ref's tensors, bit for bit (ref on the GPU)."""
    if set(got) != set(ref):
        missing, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
        return f"keys differ: missing {missing[:3]}, extra {extra[:3]}"
    for k, r in ref.items():
        g = got[k]
        if g.dtype != r.dtype or tuple(g.shape) != tuple(r.shape):
            return f"{k}: {g.dtype}{tuple(g.shape)} instead of {r.dtype}{tuple(r.shape)}"
        if not g.is_cuda:
            return f"{k}: on {g.device}"
        if not torch.equal(g.reshape(-1).view(torch.uint8), r.reshape(-1).view(torch.uint8)):
            return f"{k}: bytes differ"
    return None


# ---- the ways to load -------------------------------------------------------------

def _loader(args, ferry: bool):
    """ferry's Loader for ferry's row (None for the other paths)."""
    from ..load import Loader

    if not ferry:
        return None
    if "ferry" not in args.loaders:
        args.loaders["ferry"] = Loader(0, staging_bytes=args.staging, threads=args.threads or None)
    return args.loaders["ferry"]


def methods(args, torch) -> list[tuple[str, object, str | None, float | None]]:
    """[(label, load(paths) -> {name: cuda tensor}, None or why it cannot run,
    whether it is ferry's row)]."""
    from .. import torch as ft

    out = []
    def ferry_load(paths):
        return ft.load_safetensors(paths, loader=_loader(args, True))

    out.append(("ferry", ferry_load, None, True))
    try:
        from safetensors.torch import load_file
        st_why = None
    except ImportError as e:
        load_file, st_why = None, f"safetensors not importable ({e})"

    def st_cuda(paths):
        d = {}
        for p in paths:
            d.update(load_file(p, device="cuda"))
        return d

    def st_to(paths):
        d = {}
        for p in paths:
            d.update({k: v.to("cuda") for k, v in load_file(p).items()})
        return d

    def st_ferry(paths):
        d = {}
        for p in paths:
            d.update({k: ft.to_device(v) for k, v in load_file(p).items()})
        return d

    def st_ferry_dict(paths):  # the whole dict in one call (the copy engine's copy_many)
        d = {}
        for p in paths:
            d.update(ft.to_device(load_file(p)))
        return d

    out += [("safetensors load_file(device=cuda)", st_cuda, st_why, False),
            ("load_file + .to(cuda)", st_to, st_why, False),
            ("load_file + ferry.torch.to_device", st_ferry, st_why, False),
            ("load_file + ferry.torch.to_device(dict)", st_ferry_dict, st_why, False)]
    try:
        from fastsafetensors import fastsafe_open
        fst_why = None
    except Exception as e:  # noqa: BLE001 - any import failure waives the row
        fastsafe_open, fst_why = None, f"fastsafetensors not importable ({type(e).__name__}: {e})"

    def fst(paths):
        with fastsafe_open(filenames=list(paths), device="cuda:0", nogds=True) as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    out.append(("fastsafetensors (nogds)", fst, fst_why, False))
    try:
        from instanttensor import Backend, BackendPolicy, safe_open
        it_why = None
    except Exception as e:  # noqa: BLE001
        Backend = BackendPolicy = safe_open = None
        it_why = f"InstantTensor not importable ({type(e).__name__}: {e})"

    def instant(backend):
        def run(paths):
            kw = {} if backend is None else {"backend": backend}
            with safe_open(list(paths), framework="pt", device=0, **kw) as f:
                return dict(f.tensors())
        return run

    out += [("InstantTensor default", instant(None), it_why, False),
            ("InstantTensor BUFFERED", instant(BackendPolicy.BUFFERED if BackendPolicy else None), it_why, False),
            ("InstantTensor MMAP", instant(Backend.MMAP if Backend else None), it_why, False)]
    out += _more_peers(args)
    if args.only:
        out = [m for m in out if any(w.lower() in m[0].lower() for w in args.only)]
    return out


def _why_not(module: str) -> str | None:
    """None when `module` imports, else why not ("not installed" when absent)."""
    try:
        __import__(module)
        return None
    except ModuleNotFoundError as e:
        return f"not installed ({e})"
    except Exception as e:  # noqa: BLE001 - any import failure waives the row
        return f"not importable ({type(e).__name__}: {e})"


def _more_peers(args) -> list:
    """runai-model-streamer's SafetensorsStreamer (its reader threads into a CPU
    buffer, each tensor then to the GPU) and tensorizer (its own format, written
    from the reference once: TENSORIZER_FILE in the checkpoint's directory;
    num_readers 16)."""
    def runai(paths):
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            try:
                streamer.stream_files(list(paths), device="cuda:0")
                return dict(streamer.get_tensors())
            except TypeError:  # a version without device=: CPU tensors, copied as they come
                streamer.stream_files(list(paths))
                return {k: v.to("cuda:0") for k, v in streamer.get_tensors()}

    def tensorizer(paths):
        from tensorizer import TensorDeserializer

        d = TensorDeserializer(args.tensorizer_file, device="cuda:0", num_readers=TENSORIZER_READERS)
        try:
            return {k: v.data for k, v in d.items()}
        finally:
            d.close()

    return [("runai-model-streamer", runai, _why_not("runai_model_streamer"), False),
            (f"tensorizer (num_readers {TENSORIZER_READERS})", tensorizer, _why_not("tensorizer"), False)]


TENSORIZER_FILE = "model.tensors"
TENSORIZER_READERS = 16


def write_tensorizer_file(directory: str, ref: dict) -> str:
    """The reference state dict in tensorizer's format, for its row."""
    from tensorizer import TensorSerializer

    path = os.path.join(directory, TENSORIZER_FILE)
    w = TensorSerializer(path)
    try:
        w.write_state_dict(ref)
    finally:
        w.close()
    return path


def run_once(torch, fn, paths, ref, loader=None) -> dict:
    torch.cuda.synchronize()
    with PeakAnon() as mem:
        t0 = time.perf_counter()
        got = fn(paths)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    bad = same_bits(torch, got, ref)
    del got
    r = {"seconds": seconds, "host_added_bytes": mem.added, "verified": bad is None, "mismatch": bad}
    if loader is not None and loader.last_stats:  # ferry: what the loader did
        st = loader.last_stats
        r["loader"] = {k: st.get(k) for k in ("read_bytes", "staged_bytes", "reads", "direct_reads", "seconds",
                                              "numa_node", "staging_bytes", "threads", "notes")}
        # the per-tensor work around the loader: catalog, tensors, ranges (a cast load runs several loads:
        # then this counts only the last one's time as the loader's)
        r["loader"]["outside_s"] = seconds - st["seconds"]
    return r


def warm_runs(torch, fn, paths, ref, repeats: int, loader=None) -> dict:
    """One untimed run (allocator, loader set-up, page cache), then `repeats`
    timed ones; a path slower than 3 s per run is timed once."""
    first = run_once(torch, fn, paths, ref, loader)
    runs = [first] if first["seconds"] > 3 else [run_once(torch, fn, paths, ref, loader) for _ in range(repeats)]
    out = {"seconds": [r["seconds"] for r in runs], "median_s": median([r["seconds"] for r in runs]),
           "host_added_bytes": max(r["host_added_bytes"] for r in runs + [first]),
           "verified": all(r["verified"] for r in runs + [first]),
           "mismatch": next((r["mismatch"] for r in runs + [first] if r["mismatch"]), None)}
    if "loader" in runs[-1]:
        out["loader"] = runs[-1]["loader"]
    return out


# ---- transformers ------------------------------------------------------------------

def transformers_case(torch, directory: str, layers: int) -> dict:
    """from_pretrained beside from_config + load_safetensors(out=state_dict())."""
    import transformers

    from ..torch import load_safetensors

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                                   num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
    path = os.path.join(directory, "llama")

    def build():  # bf16 parameters on the GPU (transformers 5: dtype=; 4.x: torch_dtype=)
        with torch.device("cuda"):
            try:
                return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            except TypeError:
                return transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)

    try:
        src = build()
        src.save_pretrained(path)
        del src
        torch.cuda.synchronize()
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        size = sum(os.path.getsize(f) for f in files)
        for f in files:  # warm the page cache, as for the other rows
            sequential_read_rate([f])
        t0 = time.perf_counter()
        ref = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t_pretrained = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = build()
        torch.cuda.synchronize()
        t_config = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_safetensors(files, out=model.state_dict())
        torch.cuda.synchronize()
        t_load = time.perf_counter() - t0
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
        return {"bytes": size, "files": len(files), "from_pretrained_s": t_pretrained, "from_config_s": t_config,
                "load_safetensors_s": t_load, "verified": same}
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
        p.add_argument("--repeats", type=int_at_least(1), default=3, help="timed warm loads per path (default: %(default)s)")
        p.add_argument("--staging", type=size, default="512M", help="ferry's pinned staging (default: %(default)s)")
        p.add_argument("--threads", type=int_at_least(0), default=0, help="ferry's reader threads; 0 = one per core (max 16)")
        p.add_argument("--no-cold", action="store_true", help="skip the cold (page cache dropped) runs")
        p.add_argument("--only", action="append", help="only paths whose label contains this (repeatable)")
        p.add_argument("--transformers", type=int_at_least(0), default=0, metavar="LAYERS",
                       help="also time a bf16 Llama (hidden 2048) of LAYERS layers: from_pretrained vs ferry")

    def waived(self, args):
        why = super().waived(args)
        if why:
            return why
        for module in ("torch", "safetensors"):
            try:
                __import__(module)
            except ImportError as e:
                return f"needs {module} ({e})"
        return None

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
    cold_why = None if not args.no_cold else "--no-cold"
    if cold_why is None:
        cold_why = drop_page_cache()
    if cold_why is None:
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
    else:
        results["cold_waived"] = cold_why
    if args.transformers:
        progress("transformers: from_pretrained vs from_config + load_safetensors")
        try:
            results["transformers"] = transformers_case(torch, directory, args.transformers)
        except Exception as e:  # noqa: BLE001
            results["transformers"] = {"failed": f"{type(e).__name__}: {e}"}
    print_report(results, nbytes)
    args.results = results  # LoadSuite.run writes them
    return 0 if all(r.get("verified", True) for part in ("warm", "cold") for r in results[part].values()) else 1


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
