"""ferry.torch.containers: the one walk that ferry.torch.DataLoader (any Mapping
and Sequence, as PyTorch's pin_memory) and to_device/to_host (dict, list and
tuple only) share. Random structures; every rebuilt container checked for its
type, its attributes, its keys' order and each leaf's place."""

import collections
import random
import types

import pytest

from ferry.torch.containers import leaves_of, map_leaves

Pair = collections.namedtuple("Pair", "a b")


class Leaf:
    def __init__(self, n):
        self.n = n


class Tagged(dict):
    pass


class Frozen(collections.abc.Mapping):  # immutable, no constructor from a dict: rebuilt as a dict
    def __init__(self, *, items):
        self._d = dict(items)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def random_tree(rng, depth=0):
    if depth > 3 or rng.random() < 0.3:
        return rng.choice([Leaf(rng.random()), "text", b"bytes", 7, None])
    kind = rng.randrange(5)
    items = [random_tree(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 0:
        d = Tagged((f"k{rng.randrange(1000)}_{i}", v) for i, v in enumerate(items))
        d._metadata = {"v": 1}
        return d
    if kind == 1:
        return collections.OrderedDict((str(i), v) for i, v in reversed(list(enumerate(items))))
    if kind == 2:
        return Pair(items[0] if items else 1, items[1:] if len(items) > 1 else 2)
    if kind == 3:
        return tuple(items)
    return list(items)


def same_shape(a, b, moved):
    """b is a rebuilt with each Leaf x replaced by ('moved', x.n)."""
    if isinstance(a, Leaf):
        assert b == ("moved", a.n)
        moved.append(a.n)
        return
    assert type(b) is type(a)
    if isinstance(a, dict):
        assert list(a) == list(b) and b is not a
        assert getattr(b, "_metadata", None) == getattr(a, "_metadata", None)
        for k in a:
            same_shape(a[k], b[k], moved)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b) and (not isinstance(a, list) or b is not a)
        for x, y in zip(a, b):
            same_shape(x, y, moved)
    else:
        assert b is a


@pytest.mark.parametrize("any_container", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_random_structures_rebuilt_leaf_for_leaf(seed, any_container):
    rng = random.Random(seed)
    tree = [random_tree(rng) for _ in range(3)]
    order = []
    out = map_leaves(tree, lambda x: (order.append(x.n), ("moved", x.n))[1], lambda x: isinstance(x, Leaf),
                     any_container)
    moved = []
    same_shape(tree, out, moved)
    assert moved == order  # fn called in depth-first order
    assert [x.n for x in leaves_of(tree, lambda x: isinstance(x, Leaf), any_container)] == order


def test_which_types_are_containers_is_the_callers():
    is_leaf = lambda x: isinstance(x, Leaf)  # noqa: E731
    mv = lambda x: "moved"  # noqa: E731
    frozen = Frozen(items=[("a", Leaf(1))])
    view = types.MappingProxyType({"a": Leaf(2)})
    r = range(3)
    # The DataLoader's walk: any Mapping (rebuilt as a dict when its type cannot be), any Sequence.
    assert map_leaves(frozen, mv, is_leaf) == {"a": "moved"}
    assert map_leaves(view, mv, is_leaf) == {"a": "moved"}
    assert map_leaves(r, mv, is_leaf) == [0, 1, 2]
    assert leaves_of(frozen, is_leaf)[0] is frozen["a"]
    # to_device's: dict, list and tuple only; anything else passes as it is.
    for other in (frozen, view, r):
        assert map_leaves(other, mv, is_leaf, any_container=False) is other
        assert leaves_of(other, is_leaf, any_container=False) == []
    d = collections.defaultdict(list, a=Leaf(3))
    out = map_leaves(d, mv, is_leaf, any_container=False)
    assert type(out) is collections.defaultdict and out.default_factory is list and out["a"] == "moved"


def test_an_error_of_fn_is_raised_once_not_retried_as_a_plain_container():
    calls = []

    def fn(x):
        calls.append(x)
        raise TypeError("from fn")

    with pytest.raises(TypeError, match="from fn"):
        map_leaves(Tagged(a=Leaf(1)), fn, lambda x: isinstance(x, Leaf))
    assert len(calls) == 1
