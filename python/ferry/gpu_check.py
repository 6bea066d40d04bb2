"""The one "is there a GPU" check: why GPU work cannot run here, or None.

Its own module (no pools, no measurements) so that what only asks whether CUDA is
there (``load_safetensors``, the bench suites, the tests' ``gpu`` fixture) does not
import the doctor's measurements; ``ferry.measure`` re-exports it.
"""

from __future__ import annotations


def gpu_absent_reason(cuda_info: dict | None) -> str | None:
    """Why GPU work cannot run here ("no CUDA driver ...", "no CUDA device ..."), or
    None when there is a device; cuda_info is what ferry.cuda_info() returned. The one
    such check: the doctor, the bench suites and the tests' `gpu` fixture ask it."""
    if cuda_info is None:
        return "no CUDA driver (libcuda.so.1 not found)"
    if not cuda_info.get("devices"):
        error = cuda_info.get("error")
        return "no CUDA device" + (f" ({error})" if error else "")
    return None
