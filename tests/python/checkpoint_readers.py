"""How the save tests read a checkpoint back the way ferry's loader would
(test_save_hardening.py, test_save_race.py)."""

from __future__ import annotations

from ferry.load import read_catalog


def ferry_reader(d):
    """ferry's loader on the directory (its file choice, its strict catalog), bytes read from the files."""
    from ferry.torch.safetensors import _resolve

    files, names, of = _resolve(str(d))
    cat = read_catalog(files, names, of)
    out = {}
    for name, f, off, n in zip(cat["names"], cat["file"], cat["offset"], cat["nbytes"]):
        with open(files[f], "rb") as fh:
            fh.seek(off)
            out[name] = fh.read(n)
    return out


def raw(t) -> bytes:
    """A tensor's bytes, whatever its dtype (NaNs in random bits compare equal as bytes)."""
    import torch

    return bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def index_reader(d, stem: str = "model", missing_ok: bool = False):
    """safetensors through the index: each tensor from the shard the index names
    (None where there is no index and missing_ok)."""
    import json

    from safetensors.torch import load_file

    index = d / f"{stem}.safetensors.index.json"
    if missing_ok and not index.exists():
        return None
    weight_map = json.loads(index.read_text())["weight_map"]
    out = {}
    for f in sorted(set(weight_map.values())):
        for k, v in load_file(str(d / f)).items():
            if weight_map.get(k) == f:
                out[k] = raw(v)
    if set(out) != set(weight_map):
        raise KeyError("a tensor of the index is in no shard")
    return out
