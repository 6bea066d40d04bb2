"""The low-latency channel: small CPU<->GPU copies and signals in about a microsecond.

``ferry.Channel(device=None, idle_us=200)`` starts nothing until the first request:
then a persistent GPU kernel (one block, its own stream) serves requests that
the CPU writes into mapped pinned memory, and leaves by itself after
``idle_us`` without requests (the next request relaunches it), so
``torch.cuda.synchronize()`` never hangs on it. Requests are synchronous,
thread-safe (the GIL is released) and complete in each thread's order.

Device-side arguments (``dev_ptr``) are an int address, a torch CUDA tensor (or
anything with ``data_ptr()``), or an object with ``__cuda_array_interface__``;
the range must lie inside one allocation of the channel's device. Payloads are
1 .. 64 KiB (``MAX_PAYLOAD``); larger transfers are ``ferry.copy``'s job.

Requests are not ordered with CUDA streams: the kernel serves one as soon as it
is published. Memory that torch (or any stream) is still producing must be
settled first, e.g. ``torch.cuda.synchronize()`` after ``torch.zeros(...,
device="cuda")`` and before a channel request that touches it.

``gdrcopy_status()`` tells whether GDRCopy (libgdrapi.so.2 + /dev/gdrdrv) could
back writes here (``Channel(use_gdrcopy=True)``), and why not.
"""

from __future__ import annotations

import time

import math

from . import _args, _device, _ferry
from ._resolve import device_address
from .errors import InvalidArgumentError

MAX_PAYLOAD = _ferry.CHANNEL_MAX_PAYLOAD
_WAIT_SLICE_MS = 1000.0  # the longest single kernel wait of Channel.wait (see there)


def gdrcopy_status() -> tuple[bool, str]:
    """(available, reason): whether GDRCopy can back channel writes, and why not."""
    available, reason = _ferry.gdrcopy_status()
    return bool(available), str(reason)


def _request_ms(timeout) -> int:
    """Channel(timeout=) in seconds as the native field's milliseconds (1 .. 2^32-1):
    rounded up, None or past 49 days the field's most; 0 refused (a request cannot
    be done in no time)."""
    seconds = _args.timeout(timeout, "timeout")
    if seconds is None:
        return _args.MAX_U32
    if seconds == 0:
        raise InvalidArgumentError("timeout=0: expected seconds > 0, or None (no limit)")
    return min(_args.MAX_U32, max(1, math.ceil(seconds * 1000)))


def _nbytes(nbytes, n, where: str):
    """read()'s and fill()'s size: nbytes, or n= (its deprecated spelling)."""
    if n is not _args.UNSET:
        _args.renamed(where, "n", "nbytes", stacklevel=4)
        if nbytes is not None:
            raise InvalidArgumentError(f"{where}: nbytes= and n= (its deprecated spelling) given both")
        return _args.optional_size(n, "n")
    return _args.optional_size(nbytes, "nbytes")


def _check_fits(what: str, n: int, capacity: int | None) -> None:
    if capacity is not None and n > capacity:
        raise InvalidArgumentError(f"{n} bytes do not fit in {what} ({capacity} bytes)")


class Channel:
    """A low-latency channel to one GPU.

    device: the GPU (None: the current CUDA device, docs/api.md); idle_us: the
    kernel leaves after this long without a request (1 .. 10^7); slots: requests
    in flight at once (1 .. 64); timeout: seconds (> 0; None or math.inf: no limit,
    in fact 49 days, the native field's most) after which a request not done raises
    CudaError and leaves the channel unusable (timeout_ms=, in milliseconds, is
    its deprecated spelling); spin_us: callers
    spin this long before yielding and sleeping; use_gdrcopy: writes through
    GDRCopy mappings (NotSupportedError, with the reason, where unavailable).
    Raises NoDeviceError without a CUDA driver or device.
    """

    def __init__(
        self,
        device: int | None = None,
        idle_us: int = 200,
        *,
        slots: int = 8,
        timeout: float | None = 5.0,
        spin_us: int = 20,
        use_gdrcopy: bool = False,
        timeout_ms=_args.UNSET,
    ):
        if timeout_ms is not _args.UNSET:
            _args.renamed("Channel", "timeout_ms", "timeout", "seconds")
            request_ms = _args.u32(timeout_ms, "timeout_ms")
        else:
            request_ms = _request_ms(timeout)
        self._native = _ferry.Channel(
            _args.u32(_device.index(device), "device", hi=(1 << 31) - 1), _args.u32(idle_us, "idle_us"),
            _args.u32(slots, "slots"), request_ms, _args.u32(spin_us, "spin_us"),
            _args.flag(use_gdrcopy, "use_gdrcopy"))

    def write(self, dev_ptr, data) -> None:
        """Copy `data` (bytes or any contiguous buffer) to device memory at dev_ptr."""
        address, capacity = device_address(dev_ptr, "dev_ptr")
        if capacity is not None:
            _check_fits("dev_ptr", memoryview(data).nbytes, capacity)
        self._native.write(address, data)

    def read(self, dev_ptr, nbytes: int | None = None, *, n=_args.UNSET) -> bytes:
        """nbytes of device memory at dev_ptr (default: a tensor's size; n=: the
        deprecated spelling of nbytes)."""
        address, capacity = device_address(dev_ptr, "dev_ptr")
        n = _nbytes(nbytes, n, "Channel.read")
        if n is None:
            if capacity is None:
                raise InvalidArgumentError("read(dev_ptr, nbytes): nbytes is needed for an int address")
            n = capacity
        _check_fits("dev_ptr", n, capacity)
        return self._native.read(address, n)

    def read_into(self, dev_ptr, out) -> None:
        """Fill the writable contiguous buffer `out` from device memory at dev_ptr."""
        address, capacity = device_address(dev_ptr, "dev_ptr")
        if capacity is not None:
            _check_fits("dev_ptr", memoryview(out).nbytes, capacity)
        self._native.read_into(address, out)

    def fill(self, dev_ptr, value: int, nbytes: int | None = None, *, n=_args.UNSET) -> None:
        """Set nbytes at dev_ptr to `value` (0..255; default: a tensor's size; n=: the
        deprecated spelling of nbytes)."""
        address, capacity = device_address(dev_ptr, "dev_ptr")
        n = _nbytes(nbytes, n, "Channel.fill")
        if n is None:
            if capacity is None:
                raise InvalidArgumentError("fill(dev_ptr, value, nbytes): nbytes is needed for an int address")
            n = capacity
        _check_fits("dev_ptr", n, capacity)
        self._native.fill(address, value, n)

    def signal(self, dev_flag, value: int) -> None:
        """Store a 32-bit value to a device flag with release semantics (system scope)."""
        address, _ = device_address(dev_flag, "dev_flag")
        self._native.signal(address, value)

    def wait(self, dev_flag, value: int, timeout_ms=_args.UNSET, *, timeout: float | None = 1.0) -> bool:
        """Have the kernel wait until the 32-bit device flag >= value; False after
        `timeout` seconds (None or math.inf: no limit; negative or NaN refused).
        timeout_ms (also the third positional argument), in milliseconds, is its
        deprecated spelling.

        The wait holds the whole channel: other requests queue behind it. A wait over
        1 s is a series of waits of at most 1 s each (the kernel's limit is an hour;
        other requests, and Ctrl-C, get in between them)."""
        if timeout_ms is not _args.UNSET:
            _args.renamed("Channel.wait", "timeout_ms", "timeout", "seconds")
            limit = _args.timeout(timeout_ms, "timeout_ms", "milliseconds")
        else:
            seconds = _args.timeout(timeout, "timeout")
            limit = None if seconds is None else seconds * 1000
        address, _ = device_address(dev_flag, "dev_flag")
        if limit is not None and limit <= _WAIT_SLICE_MS:
            return self._native.wait(address, value, int(limit * 1000))
        deadline = None if limit is None else time.monotonic() + limit / 1000
        while True:
            left = _WAIT_SLICE_MS if deadline is None else min(_WAIT_SLICE_MS,
                                                               max(0.0, (deadline - time.monotonic()) * 1000))
            if self._native.wait(address, value, int(left * 1000)):
                return True
            if left < _WAIT_SLICE_MS:
                return False

    def ping(self) -> float:
        """Round trip of an empty request in microseconds (relaunches an idle kernel)."""
        return self._native.ping()

    def stats(self) -> dict:
        """requests, launches, idle_exits, gdrcopy_writes."""
        return self._native.stats()

    def time_ns(self, op: str, dev_ptr=0, nbytes: int = 0, iterations: int = 1000) -> list:
        """Nanoseconds of each of `iterations` requests timed in C++ (for benchmarks):
        op is "write", "read", "fill" (nbytes at dev_ptr) or "ping"."""
        address, capacity = device_address(dev_ptr, "dev_ptr")
        nbytes = _args.size(nbytes, "nbytes")
        _check_fits("dev_ptr", nbytes, capacity)
        return self._native.time_ns(op, address, nbytes, _args.u32(iterations, "iterations", 1, (1 << 31) - 1))

    def close(self) -> None:
        """Stop the kernel and free everything (idempotent)."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def device(self) -> int:
        return self._native.device

    @property
    def idle_us(self) -> int:
        return self._native.idle_us

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"idle_us={self.idle_us}"
        return f"ferry.Channel(device={self.device}, {state})"
