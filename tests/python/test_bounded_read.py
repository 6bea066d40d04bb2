"""ferry.bounded_read: the one rule for reading a file ferry was pointed at: a regular
file, at most `limit` bytes; a FIFO never waited on, a device never read without end."""

import os
import random
import socket

import pytest

from ferry.bounded_read import Unreadable, read_regular_file


def test_a_regular_file_is_read_whole(tmp_path):
    data = random.randbytes(100_003)
    (tmp_path / "f").write_bytes(data)
    assert read_regular_file(tmp_path / "f", 100_003) == data
    assert read_regular_file(os.fsencode(tmp_path / "f"), 1 << 20) == data
    (tmp_path / "empty").write_bytes(b"")
    assert read_regular_file(str(tmp_path / "empty"), 0) == b""


def test_over_the_limit_is_refused(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 4097)
    with pytest.raises(Unreadable, match="4097 bytes, more than 4096"):
        read_regular_file(tmp_path / "f", 4096)


@pytest.mark.parametrize("kind", ["dir", "fifo", "socket", "device", "missing"])
def test_what_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    path = tmp_path / kind
    keep = None
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait for ever
    elif kind == "socket":
        keep = socket.socket(socket.AF_UNIX)
        keep.bind(str(path))
    elif kind == "device":
        path = "/dev/zero"  # reads without end
    with pytest.raises(Unreadable) as e:
        read_regular_file(path, 1 << 20)
    assert e.value.missing == (kind == "missing")
    if kind != "missing":
        assert "not a regular file" in e.value.reason or "cannot open" in e.value.reason, e.value.reason
    if keep:
        keep.close()
