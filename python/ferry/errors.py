"""ferry's exceptions: every error ferry raises is one of these classes.

One class per ferry_status_t of the C API (the exception translator in
src/python/error_bindings.cpp maps each status to its class), one base for every timeout, and the classes of the Python layers (node Handoff,
node loads, NIXL, the DataLoader, the allocators). docs/errors.md lists each
with what raises it.

Each also derives from the builtin a Python user would catch for that kind of
failure, so ``except MemoryError``, ``except ValueError``, ``except TimeoutError``
and ``except RuntimeError`` keep working.
"""


class FerryError(Exception):
    """Base of every error raised by ferry."""


# ---- one class per ferry_status_t (include/ferry/ferry.h) -------------------------


class InvalidArgumentError(FerryError, ValueError):
    """Bad pointer, size, alignment, option, value or type (FERRY_ERROR_INVALID_ARGUMENT)."""


class OutOfMemoryError(FerryError, MemoryError):
    """The OS, CUDA or a configured limit refused memory (FERRY_ERROR_OUT_OF_MEMORY)."""


class OSLayerError(FerryError, OSError):
    """A system call failed; the message names it and its errno (FERRY_ERROR_OS)."""


class CudaError(FerryError, RuntimeError):
    """A CUDA call failed; the message has the CUDA error name (FERRY_ERROR_CUDA)."""


class NoDeviceError(CudaError):
    """No CUDA driver or no CUDA device (FERRY_ERROR_NO_DEVICE)."""


class NotSupportedError(FerryError, NotImplementedError):
    """This machine cannot do it, e.g. GDRCopy without gdrdrv (FERRY_ERROR_NOT_SUPPORTED)."""


class InternalError(FerryError, RuntimeError):
    """A bug in ferry: a state it should never reach (FERRY_ERROR_INTERNAL). Please
    report it with the message."""


# ---- timeouts: one base ----------------------------------------------------------


class FerryTimeoutError(FerryError, TimeoutError):
    """Base of every ferry timeout: a bounded wait (a ``timeout`` in seconds) ended
    before what it waited for happened. ``except TimeoutError`` catches it."""


# ---- the node pool's Handoff (ferry.node.Handoff) ---------------------------------


class HandoffError(FerryError):
    """A node Handoff could not go on (see the message)."""


class HandoffTimeoutError(HandoffError, FerryTimeoutError):
    """The handoff's peer is alive but did not fill or drain a slot within the timeout."""


class HandoffPeerGoneError(HandoffError):
    """The handoff's peer left the pool (exited, was killed or closed) with the handoff unfinished."""


# ---- node loads (ferry.torch.load_safetensors(node=...)) --------------------------


class NodeLoadTimeoutError(FerryTimeoutError):
    """Ranks of a node load did not all arrive within the timeout."""


NodeLoadTimeout = NodeLoadTimeoutError  # the name before issue 43; kept for one release


# ---- NIXL (ferry.nixl) --------------------------------------------------------------


class NixlUnavailableError(NotSupportedError):
    """NIXL's Python package is not installed or does not load."""


class NixlError(FerryError, RuntimeError):
    """A NIXL call failed or a transfer ended in error; the message says which."""


class NixlTimeoutError(NixlError, FerryTimeoutError):
    """A transfer was not done within its timeout (it stays posted)."""


# ---- ferry.torch --------------------------------------------------------------------


class CheckpointChangedError(FerryError, RuntimeError):
    """A checkpoint file changed while it was loaded: renamed over after its header
    was read (another inode), or written, truncated or extended while its bytes
    were read. load_safetensors loads once more from the start before it raises
    this (the tensors would otherwise mix two versions of the file)."""


class AllocatorTooLateError(FerryError, RuntimeError):
    """PyTorch's CUDA allocator is already initialized (or another ferry
    allocator was chosen): the allocator can be chosen once per process, first."""


class DataLoaderError(FerryError, RuntimeError):
    """ferry.torch.DataLoader could not go on: a worker died or timed out (PyTorch's
    message, with the workers' names), or the batch memory could not be passed to a
    worker. A RuntimeError, as PyTorch's DataLoader raises."""


class DataLoaderTimeoutError(DataLoaderError, FerryTimeoutError):
    """ferry.torch.DataLoader(timeout=t): no batch came from the workers within t
    seconds (PyTorch's "DataLoader timed out"; still a RuntimeError, as PyTorch's)."""


# ---- measurements (ferry doctor, ferry bench) ---------------------------------------


class MeasurementError(FerryError, RuntimeError):
    """A measurement gave no usable figure (every timing zero, a copy thread failed,
    /proc without the line it reads)."""


__all__ = [
    "FerryError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "OSLayerError",
    "CudaError",
    "NoDeviceError",
    "NotSupportedError",
    "InternalError",
    "FerryTimeoutError",
    "HandoffError",
    "HandoffTimeoutError",
    "HandoffPeerGoneError",
    "NodeLoadTimeoutError",
    "NodeLoadTimeout",
    "NixlUnavailableError",
    "NixlError",
    "NixlTimeoutError",
    "AllocatorTooLateError",
    "CheckpointChangedError",
    "DataLoaderError",
    "DataLoaderTimeoutError",
    "MeasurementError",
]
