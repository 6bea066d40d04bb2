"""Shared pytest fixtures. Tests import the *installed* ferry package (scripts/test
installs it first); GPU tests skip, with the reason, where there is no device."""

import pytest

# Shared test helpers outside test_*.py whose asserts pytest should explain.
pytest.register_assert_rewrite("rules_cases")


def _gpu_skip_reason():
    import ferry
    from ferry.measure import gpu_absent_reason

    why = gpu_absent_reason(ferry.cuda_info())
    return None if why is None else f"needs a CUDA device: {why}"


@pytest.fixture
def gpu():
    """Skip unless a CUDA device is present; yields cuda_info()."""
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import ferry

    return ferry.cuda_info()
