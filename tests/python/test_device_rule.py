"""ferry.torch's one meaning of a `device` argument (written in
ferry/torch/__init__.py): where a GPU is the destination, None and "cuda" are the
calling thread's current CUDA device; the host is asked for aloud (the
DataLoader's device="cpu"). Every public name of ferry.torch with a `device`
parameter must be in one of the tables below, with the default the rule gives
it; the destinations refuse a CPU device and say when there is no GPU. CPU
cases run here; the GPU cases skip without a device."""

import inspect
import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# GPU destinations: device=None is the current CUDA device.
DESTINATIONS = {"to_device": None, "load_safetensors": None}
# Host or GPU: the host is said aloud (None: the old meaning, CPU batches, with a FutureWarning).
HOST_OR_GPU = {"DataLoader": "cpu"}
# Not destinations: an int index of a per-GPU resource (-1: every device; None: the
# current CUDA device by ferry's one rule, docs/api.md).
INDEXES = {"default_pinned_pool": None, "allocator_stats": -1, "empty_cache": -1}


def _public():
    """{name: callable} of ferry.torch's public functions and classes (DataLoader included)."""
    names = [n for n in dir(ft) if not n.startswith("_")] + ["DataLoader"]
    out = {}
    for n in names:
        obj = getattr(ft, n)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            out[n] = obj
    return out


def _device_default(obj):
    params = inspect.signature(obj).parameters
    return params["device"].default if "device" in params else inspect.Parameter.empty


def test_every_device_parameter_follows_the_rule():
    found = {}
    for name, obj in _public().items():
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        default = _device_default(obj)
        if default is not inspect.Parameter.empty:
            found[name] = default
        if inspect.isclass(obj):  # methods of public classes too
            for m, f in inspect.getmembers(obj, inspect.isfunction):
                if not m.startswith("_") and "device" in inspect.signature(f).parameters:
                    found[f"{name}.{m}"] = _device_default(f)
    assert found == {**DESTINATIONS, **HOST_OR_GPU, **INDEXES}, (
        "a ferry.torch name with a `device` parameter is missing from this test's tables or has another "
        "default: place it by the rule in ferry/torch/__init__.py")


def test_the_rule_is_written_where_a_newcomer_reads():
    doc = ft.__doc__
    assert "device=None" in doc and "current CUDA device" in doc and 'device="cpu"' in doc
    for name in (*DESTINATIONS, *HOST_OR_GPU, *INDEXES):
        assert name in doc, f"ferry/torch/__init__.py's rule does not name {name}"


def test_docs_quote_the_real_defaults():
    """A signature quoted in docs/*.md (name(..., device=X, ...) with a `*` or
    a `**`: a signature, not a call) shows the default the code has."""
    checked = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = " ".join(page.read_text().split())
        for name, default in {**DESTINATIONS, **HOST_OR_GPU}.items():
            for m in re.finditer(rf"{name}\(([^()]*)\)", text):
                args = m.group(1)
                d = re.search(r"\bdevice=([^,]+)", args)
                if d is None or not re.search(r"(^|, )\*", args):
                    continue
                checked += 1
                assert d.group(1).strip() == repr(default).replace("'", '"'), (
                    f"{page.name} quotes {name}({args}); the code's default is device={default!r}")
    assert checked >= 1, "no doc quotes load_safetensors' signature any more: update this test"


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "m.safetensors"
    ft.save_safetensors({"w": torch.randn(5, 3, generator=torch.Generator().manual_seed(4))}, str(path))
    return str(path)


def _call(name, device, checkpoint):
    if name == "to_device":
        return ft.to_device(torch.ones(7), device=device)
    return ft.load_safetensors(checkpoint, device=device)


@pytest.mark.parametrize("name", sorted(DESTINATIONS))
@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_destinations_refuse_a_device_that_is_not_cuda(name, device, checkpoint):
    with pytest.raises(ferry.InvalidArgumentError, match=f"{name}: device="):
        _call(name, device, checkpoint)


@pytest.mark.parametrize("name", sorted(DESTINATIONS))
def test_destinations_refuse_what_is_not_a_device(name, checkpoint):
    with pytest.raises(ferry.InvalidArgumentError, match="is not a device; expected None"):
        _call(name, "gpu-please", checkpoint)


def _no_gpu():
    info = ferry.cuda_info()
    if (info and info.get("devices")) or torch.cuda.is_available():
        pytest.skip("a CUDA device is present")


@pytest.mark.parametrize("name", sorted(DESTINATIONS))
@pytest.mark.parametrize("device", [None, "cuda"])
def test_none_without_a_gpu_is_no_device_not_the_cpu(name, device, checkpoint):
    _no_gpu()
    with pytest.raises(ferry.NoDeviceError, match=name):
        _call(name, device, checkpoint)


def test_dataloader_says_the_host_aloud():
    from dataloader_cases import SizedByIndex

    _no_gpu()
    with pytest.raises(ferry.NoDeviceError, match="device='cpu' for CPU batches"):
        ft.DataLoader(SizedByIndex(3), device="cuda")
    with pytest.warns(FutureWarning, match="None means the current CUDA device"):
        ft.DataLoader(SizedByIndex(3), device=None)
    assert next(iter(ft.DataLoader(SizedByIndex(3)))).device.type == "cpu"


@pytest.mark.parametrize("name", sorted(DESTINATIONS))
@pytest.mark.parametrize("device", [None, "cuda"])
def test_none_is_the_current_gpu(gpu, name, device, checkpoint):
    last = torch.cuda.device_count() - 1  # with two GPUs, not the default one
    before = torch.cuda.current_device()
    torch.cuda.set_device(last)
    try:
        out = _call(name, device, checkpoint)
        t = out if name == "to_device" else out["w"]
        assert t.device == torch.device("cuda", last)
    finally:
        torch.cuda.set_device(before)
