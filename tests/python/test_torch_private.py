"""ferry/torch/_torch_private.py, the one file that names PyTorch's private
internals, against the installed PyTorch: each function does what it says, the
iterator methods ferry overrides exist, and PyTorch's multi-process iterator
sets nothing in __init__ that ferry's rewrite of it misses. scripts/test runs
this on the newest supported PyTorch and on the oldest (2.6)."""

import ast
import inspect
import textwrap

import pytest

torch = pytest.importorskip("torch")

import ferry.torch.data.loader as loader  # noqa: E402
from ferry.torch import _torch_private as pt  # noqa: E402
from torch.utils.data import dataloader as torch_dataloader  # noqa: E402


def test_tensor_internals():
    x = torch.randn(5, 7, dtype=torch.float64)
    view = x[1:, 2:]
    assert pt.view_base(view) is x and pt.view_base(x) is None
    before = pt.version_counter(x)
    x.add_(1)
    assert pt.version_counter(x) == before + 1
    z = torch.randn(3, 5, dtype=torch.complex64)
    neg = pt.neg_view(z)
    assert neg.is_neg() and neg.data_ptr() == z.data_ptr()
    assert torch.equal(neg.resolve_neg(), -z)


def test_dlpack_capsule_converter_makes_tensors_of_capsules():
    x = torch.arange(11, dtype=torch.int32)
    y = pt.dlpack_capsule_converter()(torch.utils.dlpack.to_dlpack(x))
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)


def test_cuda_state_calls():
    assert pt.in_bad_fork() is False  # this process was not forked after CUDA started
    assert pt.empty_host_cache() in (True, False)


def test_current_raw_stream_getter_is_the_current_stream():
    get = pt.current_raw_stream_getter()
    assert callable(get)
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the stream handles cannot be compared")
    for device in range(torch.cuda.device_count()):
        assert get(device) == torch.cuda.current_stream(device).cuda_stream
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            assert get(device) == side.cuda_stream != 0


def test_the_iterator_methods_ferry_overrides_exist_in_pytorch():
    single, multi = pt.iterator_classes()
    assert issubclass(loader._FerryMultiProcessIter, multi) and issubclass(loader._FerrySingleProcessIter, single)
    for name in pt.ITERATOR_METHODS:
        assert callable(getattr(multi, name, None)), f"PyTorch {torch.__version__}: no {multi.__name__}.{name}"
    for ours, theirs in ((loader._FerryMultiProcessIter, multi), (loader._FerrySingleProcessIter, single)):
        overridden = {n for n in vars(ours) if n.startswith("_") and not n.startswith("__") and hasattr(theirs, n)}
        assert overridden <= set(pt.ITERATOR_METHODS), f"{ours.__name__} overrides PyTorch's {overridden}"


def _attributes_set(source: str) -> set[str]:
    """The self.X that a function's source assigns."""
    out = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for e in ast.walk(target):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


def test_ferrys_iterator_init_sets_what_pytorchs_sets():
    """ferry's _FerryMultiProcessIter.__init__ is PyTorch's with ferry's workers:
    an attribute that a PyTorch release adds there (and reads later) must be set
    by ferry's too, else the iterator breaks on that release."""
    _, multi = pt.iterator_classes()
    theirs = _attributes_set(inspect.getsource(multi.__init__))
    base = _attributes_set(inspect.getsource(torch_dataloader._BaseDataLoaderIter.__init__))
    ours = _attributes_set(inspect.getsource(loader._FerryMultiProcessIter.__init__))
    assert {"_worker_result_queue", "_index_queues", "_workers"} <= theirs & ours  # the parse finds them
    missing = theirs - ours - base - set(pt.PIN_THREAD_ATTRIBUTES)
    assert not missing, f"PyTorch {torch.__version__}'s iterator __init__ sets {sorted(missing)}; ferry's does not"


def test_collation_is_pytorchs():
    batch = [{"x": torch.randn(3), "n": i, "s": f"s{i}", "t": (torch.tensor([i]), 2.5)} for i in range(5)]
    ours = pt.collate(batch, pt.default_collate_fn_map())
    theirs = torch.utils.data.default_collate(batch)
    assert torch.equal(ours["x"], theirs["x"]) and torch.equal(ours["n"], theirs["n"])
    assert ours["s"] == theirs["s"] and torch.equal(ours["t"][0], theirs["t"][0])
    stacked = pt.collate_tensors([torch.ones(2, 3), torch.zeros(2, 3)])
    assert stacked.shape == (2, 2, 3) and stacked.sum().item() == 6
    table = pt.default_collate_fn_map()
    table[str] = None
    assert pt.default_collate_fn_map()[str] is not None  # a copy: PyTorch's table is unchanged


def test_worker_pieces():
    assert pt.status_check_interval() > 0
    end = pt.replica_end(3)
    assert pt.is_replica_end(end) and end.worker_id == 3 and not pt.is_replica_end(3)
    assert not pt.is_resume(0)
    assert pt.numpy_seed(1234, 2) == pt.numpy_seed(1234, 2) != pt.numpy_seed(1234, 3)
    assert pt.manager_watchdog().is_alive()
    try:
        raise KeyError("the sample 17")
    except KeyError:
        wrapped = pt.exception_wrapper("in DataLoader worker process 4")
    with pytest.raises(KeyError, match="worker process 4"):
        wrapped.reraise()
    kind = iter(torch.utils.data.DataLoader(list(range(10)), batch_size=4))._dataset_kind  # a list: map-style
    assert not pt.is_iterable_kind(kind)
    fetcher = pt.create_fetcher(kind, list(range(10)), True, lambda x: x, False)
    assert fetcher.fetch([7, 2, 9]) == [7, 2, 9]
