"""Issue 21 (hardening, second round), items 2-6 and 8: files read by name are bounded
and must be regular files (a FIFO never hangs a load), any path the OS accepts works
(names that are not UTF-8 included), and a wrong argument is an InvalidArgumentError
naming it, never nanobind's "incompatible function arguments", a std::bad_cast or an
AttributeError. None of it needs a GPU: arguments and files are checked first.

Calls that could hang (a FIFO, /dev/zero) run in a child process with a deadline."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ferry
import ferry.load
import ferry.nixl
from ferry import InvalidArgumentError

MiB = 1 << 20


def run_child(code: str, env_extra: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter; a hang past `timeout` fails the test."""
    env = dict(os.environ, **(env_extra or {}))
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not end within {timeout} s (a read without end or a blocking open)")


def safetensors_bytes(rng, name: str = "t") -> tuple[bytes, bytes]:
    """A small valid safetensors file of random float32 data: (file bytes, data bytes)."""
    count = int(rng.integers(1, 64))
    data = rng.standard_normal(count).astype(np.float32).tobytes()
    header = json.dumps({name: {"dtype": "F32", "shape": [count], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data, data


# ---- item 2: FERRY_PROFILE is read bounded, from a regular file, without quoting ----------


def profile_child(path: str) -> subprocess.CompletedProcess:
    return run_child("""
        import ferry
        try:
            ferry.engine(0)
        except ferry.FerryError as e:
            print(type(e).__name__, e)
    """, {"FERRY_PROFILE": path})


def test_a_profile_that_never_ends_is_refused_at_once():
    r = profile_child("/dev/zero")  # read only: /dev/zero is never written or replaced
    assert r.stdout.startswith("InvalidArgumentError") and "not a regular file" in r.stdout, r.stdout + r.stderr


def test_a_profile_that_is_a_directory_or_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    for path, why in ((tmp_path, "a directory"), (fifo, "not a regular file")):
        r = profile_child(str(path))
        assert r.stdout.startswith("InvalidArgumentError") and why in r.stdout, r.stdout + r.stderr


def test_a_profile_larger_than_a_profile_is_refused(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("# padding\n" * 20000)  # 200 KB of comments
    r = profile_child(str(big))
    assert r.stdout.startswith("InvalidArgumentError") and "64 KiB" in r.stdout, r.stdout + r.stderr


def test_a_file_that_is_not_a_profile_is_not_quoted(tmp_path):
    secret = os.urandom(8).hex()
    for text in (f"root:{secret}:19000:0:99999:7:::\n", f"PASSWORD = {secret}\n", f"{secret}\n"):
        shadow = tmp_path / "shadow"
        shadow.write_text(text)
        r = profile_child(str(shadow))
        assert r.stdout.startswith("InvalidArgumentError") and "profile line 1" in r.stdout, r.stdout + r.stderr
        assert secret not in r.stdout + r.stderr


def test_a_bad_value_in_a_real_profile_is_still_quoted(tmp_path):
    profile = tmp_path / "profile.txt"
    profile.write_text("staging_slots = 1\n")
    r = profile_child(str(profile))
    assert "staging_slots = 1" in r.stdout, r.stdout + r.stderr


# ---- item 4: a FIFO in a checkpoint is refused, never waited on ------------------------


def test_fifo_shard_header_and_index_are_refused_without_a_hang(tmp_path):
    shard, index = tmp_path / "model.safetensors", tmp_path / "model.safetensors.index.json"
    os.mkfifo(shard)
    os.mkfifo(index)
    r = run_child(f"""
        import ferry, ferry.load
        for call in (lambda: ferry.load.read_safetensors_header({str(shard)!r}),
                     lambda: ferry.load.read_shard_index({str(index)!r})):
            try:
                call()
                print("accepted")
            except ferry.InvalidArgumentError as e:
                print("refused:", e)
    """)
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(x.startswith("refused:") and "not a regular file" in x for x in lines), r
    assert str(shard) in lines[0] and str(index) in lines[1]


def test_load_safetensors_refuses_a_fifo_in_a_directory(tmp_path):
    pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    (tmp_path / "a.safetensors").write_bytes(safetensors_bytes(rng, "a")[0])
    os.mkfifo(tmp_path / "b.safetensors")
    r = run_child(f"""
        import ferry, ferry.torch
        try:
            ferry.torch.load_safetensors({str(tmp_path)!r})
        except ferry.InvalidArgumentError as e:
            print("refused:", e)
    """, timeout=120)
    assert r.stdout.startswith("refused:") and "b.safetensors: not a regular file" in r.stdout, r.stdout + r.stderr


def test_an_index_larger_than_an_index_is_refused(tmp_path, monkeypatch):
    index = tmp_path / "model.safetensors.index.json"
    index.write_bytes(b" " * 4096)
    monkeypatch.setattr(ferry.load, "MAX_INDEX_BYTES", 1024)
    with pytest.raises(InvalidArgumentError, match="more than a shard index"):
        ferry.load.read_shard_index(index)


# ---- item 5: any path the OS accepts ---------------------------------------------------


def test_file_names_that_are_not_utf8(tmp_path):
    rng = np.random.default_rng(5)
    folder = os.fsencode(tmp_path)
    blob, data = safetensors_bytes(rng, "w")
    path_b = os.path.join(folder, b"model-\xff.safetensors")
    with open(path_b, "wb") as f:
        f.write(blob)
    for path in (path_b, os.fsdecode(path_b)):  # bytes, and str with a surrogate escape
        h = ferry.load.read_safetensors_header(path)
        assert h["tensors"][0][0] == "w" and h["file_bytes"] == len(blob)
    # An index naming that shard, as bytes and as text read with surrogateescape.
    index_b = b'{"weight_map": {"w": "model-\xff.safetensors"}}'
    index_path = os.path.join(folder, b"model-\xfe.safetensors.index.json")
    with open(index_path, "wb") as f:
        f.write(index_b)
    try:
        shards, names, shard_of = ferry.load.read_shard_index(index_path)
    except InvalidArgumentError as e:  # refused as JSON that is not UTF-8: the file is named
        assert "model-\\xfe" in str(e), str(e)
    else:
        assert names == ["w"] and shards == [os.fsdecode(b"model-\xff.safetensors")] and shard_of == [0]
        assert os.path.exists(os.path.join(os.fsdecode(folder), shards[0]))
    # A broken file with such a name: the error names it (escaped), not a UnicodeDecodeError.
    broken = os.path.join(folder, b"broken-\xff.safetensors")
    with open(broken, "wb") as f:
        f.write(b"\x00" * 4)
    with pytest.raises(InvalidArgumentError, match=r"broken-\\xff"):
        ferry.load.read_safetensors_header(broken)


def test_load_safetensors_catalogs_a_directory_of_non_utf8_names(tmp_path):
    pytest.importorskip("torch")
    from ferry.torch import safetensors as st

    rng = np.random.default_rng(6)
    blob, _ = safetensors_bytes(rng, "x")
    with open(os.path.join(os.fsencode(tmp_path), b"model-\xff.safetensors"), "wb") as f:
        f.write(blob)
    files, index_tensors, index_files = st._resolve(tmp_path)
    catalog = st._catalog(files, index_tensors, index_files)
    assert list(catalog.names) == ["x"] and os.fsencode(files[0]).endswith(b"model-\xff.safetensors")


# ---- items 3 and 6: wrong argument types -----------------------------------------------


def gen(*items):
    return (x for x in items)


# (id, call, text the InvalidArgumentError must hold: the argument's name)
CASES = [
    # copy's stream (were std::bad_cast)
    ("copy(stream=-1)", lambda: ferry.copy(4096, 8192, 4, device=0, stream=-1), "stream=-1"),
    ("copy(stream=2**64)", lambda: ferry.copy(4096, 8192, 4, device=0, stream=2**64), f"stream={2**64}"),
    ("copy(stream=-2**63)", lambda: ferry.copy(4096, 8192, 4, device=0, stream=-2**63), f"stream={-2**63}"),
    ("copy(stream='s')", lambda: ferry.copy(4096, 8192, 4, device=0, stream="s"), "stream"),
    # None and other types where nanobind said "incompatible function arguments"
    ("copy(None, ...)", lambda: ferry.copy(None, bytes(8)), "dst"),
    ("copy(..., None)", lambda: ferry.copy(bytearray(8), None), "src"),
    ("copy_async(None, ...)", lambda: ferry.copy_async(None, bytes(8)), "dst"),
    ("copy(device='0')", lambda: ferry.copy(bytearray(8), bytes(8), device="0"), "device='0'"),
    ("copy(strategy=5)", lambda: ferry.copy(bytearray(8), bytes(8), strategy=5), "strategy"),
    ("copy_many(strategy=5)", lambda: ferry.copy_many([1], [2], [1], strategy=5), "strategy"),
    # copy_many with iterables that are not lists (were std::bad_cast)
    ("copy_many(None, None)", lambda: ferry.copy_many(None, None), "dsts=None"),
    ("copy_many(gen, gen)", lambda: ferry.copy_many(gen(4096), gen(8192)), "sizes"),
    ("copy_many(gen, gen) of buffers", lambda: ferry.copy_many(gen(bytearray(8)), gen(bytes(9))), "item 0"),
    ("copy_many(dict, dict)", lambda: ferry.copy_many({"a": 1}, {"b": 2}), "dsts[0]"),
    ("copy_many(int, int)", lambda: ferry.copy_many(5, 6), "dsts=5"),
    ("copy_many(float, float)", lambda: ferry.copy_many(1.5, 2.5), "dsts=1.5"),
    ("copy_many(str, str)", lambda: ferry.copy_many("ab", "cd"), "dsts='ab'"),
    ("copy_many([], [], [])", lambda: ferry.copy_many([], [], []), "no items"),
    ("copy_many(sizes=None item)", lambda: ferry.copy_many([1], [2], [None]), "sizes[0]=None"),
    ("copy_many_async(None, None)", lambda: ferry.copy_many_async(None, None), "dsts=None"),
    # engine, Engine, register
    ("engine('0')", lambda: ferry.engine("0"), "device='0'"),
    ("engine(None)", lambda: ferry.engine(None), "device=None"),
    ("engine(1.0)", lambda: ferry.engine(1.0), "device=1.0"),
    ("engine(-1)", lambda: ferry.engine(-1), "device=-1"),
    ("Engine('x')", lambda: ferry._ferry.Engine("x"), "device='x'"),
    ("register(device=None)", lambda: ferry.register(bytearray(64), device=None), "device=None"),
    ("register(device='0')", lambda: ferry.register(bytearray(64), device="0"), "device='0'"),
    ("register(None)", lambda: ferry.register(None), "obj"),
    # Loader: each of its options (were std::bad_cast), and the device
    ("Loader(True)", lambda: ferry.load.Loader(True), "device=True"),  # None: the current device (docs/api.md)
    ("Loader('0')", lambda: ferry.load.Loader("0"), "device='0'"),
    ("Loader(staging_bytes=-1)", lambda: ferry.load.Loader(0, staging_bytes=-1), "staging_bytes=-1"),
    ("Loader(staging_bytes='1G')", lambda: ferry.load.Loader(0, staging_bytes="1G"), "staging_bytes='1G'"),
    ("Loader(slot_bytes=1.5)", lambda: ferry.load.Loader(0, slot_bytes=1.5), "slot_bytes=1.5"),
    ("Loader(slot_bytes=2**64)", lambda: ferry.load.Loader(0, slot_bytes=2**64), f"slot_bytes={2**64}"),
    ("Loader(threads=-1)", lambda: ferry.load.Loader(0, threads=-1), "threads=-1"),
    ("Loader(threads='4')", lambda: ferry.load.Loader(0, threads="4"), "threads='4'"),
    ("Loader(direct_io=1)", lambda: ferry.load.Loader(0, direct_io=1), "direct_io=1"),
    ("Loader(direct_io='maybe')", lambda: ferry.load.Loader(0, direct_io="maybe"), "maybe"),
    ("Loader(progress='yes')", lambda: ferry.load.Loader(0, progress="yes"), "progress='yes'"),
    # the safetensors parsers
    ("parse_shard_index(None)", lambda: ferry.load.parse_shard_index(None), "text=None"),
    ("parse_shard_index(b'{}')", lambda: ferry.load.parse_shard_index(b"{}"), "weight_map"),
    ("parse_shard_index(name=5)", lambda: ferry.load.parse_shard_index("{}", 5), "name=5"),
    ("parse_safetensors_header(None)", lambda: ferry.load.parse_safetensors_header(None), "data=None"),
    ("parse_safetensors_header('x')", lambda: ferry.load.parse_safetensors_header("x"), "data='x'"),
    ("parse_safetensors_header(5)", lambda: ferry.load.parse_safetensors_header(5), "data=5"),
    ("read_safetensors_header(None)", lambda: ferry.load.read_safetensors_header(None), "path=None"),
    ("read_safetensors_header(5)", lambda: ferry.load.read_safetensors_header(5), "path=5"),
    ("read_shard_index(None)", lambda: ferry.load.read_shard_index(None), "path=None"),
    # ferry.nixl with agent=None (was AttributeError)
    ("nixl.register(None, ...)", lambda: ferry.nixl.register(None, bytearray(64)), "agent=None"),
    ("nixl.register_pool(None, ...)", lambda: ferry.nixl.register_pool(None, ferry.Pool(chunk_bytes=2 * MiB)),
     "agent=None"),
    ("nixl.xfer_descs(None, ...)", lambda: ferry.nixl.xfer_descs(None, ferry.nixl.descs(bytearray(8))),
     "agent=None"),
    ("nixl.reg_descs(None, ...)", lambda: ferry.nixl.reg_descs(None, ferry.nixl.descs(bytearray(8))),
     "agent=None"),
    ("nixl.add_remote(None, ...)", lambda: ferry.nixl.add_remote(None, b""), "agent=None"),
    ("nixl.publish_metadata(None, ...)", lambda: ferry.nixl.publish_metadata(None, "/nonexistent/x"),
     "agent=None"),
    ("nixl.load_metadata(None, ...)", lambda: ferry.nixl.load_metadata(None, "/nonexistent/x"), "agent=None"),
    ("nixl.read(None, ...)", lambda: ferry.nixl.read(None, bytearray(8), bytearray(8), "peer"), "agent=None"),
    ("nixl.write(None, ...)", lambda: ferry.nixl.write(None, bytearray(8), bytearray(8), "peer"), "agent=None"),
    ("nixl.post(None, ...)", lambda: ferry.nixl.post(None, "READ", bytearray(8), bytearray(8), "peer"),
     "agent=None"),
    ("nixl.transfer(5, ...)", lambda: ferry.nixl.transfer(5, "READ", bytearray(8), bytearray(8), "peer"),
     "agent=5"),
]


@pytest.mark.parametrize("call, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_argument_is_an_invalid_argument_error_naming_it(call, text):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert text in str(info.value), str(info.value)
    assert "incompatible function arguments" not in str(info.value)


# Every native call a user reaches through ferry's wrappers, with its positional
# arguments (all but the flags).
NATIVE = [("copy", 6), ("copy_async", 6), ("copy_many", 6), ("engine", 1), ("read_safetensors_header", 1),
          ("parse_safetensors_header", 2), ("parse_shard_index", 2), ("shard_index_columns", 2), ("read_catalog", 3), ("Loader", 6), ("Engine", 1),
          ("Registration", 3), ("resolve_copy_arg", 1)]


@pytest.mark.parametrize("name, arity", NATIVE, ids=[n for n, _ in NATIVE])
def test_the_native_calls_take_none_for_every_argument(name, arity):
    # The one mechanism: every argument is taken as a Python object (None included) and
    # checked by src/python/args.h, so nanobind never answers with its own TypeError.
    fn = getattr(ferry._ferry, name)
    trials = [[None] * arity]
    for i in range(arity):  # None in each place, 0 elsewhere
        trials.append([0] * arity)
        trials[-1][i] = None
    for call_args in trials:
        try:
            fn(*call_args)
        except ferry.FerryError:
            pass
        except TypeError as e:
            pytest.fail(f"{name}{tuple(call_args)}: {e}")


# ---- item 8: one check of FERRY_CHUNK_SIZE for check_options() and Pool() --------------


@pytest.mark.parametrize("value", ["0", "3", str(2**64 - 1), "3MiB"])
def test_check_options_and_pool_agree_on_chunk_sizes(value):
    r = run_child("""
        import ferry
        for call in (ferry.check_options, lambda: ferry.Pool()):
            try:
                call()
                print("accepted")
            except ferry.InvalidArgumentError as e:
                print("refused:", e)
    """, {"FERRY_CHUNK_SIZE": value})
    lines = r.stdout.splitlines()
    assert lines and lines[0].startswith("refused:") and "FERRY_CHUNK_SIZE" in lines[0], r.stdout + r.stderr
    assert len(lines) == 2 and lines[1].startswith("refused:"), r.stdout + r.stderr
