"""`ferry bench load`'s ways to load a checkpoint: ferry and its peers, each a
row of the table, timed warm; and the transformers case."""

from __future__ import annotations

import os
import shutil
import time

from ..measure import median
from .load_measures import PeakAnon, same_bits, sequential_read_rate


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
