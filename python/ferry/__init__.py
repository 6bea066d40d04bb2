"""ferry: move data between host memory and NVIDIA GPUs at the speed of the link.

The pieces: ``Pool`` / ``PinnedPool`` (huge-page-aware host memory, recycled and
accounted), ``versions()``, ``cuda_info()``, and the ``ferry`` command
(``ferry doctor``). Errors are ``ferry.FerryError`` subclasses (see ferry.errors).
"""

from .errors import (  # noqa: F401  (re-exported)
    CudaError,
    FerryError,
    InvalidArgumentError,
    NoDeviceError,
    NotSupportedError,
    OSLayerError,
    OutOfMemoryError,
)
from . import _ferry
from .pool import Buffer, PinnedPool, Pool  # noqa: F401
from .copy import (  # noqa: F401
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
