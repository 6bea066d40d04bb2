"""Random tensors of every dtype a safetensors file holds, for the save tests
(test_save.py, test_save_layout.py). Imports torch: import it where torch is there."""

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
           if hasattr(torch, n)]


def rand(shape, dtype, g, device="cpu"):
    """A tensor of `shape` and `dtype` with random bytes from generator `g` (bools 0/1)."""
    n = 1
    for s in shape:
        n *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 2 if dtype == torch.bool else 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    t = raw.view(dtype).view(shape) if n else torch.empty(shape, dtype=dtype)
    return t.to(device)
