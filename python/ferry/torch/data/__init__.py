"""``ferry.torch.DataLoader`` (``ferry.torch.data.DataLoader``): PyTorch's
DataLoader whose workers collate each batch straight into shared pinned memory.

One module per piece: ``loader`` (the DataLoader and its iterators),
``worker`` (the worker process), ``slot_collate`` (collation into a slot),
``batch_layout`` (the descriptor that crosses the queue), ``slots`` (the
shared pinned slots), ``chunk_passing`` (the slots' memfds sent to the
workers), ``delivery`` (a descriptor made into CPU or GPU tensors).
"""

from .._torch import torch_module

torch_module()  # without PyTorch: an ImportError that says how to install it
from .loader import DataLoader  # noqa: E402

__all__ = ["DataLoader"]
