"""The OS layer as python/ferry sees it (src/python/os_bindings.cpp, issue 39 item 4):
real files (random contents, odd offsets and sizes, short, truncated, a FIFO, a bad
descriptor, unmapped memory), real memfd and anonymous mappings, real sockets passing
real descriptors between real processes, and /proc. No mocks: every failure is one
the kernel gave."""

import errno
import multiprocessing
import os
import random
import threading
import time

import pytest

from ferry import _ferry
from ferry.errors import InvalidArgumentError, OSLayerError

MiB = 1 << 20
POISON = 0xA5


def _poisoned(nbytes: int):
    m = _ferry.Mapping.anonymous(nbytes)
    v = memoryview(m)
    v[:] = bytes([POISON]) * len(v)
    v.release()
    return m


def _bytes(m, lo: int, hi: int) -> bytes:
    with memoryview(m) as v:
        return bytes(v[lo:hi])


def _bounded(call, seconds: float = 10.0):
    """call() on a thread: (result or exception, finished within `seconds`)."""
    out = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return out, not t.is_alive()


@pytest.fixture
def random_file(tmp_path):
    rng = random.Random(39)
    size = 37 * MiB + 4093  # not a multiple of any chunk or page
    data = rng.randbytes(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return str(path), data


# ---- files ------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_read_range_reads_odd_ranges_exactly(random_file, threads):
    path, data = random_file
    rng = random.Random(threads)
    cases = [(0, len(data)), (1, 4095), (4097, 9 * MiB + 13), (len(data) - 777, 777), (12345, 0),
             *((rng.randrange(len(data)), None) for _ in range(6))]
    with _ferry.File(path) as f:
        for offset, n in cases:
            n = rng.randrange(1, len(data) - offset + 1) if n is None else n
            lead = rng.randrange(1, 4096)  # a destination at an odd address
            m = _poisoned(lead + n + 4096)
            got = f.read_range(offset, m.address + lead, n, threads)
            assert got == n
            assert _bytes(m, lead, lead + n) == data[offset:offset + n], (offset, n)
            assert set(_bytes(m, 0, lead)) <= {POISON} and set(_bytes(m, lead + n, lead + n + 4096)) == {POISON}
            m.close()
    # The module function takes a path or a descriptor as well as a File.
    m = _poisoned(len(data))
    assert _ferry.read_range(path, 3, m.address, 5 * MiB, 4) == 5 * MiB
    assert _bytes(m, 0, 5 * MiB) == data[3:3 + 5 * MiB]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _ferry.read_range(fd, 0, m.address, len(data), 2) == len(data)
    finally:
        os.close(fd)
    assert _bytes(m, 0, len(data)) == data


def test_identity_is_fstat_and_stat(random_file):
    path, data = random_file
    st = os.stat(path)
    want = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    with _ferry.File(path) as f:
        assert f.identity() == want and f.name == path and not f.closed
    assert f.closed
    assert _ferry.path_identity(path) == want
    with pytest.raises(OSLayerError) as e:
        _ferry.path_identity(path + ".missing")
    assert e.value.errno == errno.ENOENT and path in str(e.value)


def test_a_short_file_is_named_or_counted(random_file):
    path, data = random_file
    m = _poisoned(2 * MiB)
    with _ferry.File(path) as f:
        at = len(data) - 1000
        with pytest.raises(InvalidArgumentError) as e:
            f.read_range(at, m.address, 5000, 4)
        assert str(e.value).startswith(f"{path}: ends at byte {len(data)}, before byte {at + 5000}")
        assert "shrank while it was read" in str(e.value)
        assert f.read_range(at, m.address, 5000, 4, allow_short=True) == 1000
        assert _bytes(m, 0, 1000) == data[at:] and set(_bytes(m, 1000, 5000)) == {POISON}
        assert f.read_range(len(data) + 10, m.address, 100, allow_short=True) == 0


def test_a_file_truncated_after_it_was_sized_gives_a_clear_error(random_file):
    """What a node load meets when a shard shrinks under it: the size came from fstat
    at the open, the file is shorter by the time it is read."""
    path, data = random_file
    m = _poisoned(len(data))
    with _ferry.File(path) as f:
        size = f.identity()[2]
        os.truncate(path, size // 3 + 5)
        with pytest.raises(InvalidArgumentError, match=rf"^{path}: ends at byte {size // 3 + 5}, before byte {size}"):
            f.read_range(0, m.address, size, 8)
    assert _bytes(m, 0, size // 3 + 5) == data[:size // 3 + 5]


def test_a_file_truncated_while_it_is_read_gives_all_bytes_or_a_clear_error(tmp_path):
    """A truncation racing a multi-threaded read: either the read finished first (every
    byte right) or it names where the file ended; never a hang or stale success."""
    path = str(tmp_path / "shrinking.bin")
    size = 96 * MiB
    data = random.Random(7).randbytes(size)
    m = _poisoned(size)
    outcomes = set()
    for k in range(4):
        with open(path, "wb") as out:
            out.write(data)
        with _ferry.File(path) as f:
            cut = size // 2 + k * 4096
            t = threading.Timer(0.001 * k, os.truncate, (path, cut))
            t.start()
            try:
                got = f.read_range(0, m.address, size, 8)
                assert got == size and _bytes(m, 0, size) == data
                outcomes.add("whole")
            except InvalidArgumentError as e:
                assert str(e).startswith(f"{path}: ends at byte ") and f"before byte {size}" in str(e)
                outcomes.add("short")
            t.join()
    assert outcomes


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_only_a_regular_file_is_opened_and_a_fifo_never_waits(tmp_path, kind):
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    else:
        path = str(tmp_path) if kind == "directory" else kind
    m = _poisoned(4096)
    for call in (lambda: _ferry.File(path), lambda: _ferry.read_range(path, 0, m.address, 100)):
        out, finished = _bounded(call)
        assert finished, f"{kind}: the open waited"
        assert isinstance(out.get("error"), InvalidArgumentError) and str(out["error"]) == f"{path}: not a regular file"
    if kind == "fifo":  # a descriptor of one is refused too
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            with pytest.raises(InvalidArgumentError, match="a FIFO, not a regular file"):
                _ferry.read_range(fd, 0, m.address, 100)
        finally:
            os.close(fd)


def test_read_errors_name_the_file_the_byte_and_the_call(random_file):
    path, _ = random_file
    m = _poisoned(MiB)
    fd = os.open(path, os.O_WRONLY)  # pread on it: EBADF from the kernel
    try:
        with pytest.raises(OSLayerError) as e:
            _ferry.read_range(fd, 4096, m.address, 1000, 2)
        assert e.value.errno == errno.EBADF and f"pread of descriptor {fd} at byte 4096" in str(e.value)
    finally:
        os.close(fd)
    gone = _ferry.Mapping.anonymous(MiB)
    address = gone.address
    gone.close()  # unmapped: pread answers EFAULT, nothing faults
    with _ferry.File(path) as f:
        with pytest.raises(OSLayerError) as e:
            f.read_range(0, address, MiB, 4)
        assert e.value.errno == errno.EFAULT and f"pread of {path}" in str(e.value)
        for bad in ({"threads": 0}, {"threads": 65}, {"threads": True}, {"nbytes": -1}, {"offset": -5}):
            kwargs = {"offset": 0, "address": m.address, "nbytes": 10, "threads": 1, **bad}
            with pytest.raises(InvalidArgumentError):
                f.read_range(**kwargs)
    f.close()
    with pytest.raises(InvalidArgumentError, match="was closed"):
        f.read_range(0, m.address, 10)


@pytest.mark.parametrize("direct", [False, True])
def test_direct_reads_where_the_file_system_has_them(random_file, direct):
    path, data = random_file
    try:
        f = _ferry.File(path, direct=direct)
    except OSLayerError as e:
        assert direct and e.errno == errno.EINVAL
        pytest.skip("this file system has no O_DIRECT (tmpfs?)")
    m = _poisoned(len(data) + 8192)
    with f:
        got = f.read_range(0, m.address, (len(data) + 4095) // 4096 * 4096, 4, allow_short=True)
    assert got == len(data) and _bytes(m, 0, len(data)) == data


def test_small_files_by_name(tmp_path):
    p = tmp_path / "small.json"
    p.write_bytes(b'{"a": 1}')
    assert _ferry.read_regular_file(str(p), 8) == (b'{"a": 1}', "", False)
    assert _ferry.read_regular_file(str(p), 7) == (None, "8 bytes, more than 7", False)
    assert _ferry.read_regular_file(str(tmp_path / "none"), 9)[1:] == ("cannot open it: No such file or directory", True)
    os.mkfifo(tmp_path / "fifo")
    out, finished = _bounded(lambda: _ferry.read_regular_file(str(tmp_path / "fifo"), 9))
    assert finished and out["value"] == (None, "a FIFO, not a regular file", False)
    assert _ferry.read_regular_file("/dev/zero", 9) == (None, "a device, not a regular file", False)
    assert _ferry.read_regular_file(str(tmp_path), 9) == (None, "a directory, not a regular file", False)


def test_write_stream_into_a_fifo_never_waits_for_a_reader(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    out, finished = _bounded(lambda: _ferry.write_stream(fifo, b"page"))
    assert finished and isinstance(out.get("error"), OSLayerError) and out["error"].errno == errno.ENXIO
    assert "is a FIFO with no reader" in str(out["error"])
    payload = random.Random(3).randbytes(3 * MiB + 1)  # more than a pipe holds: the writes block, then go on
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = bytearray()
    writer = threading.Thread(target=_ferry.write_stream, args=(fifo, payload))
    writer.start()
    deadline = time.monotonic() + 30
    while len(got) < len(payload) and time.monotonic() < deadline:  # empty reads: no writer yet, or between
        try:
            got += os.read(reader, MiB)
        except BlockingIOError:
            time.sleep(0.001)
    writer.join(10)
    os.close(reader)
    assert bytes(got) == payload
    regular = tmp_path / "file"
    regular.write_bytes(b"x")
    with pytest.raises(OSLayerError) as e:
        _ferry.write_stream(str(regular), b"y")
    assert e.value.errno == errno.EINVAL and regular.read_bytes() == b"x"


# ---- memory -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["anonymous", "memfd"])
@pytest.mark.parametrize("huge", [None, True, False])
def test_mappings_hold_what_is_written_and_refuse_to_close_under_a_view(kind, huge):
    make = _ferry.Mapping.anonymous if kind == "anonymous" else _ferry.Mapping.memfd
    m = make(5 * MiB + 3, huge)
    assert m.nbytes == 6 * MiB and m.address % (2 * MiB) == 0 and len(m) == 6 * MiB
    data = random.Random(5).randbytes(m.nbytes)
    v = memoryview(m)
    v[:] = data
    assert bytes(v) == data and m.exports == 1
    with pytest.raises(BufferError):
        m.close()
    huge_bytes = m.huge_bytes()
    assert 0 <= huge_bytes <= m.nbytes + 4 * MiB  # smaps counts whole mappings
    if huge is False:
        assert huge_bytes == 0
    v.release()
    m.close()
    assert m.closed
    with pytest.raises(InvalidArgumentError, match="was closed"):
        m.address
    for bad in (0, -1, True, 1 << 51):
        with pytest.raises(InvalidArgumentError):
            make(bad)


def test_a_shared_mapping_of_a_memfd_sees_the_same_pages(tmp_path):
    fd = os.memfd_create("ferry-test")
    try:
        os.ftruncate(fd, 3 * MiB)
        a, b = _ferry.Mapping.shared(fd), _ferry.Mapping.shared(fd)
        data = random.Random(11).randbytes(3 * MiB)
        with memoryview(a) as va:
            va[:] = data
        assert a.address != b.address and _bytes(b, 0, 3 * MiB) == data
        r, w = os.pipe()
        try:
            with pytest.raises(InvalidArgumentError, match="a FIFO, not memory to map"):
                _ferry.Mapping.shared(r)
        finally:
            os.close(r)
            os.close(w)
        empty = os.memfd_create("ferry-empty")
        with pytest.raises(InvalidArgumentError, match="an empty file"):
            _ferry.Mapping.shared(empty)
        os.close(empty)
    finally:
        os.close(fd)


def test_a_memory_span_holds_its_owner_and_refuses_unmapped_memory():
    m = _ferry.Mapping.anonymous(MiB)
    s = _ferry.MemorySpan(m.address + 7, 1000, m)
    assert s.owner is m and len(s) == 1000
    with memoryview(s) as v:
        v[:] = b"\x01" * 1000
    assert _bytes(m, 7, 1007) == b"\x01" * 1000
    ro = memoryview(_ferry.MemorySpan(m.address, 10, m, readonly=True))
    assert ro.readonly
    ro.release()
    address = m.address
    del s
    m.close()
    for bad in ((address, 4096), (0, 1), (8, 100)):
        with pytest.raises(InvalidArgumentError, match="not all of it is mapped"):
            _ferry.MemorySpan(*bad, None)


# ---- sockets between processes ----------------------------------------------------


def _child_sends_a_memfd(sock, seed: int, nbytes: int) -> None:
    data = random.Random(seed).randbytes(nbytes)
    fd = os.memfd_create("ferry-passed")
    os.write(fd, data)
    assert sock.send(b"header:%d" % nbytes, fd, 10.0)
    os.close(fd)
    got = sock.receive(64, 10.0)  # the parent's answer, with its own descriptor
    data2, passed, truncated = got
    assert not truncated and data2 == b"answer" and passed >= 0
    back = _ferry.Mapping.shared(passed)
    _ferry.close_descriptor(passed)
    assert _bytes(back, 0, 6) == b"parent"
    assert sock.send(b"done", -1, 10.0)
    sock.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_descriptors_pass_between_real_processes(method):
    ctx = multiprocessing.get_context(method)
    if method == "spawn":  # the DataLoader's module registers how a PacketSocket reaches a spawned child
        pytest.importorskip("torch")
        from ferry.torch.data import chunk_passing

        assert chunk_passing.socket_pair is not None

    ours, theirs = _ferry.packet_socket_pair()
    nbytes = 2 * MiB + 17
    child = ctx.Process(target=_child_sends_a_memfd, args=(theirs, 29, nbytes))
    child.start()
    theirs.close()
    try:
        data, fd, truncated = ours.receive(64, 60.0)
        assert data == b"header:%d" % nbytes and fd >= 0 and not truncated
        m = _ferry.Mapping.shared(fd)
        _ferry.close_descriptor(fd)
        assert _bytes(m, 0, nbytes) == random.Random(29).randbytes(nbytes)
        mine = os.memfd_create("ferry-parent")
        os.write(mine, b"parent")
        assert ours.send(b"answer", mine, 10.0)
        os.close(mine)
        assert ours.receive(64, 30.0) == (b"done", -1, False)
        assert ours.receive(64, 30.0) == (b"", -1, False)  # the child closed its end: end of file
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_socket_waits_are_bounded_and_a_gone_peer_is_false():
    a, b = _ferry.packet_socket_pair()
    t0 = time.monotonic()
    assert a.receive(64, 0.2) is None and a.receive(64, 0) is None
    assert 0.15 < time.monotonic() - t0 < 5
    assert a.send(b"x" * 100)
    assert b.receive(64) == (b"x" * 64, -1, True)  # longer than asked: truncated
    # A full queue: the send waits at most its timeout, then ETIMEDOUT.
    with pytest.raises(OSLayerError) as e:
        for _ in range(1 << 20):
            a.send(b"y" * 4096, -1, 0.2)
    assert e.value.errno == errno.ETIMEDOUT
    b.close()
    assert a.send(b"z") is False  # the peer is gone: no exception
    a.close()
    with pytest.raises(InvalidArgumentError, match="was closed"):
        a.fileno()
    for bad in (0, 1 << 21):
        c, d = _ferry.packet_socket_pair()
        with pytest.raises(InvalidArgumentError):
            c.receive(bad)
        c.close()
        d.close()


# ---- processes --------------------------------------------------------------------


def _stat_ticks(pid) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    return int(text[text.rindex(b")") + 2:].split()[19])


def test_process_start_times_boot_id_and_namespace():
    assert _ferry.process_start_ticks(0) == _stat_ticks("self") == _ferry.process_start_ticks(os.getpid())
    assert _ferry.process_start_ticks(1) == _stat_ticks(1)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    child.start()
    child.join(30)
    assert _ferry.process_start_ticks(child.pid) is None  # reaped: its /proc entry is gone
    with pytest.raises(InvalidArgumentError):
        _ferry.process_start_ticks(-1)
    with open("/proc/sys/kernel/random/boot_id", "rb") as f:
        assert _ferry.boot_id() == f.read().strip()
    assert _ferry.pid_namespace() == os.readlink("/proc/self/ns/pid").encode()
