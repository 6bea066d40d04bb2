"""Shared pytest fixtures. Tests import the *installed* ferry package (scripts/test
installs it first); GPU tests skip, with the reason, where there is no device."""

import pytest


def _gpu_skip_reason():
    import ferry

    info = ferry.cuda_info()
    if info is None:
        return "needs a CUDA device: no CUDA driver (libcuda.so.1 not found)"
    if not info.get("devices"):
        return "needs a CUDA device: " + info.get("error", "the driver reports 0 devices")
    return None


@pytest.fixture
def gpu():
    """Skip unless a CUDA device is present; yields cuda_info()."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import ferry

    return ferry.cuda_info()
