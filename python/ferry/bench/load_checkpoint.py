"""`ferry bench load`'s test checkpoint: the tensors of each --preset and the
safetensors files written from them."""

from __future__ import annotations

import json
import os
import struct

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
