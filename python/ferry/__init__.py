"""ferry: move data between host memory and NVIDIA GPUs at the speed of the link.

Memory:
    Pool, PinnedPool      huge-page-aware host memory, recycled and accounted
                          (PinnedPool: pinned for a GPU, a target pinned in the background)
    Buffer                one allocation of a pool (buffer protocol, __dlpack__)
    NodePool, NodeBlock   one pinned pool per node, shared by every rank (ferry.node)
    Handoff               GPU -> node pool -> GPU between processes (ferry.node)
Copies:
    copy, copy_async      one host<->GPU copy, any host memory, any size
    copy_many, copy_many_async
                          many (dst, src, size) copies in one call
    copy_blocks, copy_blocks_async
                          blocks of a paged layout (a KV cache) by block ids
    BlockPlan             fixed block copies launched many times (CUDA-graph capturable)
    Copy                  the handle of an async copy (wait(), done)
    register, Registration
                          pin a host range for copies (until unregister() or a with block ends)
    engine                the copy engine of a GPU
    Channel               small low-latency reads, writes and signals (a GPU kernel polls)
Loading:
    Loader                file byte ranges to GPU memory through pinned staging (ferry.load)
The machine:
    versions(), cuda_info(), check_options(), option_table(), set_fault_injection()
Errors:
    every error is a ferry.errors class (FerryError and its subclasses, named here
    too); docs/errors.md lists them and what raises each.

PyTorch: ferry.torch (to_device, to_host, load_safetensors, save_safetensors,
DataLoader, ...). The command line: ``ferry doctor``, ``ferry bench``.
docs/api.md: the words every argument uses (device, stream, out, timeout, sizes).
"""

# Every ferry.errors class, re-exported by name (a star import would hide
# undefined names from pyflakes; test_cli_vocabulary checks each name of
# __all__ exists, so a class added to ferry.errors.__all__ must be added here).
from .errors import (  # noqa: F401
    AllocatorTooLateError,
    CheckpointChangedError,
    CudaError,
    DataLoaderError,
    DataLoaderTimeoutError,
    FerryError,
    FerryTimeoutError,
    HandoffError,
    HandoffPeerGoneError,
    HandoffTimeoutError,
    InternalError,
    InvalidArgumentError,
    MeasurementError,
    NixlError,
    NixlTimeoutError,
    NixlUnavailableError,
    NodeLoadTimeout,
    NodeLoadTimeoutError,
    NoDeviceError,
    NotSupportedError,
    OSLayerError,
    OutOfMemoryError,
)
from .errors import __all__ as _error_names
from . import _ferry
from .pool import Buffer, PinnedPool, Pool  # noqa: F401
from .copy import (  # noqa: F401
    BlockPlan,
    Copy,
    Registration,
    copy,
    copy_async,
    copy_blocks,
    copy_blocks_async,
    copy_many,
    copy_many_async,
    engine,
    register,
)

__version__ = _ferry.versions()["library"]


def versions() -> dict:
    """Library, C API, CUDA runtime and driver versions (driver 0 = no driver)."""
    return _ferry.versions()


def cuda_info():
    """CUDA versions and device properties, or None when no driver is installed."""
    return _ferry.cuda_info()


def check_options() -> None:
    """Raise InvalidArgumentError if a FERRY_* environment variable is unknown or bad."""
    _ferry.check_options()


def option_table() -> list:
    """[(name, default, doc)] of every FERRY_* option."""
    return list(_ferry.option_table())


def set_fault_injection(spec: str) -> None:
    """Make chosen real calls fail, for error-path tests: "mmap:0", "register:2+", "" clears."""
    _ferry.set_fault_injection(spec)


from .channel import Channel  # noqa: F401, E402
from .load import Loader  # noqa: F401, E402
from .node import Handoff, NodeBlock, NodePool  # noqa: F401, E402

__all__ = [
    "Pool", "PinnedPool", "Buffer", "NodePool", "NodeBlock", "Handoff",
    "copy", "copy_async", "copy_many", "copy_many_async", "Copy", "register", "Registration", "engine",
    "Channel", "Loader",
    "versions", "cuda_info", "check_options", "option_table", "set_fault_injection",
    *_error_names,
]
