"""What a ``device`` argument of ferry.torch means, written once (the rule is
in the package's text, ``ferry/torch/__init__.py``): ``to_device``,
``load_safetensors`` and ``DataLoader`` read their ``device`` here.

``cuda_device``: "cuda", "cuda:N", a torch.device or an int N, and None, as a
torch.device of type cuda (index None: the current device, asked later, so a
forked child is refused before CUDA is touched); anything else is refused with
InvalidArgumentError. ``with_index``: that device with its index, the calling
thread's current CUDA device where it has none; NoDeviceError where PyTorch
sees no CUDA device.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError, NoDeviceError
from ._torch import torch_module as _torch

# What a device argument may be, for error messages.
ACCEPTED = "None (the current CUDA device), 'cuda', 'cuda:N', a torch.device or an int N"


def cuda_device(device, what: str, why: str = "it places tensors on a CUDA device", expected: str = ACCEPTED):
    """torch.device("cuda"[, N]) for `device` (None: the current CUDA device,
    index left None). InvalidArgumentError, saying `what`, `why` and what is
    `expected`, for a device that is not CUDA or not a device at all."""
    torch = _torch()
    if device is None:
        return torch.device("cuda")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: device={device!r} is not a device; expected {expected}") from e
    if d.type != "cuda":
        raise InvalidArgumentError(f"{what}: device={device!r}: {why}; expected {expected}")
    return d


def with_index(d, what: str):
    """d (a CUDA torch.device) with its index: the calling thread's current CUDA
    device where it has none. NoDeviceError where PyTorch sees no CUDA device."""
    if d.index is not None:
        return d
    torch = _torch()
    try:
        return torch.device("cuda", torch.cuda.current_device())
    except (RuntimeError, AssertionError) as e:  # no driver, no device, a CPU-only PyTorch
        raise NoDeviceError(f"{what}: device=None (or 'cuda') means the current CUDA device, and PyTorch "
                            f"sees none here ({e})") from e
