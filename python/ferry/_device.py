"""The one meaning of ``device=None`` in ferry and ferry.torch (docs/api.md).

``device=None`` is the current CUDA device: PyTorch's
(``torch.cuda.current_device()``) when PyTorch is imported and has initialized
CUDA in this process, else device 0 (the CUDA runtime's default for a thread
that set none). Why: a PyTorch user who called ``torch.cuda.set_device(1)``
gets GPU 1 from every ferry call, as from ``.cuda()``; and asking costs
nothing: ferry neither imports PyTorch nor initializes CUDA to answer (an
import of seconds, and a CUDA context before ``fork()`` breaks DataLoader
workers). A forked child of a process with CUDA initialized is in PyTorch's
"bad fork" state: it reads as not initialized, so 0 (and ferry refuses GPU
work there anyway).

Where the data has a device (a CUDA tensor), the data's device comes first
(``ferry.copy``); an int is that GPU.
"""

from __future__ import annotations

import sys

_modules = sys.modules


def current() -> int:
    """The current CUDA device by the rule above (never imports torch or starts CUDA;
    ~0.1 us: empty_pinned asks it per tensor)."""
    torch = _modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def index(device):
    """`device` with None resolved by the rule (current()); anything else as given,
    for the callee's own check (the native bindings refuse a bool, a negative, a
    string with InvalidArgumentError naming the argument)."""
    return current() if device is None else device
