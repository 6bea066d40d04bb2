"""What a copy or channel argument is: its address, its size in bytes and its device.

One reading for every front end (ferry.copy, ferry.Channel): the native
module's resolve_copy_arg (src/python/copy_args.cpp) takes an int (an address,
size unknown), a torch tensor (contiguous; numel() * element_size(); its CUDA
device), an object with __cuda_array_interface__ (C-contiguous; shape times
the typestr's item size) or anything with the buffer protocol, and refuses the
rest with InvalidArgumentError. The channel adds one rule: it reaches GPU
memory only, so host memory (a CPU tensor, a buffer) is refused before any
request.
"""

from __future__ import annotations

from . import _ferry
from .errors import InvalidArgumentError


def resolve(obj, writable: bool = False) -> tuple[int, int | None, int | None]:
    """(address, nbytes or None for an int, cuda device or None) of a copy argument."""
    if obj is None:  # the native binding would raise TypeError
        raise InvalidArgumentError("obj is None: expected an int address, a buffer, a __cuda_array_interface__ "
                                   "object or a torch tensor")
    return _ferry.resolve_copy_arg(obj, writable)


def device_address(obj, what: str) -> tuple[int, int | None]:
    """(address, nbytes or None when unknown) of an argument in GPU memory: an int
    address, a torch CUDA tensor or an object with __cuda_array_interface__."""
    if getattr(obj, "is_cuda", None) is False:
        raise InvalidArgumentError(f"{what} is a CPU tensor: GPU memory is needed here")
    is_device_object = getattr(obj, "is_cuda", None) or hasattr(obj, "__cuda_array_interface__")
    if not (isinstance(obj, int) and not isinstance(obj, bool)) and not is_device_object:
        raise InvalidArgumentError(
            f"{what}: expected an int address, a torch CUDA tensor or an object with "
            f"__cuda_array_interface__, not {type(obj).__name__}"
        )
    address, nbytes, _ = resolve(obj, writable=True)
    return address, nbytes
