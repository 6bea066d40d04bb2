"""ferry's exceptions: one class per ferry_status_t.

Each also derives from the builtin a Python user would catch for that kind of
failure, so ``except MemoryError`` and ``except ValueError`` keep working.
"""


class FerryError(Exception):
    """Base of every error raised by ferry."""


class InvalidArgumentError(FerryError, ValueError):
    """Bad pointer, size, alignment, option or value (FERRY_ERROR_INVALID_ARGUMENT)."""


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


class HandoffError(FerryError):
    """A node Handoff could not go on (see the message)."""


class HandoffTimeoutError(HandoffError, TimeoutError):
    """The handoff's peer is alive but did not fill or drain a slot within the timeout."""


class HandoffPeerGoneError(HandoffError):
    """The handoff's peer left the pool (exited, was killed or closed) with the handoff unfinished."""


__all__ = [
    "FerryError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "OSLayerError",
    "CudaError",
    "NoDeviceError",
    "NotSupportedError",
    "HandoffError",
    "HandoffTimeoutError",
    "HandoffPeerGoneError",
]
