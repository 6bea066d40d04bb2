"""docs/api.md's words against the code (issue 43 item 1): every public signature
of ferry and ferry.torch (inspect.signature) uses each word of the table with its
one default, or is in the page's exceptions with the default it names; each
deprecated spelling is in the page, defaults to "unset" and warns, naming the new
one; sizes are ints, timeouts seconds (no parameter ends in _ms); device=None is
the current CUDA device by one rule (ferry/_device.py). GPU cases skip without a
device."""

from __future__ import annotations

import ast
import inspect
import math
import pathlib
import subprocess
import sys

import pytest

import ferry
import ferry.torch as ft
from ferry import _args, _device
from ferry.errors import InvalidArgumentError, NoDeviceError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "api.md").read_text()


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table under `## heading`, cells stripped of backticks."""
    section = PAGE.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[c.strip().strip("`") for c in row.strip("|").split("|")] for row in rows]


WORDS = {r[0]: r[3] for r in _table("The words")}
EXCEPTIONS = {(r[0], r[1]): r[2] for r in _table("Exceptions")}
DEPRECATED = {(r[0], r[1]): r[2] for r in _table("Deprecated spellings")}
FIXED = {w: d for w, d in WORDS.items() if not w.startswith("*") and d in ("None", "False")}


def _public():
    """(qualified name, callable) of every public function, class and method."""
    for prefix, module, names in (("ferry", ferry, ferry.__all__),
                                  ("ferry.torch", ft, [n for n in dir(ft) if not n.startswith("_")] + ["DataLoader"])):
        for name in names:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                if issubclass(obj, BaseException):
                    continue
                yield f"{prefix}.{name}", obj
                for m, f in inspect.getmembers(obj, inspect.isfunction):
                    if not m.startswith("_") and f.__qualname__.split(".")[0] == obj.__name__:
                        yield f"{prefix}.{name}.{m}", f
            elif inspect.isfunction(obj):
                yield f"{prefix}.{name}", obj


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a name such as Handoff.timeout: compared with the default's repr


def _same(default, text: str) -> bool:
    want = _literal(text)
    if isinstance(want, str) and not (text.startswith(("'", '"'))):
        return repr(default) == want
    return type(default) is type(want) and default == want


def check(items) -> list[str]:
    """What in `items` ((name, callable)) disagrees with docs/api.md."""
    bad, seen = [], set()
    for qual, fn in items:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            key = (qual, p.name)
            if key in DEPRECATED:
                seen.add(key)
                if p.default is not _args.UNSET:
                    bad.append(f"{qual}({p.name}=): deprecated, so its default is unset, not {p.default!r}")
            elif key in EXCEPTIONS:
                seen.add(key)
                if not _same(p.default, EXCEPTIONS[key]):
                    bad.append(f"{qual}({p.name}=): default {p.default!r}, docs/api.md says {EXCEPTIONS[key]}")
            elif p.name in FIXED:
                if not _same(p.default, FIXED[p.name]) and p.default is not inspect.Parameter.empty:
                    bad.append(f"{qual}({p.name}=): default {p.default!r}, the word's is {FIXED[p.name]}")
            elif p.name == "timeout":
                bad.append(f"{qual}(timeout={p.default!r}): each timeout's default is in docs/api.md's exceptions")
            if p.name.endswith("_ms") and key not in DEPRECATED:
                bad.append(f"{qual}({p.name}=): a timeout is seconds, named timeout")
            if (p.name in ("nbytes", "sizes") or p.name.endswith("_bytes")) and key not in EXCEPTIONS:
                d = p.default
                if not (d is inspect.Parameter.empty or d is None or (isinstance(d, int) and not isinstance(d, bool))):
                    bad.append(f"{qual}({p.name}={d!r}): a size is bytes as an int")
    return bad, seen


def test_every_public_signature_speaks_the_pages_words():
    bad, seen = check(_public())
    assert not bad, "docs/api.md and the code disagree:\n" + "\n".join(bad)
    stale = sorted((set(EXCEPTIONS) | set(DEPRECATED)) - seen)
    assert not stale, f"docs/api.md lists arguments no public signature has: {stale}"


def test_the_checker_can_fail():
    def wait(flag, timeout_ms=1000, *, device=0, nbytes="4K", timeout=3):  # noqa: ARG001
        pass

    bad, _ = check([("ferry.example", wait)])
    assert len(bad) == 4, bad  # timeout_ms, device=0, nbytes="4K", an unlisted timeout


def test_the_page_has_each_word():
    for word in ("device", "stream", "out", "timeout", "nbytes", "sizes"):
        assert word in WORDS, word
    assert "wait()" in PAGE and "device=None` is the current CUDA device" in PAGE


# ---- the deprecated spellings warn and still work ----------------------------------------


def test_channel_timeout_is_seconds():
    from ferry.channel import _request_ms

    assert _request_ms(5.0) == 5000 and _request_ms(0.0001) == 1 and _request_ms(2) == 2000
    assert _request_ms(None) == _args.MAX_U32 and _request_ms(math.inf) == _args.MAX_U32
    assert _request_ms(1e12) == _args.MAX_U32
    for bad in (0, -1, float("nan"), True, "5"):
        with pytest.raises(InvalidArgumentError, match="timeout="):
            _request_ms(bad)
    with pytest.raises(InvalidArgumentError, match="timeout=0"):  # before any device is asked for
        ferry.Channel(timeout=0)


def test_channel_timeout_ms_warns_and_is_still_checked():
    with pytest.warns(DeprecationWarning, match="timeout_ms= is deprecated: use timeout="):
        with pytest.raises(InvalidArgumentError, match="timeout_ms=4294967296"):
            ferry.Channel(timeout_ms=2**32)


def _unopened_channel():
    """A Channel whose native part was never made (no GPU here): argument handling
    runs, and the first native call fails with AttributeError."""
    return ferry.Channel.__new__(ferry.Channel)


@pytest.mark.parametrize("call, old", [
    (lambda ch: ch.wait(0, 1, timeout_ms=5), "timeout_ms"),
    (lambda ch: ch.wait(0, 1, 5), "timeout_ms"),  # the third positional argument: milliseconds, as before
    (lambda ch: ch.read(0, n=4), "n"),
    (lambda ch: ch.fill(0, 7, n=4), "n"),
])
def test_channel_method_spellings_warn_before_the_call(call, old):
    with pytest.warns(DeprecationWarning, match=f"{old}= is deprecated"):
        with pytest.raises(AttributeError, match="_native"):
            call(_unopened_channel())


def test_channel_read_refuses_both_spellings():
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgumentError, match="given both"):
        _unopened_channel().read(0, 4, n=4)


def test_snapshot_into_is_out():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(43)
    sd = {"w": torch.randn(1031, generator=g), "b": torch.randint(0, 255, (17,), dtype=torch.uint8, generator=g)}
    s = ft.snapshot(sd)
    sd2 = {"w": torch.randn(1031, generator=g), "b": torch.randint(0, 255, (17,), dtype=torch.uint8, generator=g)}
    with pytest.warns(DeprecationWarning, match="snapshot: into= is deprecated: use out="):
        assert ft.snapshot(sd2, into=s) is s
    assert all(torch.equal(s.tensors[k], sd2[k]) for k in sd2)
    sd3 = {k: v + 1 for k, v in sd2.items()}
    assert ft.snapshot(sd3, out=s) is s and all(torch.equal(s.tensors[k], sd3[k]) for k in sd3)
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgumentError, match="given both"):
        ft.snapshot(sd3, out=s, into=s)


# ---- device=None: the one rule -----------------------------------------------------------


def test_current_device_neither_imports_torch_nor_starts_cuda():
    code = ("import sys; from ferry import _device; print(_device.current(), 'torch' in sys.modules); "
            "import torch; print(_device.current(), torch.cuda.is_initialized())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "False", "0", "False"], r.stdout


def test_index_keeps_an_explicit_device():
    assert _device.index(3) == 3 and _device.index(0) == 0
    assert _device.index(None) == _device.current()


@pytest.mark.gpu
def test_none_follows_pytorchs_current_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices (PyTorch sees {torch.cuda.device_count()})")
    before = torch.cuda.current_device()
    last = torch.cuda.device_count() - 1
    torch.cuda.set_device(last)
    try:
        assert _device.current() == last
        assert ferry.PinnedPool().device == last
        assert ft.default_pinned_pool().device == last
        assert ferry.Loader().device == last
    finally:
        torch.cuda.set_device(before)


def test_without_a_gpu_none_is_device_zero_and_says_no_device():
    if ferry.cuda_info() and ferry.cuda_info().get("devices"):
        pytest.skip("a CUDA device is present")
    with pytest.raises(NoDeviceError):
        ferry.PinnedPool()  # device None -> 0, and there is none
    with pytest.raises(NoDeviceError):
        ferry.Channel()
