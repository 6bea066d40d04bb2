"""`ferry bench thp`'s host side: buffers of each backing (measure.HostBuffer), their
huge-page count from smaps, and the waiver without a device."""

import pytest

import ferry
from ferry.bench import thp
from ferry.measure import HostBuffer

MiB = 1 << 20


@pytest.mark.parametrize("backing", ["4k", "thp", "memfd", "memfd-thp"])
def test_buffers_are_touched_and_report_their_huge_pages(backing):
    b = HostBuffer(8 * MiB, backing)
    try:
        assert len(b.map) == 8 * MiB and b.map[8 * MiB - 1] is not None
        huge = b.huge_bytes()
        assert 0 <= huge <= 8 * MiB
        if backing == "4k":
            assert huge == 0  # MADV_NOHUGEPAGE
    finally:
        b.close()


def test_without_a_device_the_suite_is_waived(capsys):
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    assert thp.main([]) == 0
    assert "waived" in capsys.readouterr().out
