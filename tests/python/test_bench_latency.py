"""`ferry bench latency`'s host side: the --pollers list and the waiver without
a device."""

import pytest

import ferry
from ferry.bench import latency


def test_pollers_list_is_parsed_in_order_without_repeats():
    assert latency.parse_pollers("1,4") == [1, 4]
    assert latency.parse_pollers(" 8, 1 ,8,") == [8, 1]
    assert latency.parse_pollers("2") == [2]


@pytest.mark.parametrize(
    "text, quoted",
    [("0,4", "0 is outside 1 .. 8"), ("9", "9 is outside 1 .. 8"), ("1,x", "'x' is not a number"), (",", "at least one")],
)
def test_bad_pollers_lists_are_quoted(text, quoted):
    with pytest.raises(ferry.InvalidArgumentError, match=quoted) as e:
        latency.parse_pollers(text)
    assert f"'{text}'" in str(e.value)


def test_bad_pollers_fail_before_the_device_check():
    with pytest.raises(ferry.InvalidArgumentError, match="--pollers"):
        latency.main(["--pollers", "0"])


def test_without_a_device_the_suite_is_waived(capsys):
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    assert latency.main(["--pollers", "1,8"]) == 0
    assert "waived" in capsys.readouterr().out
