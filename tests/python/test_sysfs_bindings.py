"""ferry._ferry.parse_cpulist / parse_thp_setting: src/os/sysfs.h's parsers,
the one grammar both the library and ferry.facts use (issue 43: the doctor had
a Python copy). Random cpulists against the kernel's definition written out
here; garbage and out-of-bound lists refused; the facts parsers go through the
binding (a text only the library refuses is refused by both)."""

import random

import pytest

from ferry import _ferry
from ferry.facts import parsers as p


def expand(items):
    ids = set()
    for lo, hi, used, group in items:
        for base in range(lo, hi + 1, group):
            ids.update(range(base, min(base + used, hi + 1)))
    return sorted(ids)


def spell(item):
    lo, hi, used, group = item
    if lo == hi and used == group == 1:
        return str(lo)
    return f"{lo}-{hi}" if used == group == 1 else f"{lo}-{hi}:{used}/{group}"


@pytest.mark.parametrize("seed", range(30))
def test_random_cpulists_expand_as_the_kernel_defines_them(seed):
    rng = random.Random(seed)
    items = []
    for _ in range(rng.randrange(1, 6)):
        lo = rng.randrange(0, 300)
        hi = lo + rng.randrange(0, 200)
        group = rng.randrange(1, 9)
        used = rng.randrange(1, group + 1)
        items.append((lo, hi, used, group) if rng.random() < 0.5 else (lo, hi, 1, 1))
    text = ",".join(spell(i) for i in items) + rng.choice(["", "\n", " \n"])
    assert _ferry.parse_cpulist(text.encode()) == expand(items)
    assert sorted(p.cpulist_ids(text)) == expand(items)


@pytest.mark.parametrize("text", [b"x", b"0-3,", b",1", b"3-1", b"0-7:3/2", b"0-7:0/2", b"0:1/2", b"0-7/2",
                                  b"-1", b"1 2", b"0-65536", b"0-65535,0-65535,0-65535", b"\xff", b"0\x001"])
def test_bad_cpulists_are_none(text):
    assert _ferry.parse_cpulist(text) is None
    with pytest.raises(ValueError, match="bad cpulist"):
        p.cpulist_ids(text.decode("utf-8", "surrogateescape"))


def test_bounds_and_blank():
    assert _ferry.MAX_CPU_ID == p.MAX_CPU_ID == 65535
    assert _ferry.parse_cpulist(b"") == [] and _ferry.parse_cpulist(b"\n") == []
    assert _ferry.parse_cpulist(b"0-65535") == list(range(65536))
    assert p.cpulist_ids("\n") == set()


@pytest.mark.parametrize("text,expected", [
    (b"always [madvise] never\n", b"madvise"), (b"[always] madvise never", b"always"), (b"never", b"never"),
    (b"", b""), (b"[a] [b]", b""), (b"a b", b""), (b"[always madvise", b""), (b"[]", b""), (b"[a]]", b""),
])
def test_thp_setting(text, expected):
    assert _ferry.parse_thp_setting(text) == expected
    strict = None if not text.split() else expected.decode() or ValueError
    if strict is ValueError:
        with pytest.raises(ValueError, match="THP setting"):
            p.thp_setting(text.decode())
    else:
        assert p.thp_setting(text.decode()) == strict


def test_any_python_text_reaches_the_library():
    # Lone surrogates and non-ASCII white space: Python splits, the library parses the words.
    assert p.thp_setting("always\u2003[\ud800x]") == "\ud800x"
    assert p.cpulist_ids("\u20030-2,\u20035 ") == {0, 1, 2, 5}
    assert p.parse_cpulist("\ud800") is None
