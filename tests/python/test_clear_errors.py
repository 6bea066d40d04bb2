"""Issue 30, item 10: clear errors where there were bare ones or none.

- ferry.load.read_catalog takes one path as a list of one (it walked a str one
  character at a time); None, a number or a list holding one is an
  InvalidArgumentError naming the argument, not a bare TypeError.
- A machine profile that is no profile (FERRY_PROFILE at garbage) is reported by the
  doctor as unusable, with the reason, not as "present"; the engine refuses the same
  files (each case is checked against ferry.engine in the same process).
- load_safetensors without a CUDA driver raises ferry.NoDeviceError, not PyTorch's
  RuntimeError.
"""

import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

import ferry
from ferry import InvalidArgumentError
from ferry.load import read_catalog


def write_safetensors(path, rng) -> dict:
    """A valid file of a few random tensors of odd sizes; {name: (dtype, shape)}."""
    tensors, header, offset, data = {}, {}, 0, b""
    for k in range(int(rng.integers(1, 5))):
        shape = [int(x) for x in rng.integers(1, 7, size=int(rng.integers(1, 3)))]
        blob = rng.standard_normal(int(np.prod(shape))).astype(np.float32).tobytes()
        name = f"layer{k}.w{rng.integers(1 << 30)}"
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        tensors[name] = ("F32", tuple(shape))
        offset += len(blob)
        data += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + data)
    return tensors


# ---- read_catalog ----------------------------------------------------------------------


def test_read_catalog_takes_one_path_as_a_list_of_one(tmp_path):
    rng = np.random.default_rng()
    path = tmp_path / "a.safetensors"
    tensors = write_safetensors(path, rng)
    want = read_catalog([str(path)])
    assert sorted(want["names"]) == sorted(tensors)
    assert [tuple(s) for s in want["shape"]] == [tensors[n][1] for n in want["names"]]
    for one in (str(path), path, os.fsencode(str(path))):
        assert read_catalog(one) == want, repr(one)
    assert read_catalog([path]) == want and read_catalog((os.fsencode(str(path)),)) == want


@pytest.mark.parametrize("files, name", [
    (None, "files=None"), (3, "files=3"), ([None], "files[0]=None"), (["a.safetensors", 7], "files[1]=7"),
    ([b"x", object()], "files[1]="),
])
def test_read_catalog_refuses_what_is_not_a_path_naming_it(files, name):
    with pytest.raises(InvalidArgumentError, match="expected a path") as e:
        read_catalog(files)
    assert name in str(e.value)


def test_read_catalog_refuses_a_bad_index_argument(tmp_path):
    path = tmp_path / "a.safetensors"
    write_safetensors(path, np.random.default_rng())
    for kw, name in (({"index_tensors": None}, "index_tensors=None"), ({"index_files": 5}, "index_files=5")):
        with pytest.raises(InvalidArgumentError, match=name):
            read_catalog(path, **kw)


# ---- the machine profile, in the doctor ------------------------------------------------------

CHILD = """
import json, sys
import ferry
from ferry import _ferry, facts
from ferry.doctor import report, text_report
f = facts.collect(None, _ferry)
text = " ".join(text_report.render([report.facts_section(f)]).split())
try:
    ferry.engine(0)
    engine = "ok"
except ferry.InvalidArgumentError as e:
    engine = "refused: " + str(e)
except ferry.FerryError as e:  # NoDeviceError here: the profile was taken, then no device
    engine = "took the profile"
print(json.dumps({"profile": f["host"]["copy_engine"]["profile"], "text": text, "engine": engine}))
"""


def doctor_on_profile(path) -> dict:
    """The profile facts, the doctor's text and the engine's verdict, in a process
    whose FERRY_PROFILE is `path` (the engine reads it once per process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env["FERRY_PROFILE"] = str(path)
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def profile_cases(tmp_path, secret):
    rng = np.random.default_rng()
    binary = tmp_path / "random.bin"
    binary.write_bytes(b"\x00" + rng.bytes(int(rng.integers(100, 5000))))
    passwd = tmp_path / "passwd"
    passwd.write_text(f"root:x:0:0:{secret}:/root:/bin/bash\n")
    as_json = tmp_path / "profile.json"
    as_json.write_text(json.dumps({"staging_slots": 8, "note": secret}))
    upper = tmp_path / "env.txt"
    upper.write_text(f"# comment\n\nPASSWORD = {secret}\n")
    big = tmp_path / "big.txt"
    big.write_text("# padding\n" * 7000)  # 70 KB of comments: over the engine's 64 KiB
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    return [(binary, "profile line "), (passwd, "expected key = value"),  # random bytes may hold a '='
            (as_json, "expected key = value"), (upper, "profile line 3: not a profile key"),
            (big, "larger than 64 KiB"), (tmp_path, "a directory"), (fifo, "not a regular file")]


def test_a_profile_that_is_no_profile_is_reported_unusable_with_the_reason(tmp_path):
    secret = os.urandom(6).hex()
    for path, why in profile_cases(tmp_path, secret):
        got = doctor_on_profile(path)
        profile = got["profile"]
        assert profile["present"] is None and why in profile["problem"], (path, profile)
        assert f"unusable: {profile['problem']}" in got["text"] and "present)" not in got["text"], got["text"]
        assert got["engine"].startswith("refused: "), (path, got["engine"])  # the engine agrees
        assert secret not in json.dumps(got), path  # a line of someone's file is never quoted


def test_a_real_profile_is_still_present(tmp_path):
    path = tmp_path / "profile.txt"
    share = np.random.default_rng().integers(0, 100) / 100
    path.write_text(f"# ferry machine profile\ncuda_below_bytes_h2d = 8388608\n\nhybrid_pinned_share_d2h = {share}  # x\n")
    got = doctor_on_profile(path)
    assert got["profile"] == {"path": str(path), "named": True, "present": True, "problem": None}
    assert f"{path} (FERRY_PROFILE, present)" in got["text"]
    assert got["engine"] in ("ok", "took the profile")


# ---- load_safetensors without a driver -------------------------------------------------------


def test_load_safetensors_without_a_device_raises_no_device_error(tmp_path):
    pytest.importorskip("torch")
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present: the load would run")
    from ferry.torch import load_safetensors

    path = tmp_path / "m.safetensors"
    write_safetensors(path, np.random.default_rng())
    for device in ("cuda", "cuda:0", None):
        with pytest.raises(ferry.NoDeviceError, match="no CUDA (driver|device)") as e:
            load_safetensors(path, device=device)
        assert "load_safetensors" in str(e.value)
