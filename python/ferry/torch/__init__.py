"""PyTorch integration, one module per concept:

- ``pinned``: CPU tensors whose storage is ferry pinned-pool memory
  (``empty_pinned``, ``default_pinned_pool``);
- ``transfer``: tensors to and from the GPU by ferry's copy engine
  (``to_device``, ``to_host``);
- ``allocators``: managed-memory allocators for PyTorch (``use_allocator``,
  ``mem_pool``, ``allocator_stats``, ``empty_cache``);
- ``safetensors``: checkpoints to the GPU by ferry's loader (``load_safetensors``);
- ``save``: state dicts to safetensors files (``save_safetensors``), what goes
  in each file (items, header, order, shards, tied weights) in ``file_layout``;
- ``snapshots``: asynchronous checkpoints (``snapshot``, ``Snapshot.save``);
- ``offload``: activations saved for backward kept in pinned memory
  (``offload_activations``);
- ``data``: ``DataLoader``, PyTorch's DataLoader with workers that collate
  straight into shared pinned memory (imported on first use: it subclasses
  PyTorch's class, and ``import ferry.torch`` does not import PyTorch).

Everything public is re-exported here: ``ferry.torch.to_device(...)``.

One meaning of ``device`` (``devices`` reads it; tests/python/test_device_rule.py
holds every public name to it):

- Where a GPU is the destination (``to_device``, ``load_safetensors``,
  ``DataLoader``), ``device`` takes "cuda:N", N or a torch.device, and
  ``device=None`` or "cuda" means the calling thread's current CUDA device
  (``torch.cuda.current_device()``); ``load_safetensors`` with ``out=``
  tensors all on one GPU: that GPU. A CPU device there is refused
  (InvalidArgumentError), no GPU is NoDeviceError: never a silent CPU.
- The host is asked for aloud: ``DataLoader(device="cpu")``, its default
  (CPU batches). ``DataLoader(device=None)`` still gives CPU batches, as it
  did before this rule, with a FutureWarning: pass device="cpu".
- A per-GPU resource: ``default_pinned_pool(device=None)`` takes an int index,
  None the current CUDA device by ferry's one rule (docs/api.md: PyTorch's
  current device where PyTorch has initialized CUDA, else 0; ``empty_pinned``
  with no pool still uses device 0's); ``allocator_stats`` and ``empty_cache``
  take an int index, ``device=-1``: every device.
"""

from .allocators import (  # noqa: F401
    ALLOCATORS,
    AllocatorTooLateError,
    allocator_stats,
    current_allocator,
    empty_cache,
    library_path,
    mem_pool,
    use_allocator,
)
from .offload import ActivationOffload, offload_activations  # noqa: F401
from .pinned import default_pinned_pool, empty_pinned  # noqa: F401
from .safetensors import load_safetensors  # noqa: F401
from .save import save_safetensors  # noqa: F401
from .snapshots import SaveFuture, Snapshot, snapshot  # noqa: F401
from .transfer import to_device, to_host  # noqa: F401


def __getattr__(name):
    if name == "DataLoader":
        from .data import DataLoader

        return DataLoader
    raise AttributeError(f"module 'ferry.torch' has no attribute {name!r}")
