"""Property tests (hypothesis) of the Python parsers: ferry.facts.parsers (what
`ferry doctor` reads from procfs, sysfs and DMI) and the parsing parts of
ferry.rules. Every parser takes any text without raising (the strict forms raise
ValueError only) and in bounded time; cpulists and THP settings obey the kernel's
formats and round-trip. Before: parse_cpulist('0-20000000') took 2.5 s and 1.3 GiB,
random input gave 17 MemoryErrors, and rules.py and facts/parsers.py each had their
own cpulist and THP parser, with different rules."""

import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ferry import rules  # noqa: E402
from ferry.facts import parsers as p  # noqa: E402
from ferry.rules.inputs import _sysfs_choice  # noqa: E402

# Generous deadline: the machine is shared; a parser that expands without a bound
# takes seconds and gigabytes, far beyond it.
PROPERTY = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

# Text that looks like what these parsers read, and anything at all.
sysfs_alphabet = st.sampled_from(list("0123456789-,:/[] \n\tabcdefkBx.") + ["\x00", "ü", "٣"])
sysfs_text = st.text(alphabet=sysfs_alphabet, max_size=200)
any_text = st.one_of(sysfs_text, st.text(max_size=300))

TEXT_PARSERS = [
    p.parse_int, p.parse_thp_setting, p.parse_meminfo, p.parse_cpuinfo_model, p.parse_cpuinfo_flags,
    p.parse_cpulist, p.compact_cpulist, p.hugepages_dir_size, p.parse_proc_status, p.status_cpus_allowed,
    p.status_mems_allowed, p.pcie_speed_to_gen, p.pcie_link_width, p.parse_pci_resource,
    p.normalize_pci_bus_id, p.parse_numa_node, p.parse_limits, p.memlock_from_limits, p.parse_os_release,
    p.os_pretty_name, p.parse_cmdline, p.iommu_cmdline_options, p.iommu_mode_from_cmdline,
]


@pytest.mark.parametrize("parser", TEXT_PARSERS, ids=lambda f: f.__name__)
@PROPERTY
@given(text=any_text)
def test_text_parsers_never_raise(parser, text):
    parser(text)


@PROPERTY
@given(header=st.binary(max_size=64), cgroup=any_text, docker=st.booleans(), podman=st.booleans())
def test_byte_and_evidence_parsers_never_raise(header, cgroup, docker, podman):
    oem = p.acpi_oem_id(header)
    assert oem is None or (isinstance(oem, str) and oem)
    strong, evidence = p.container_evidence(cgroup, docker, podman)
    assert isinstance(strong, bool) and all(isinstance(e, str) for e in evidence)
    p.gvisor_evidence(cgroup, cgroup, cgroup)
    p.iommu_mode_from_group_types(cgroup.split())


huge_numbers = st.integers(min_value=0, max_value=10**60).map(str)


@PROPERTY
@given(digits=huge_numbers, unit=st.sampled_from([" kB", ""]))
def test_long_numbers_are_garbage_not_errors(digits, unit):
    fields = p.parse_meminfo(f"MemTotal: {digits}{unit}\n")
    assert fields == {} or fields["MemTotal"] == int(digits) * (1024 if unit else 1)
    size = p.hugepages_dir_size(f"hugepages-{digits}kB")
    assert size is None or size == int(digits) * 1024
    assert p.parse_int(digits) in (None, int(digits))


# --- cpulists --------------------------------------------------------------------

cpu_ids = st.sets(st.integers(min_value=0, max_value=p.MAX_CPU_ID), max_size=300)


@PROPERTY
@given(ids=cpu_ids)
def test_cpulist_round_trips(ids):
    text = p.format_cpulist(ids)
    assert p.parse_cpulist(text) == sorted(ids)
    assert p.cpulist_ids(text) == ids
    assert rules.parse_cpulist(text + "\n") == ids  # rules uses the same parser


@PROPERTY
@given(lo=st.integers(0, 300), span=st.integers(0, 300), used=st.integers(1, 9), extra=st.integers(0, 9))
def test_cpulist_strides_match_the_kernels_definition(lo, span, used, extra):
    group = used + extra
    hi = lo + span
    expected = {i for i in range(lo, hi + 1) if (i - lo) % group < used}
    assert p.cpulist_ids(f"{lo}-{hi}:{used}/{group}") == expected


@PROPERTY
@given(text=sysfs_text)
def test_cpulist_parsers_agree_and_stay_bounded(text):
    start = time.monotonic()
    lenient = p.parse_cpulist(text)
    try:
        strict = p.cpulist_ids(text)
    except ValueError as e:
        assert lenient is None
        assert repr(text) in str(e)
    else:
        assert lenient == sorted(strict)
        assert all(0 <= i <= p.MAX_CPU_ID for i in strict)
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("text", ["0-20000000", "0-65536", "0-65535," * 3, "4294967295", "0-9999999999:1/2"])
def test_huge_cpulists_are_refused_at_once(text):
    start = time.monotonic()
    assert p.parse_cpulist(text) is None
    with pytest.raises(ValueError, match="cpulist"):
        rules.parse_cpulist(text)
    assert time.monotonic() - start < 0.5


def test_largest_cpulist_is_accepted():
    assert len(p.cpulist_ids(f"0-{p.MAX_CPU_ID}")) == p.MAX_CPU_ID + 1


# --- THP settings ------------------------------------------------------------------

thp_word = st.text(alphabet=st.sampled_from(list("abcdefghijklmnopqrstuvwxyz_+")), min_size=1, max_size=12)


@PROPERTY
@given(words=st.lists(thp_word, min_size=1, max_size=6, unique=True), data=st.data())
def test_thp_setting_reads_the_selected_word(words, data):
    chosen = data.draw(st.integers(0, len(words) - 1))
    text = " ".join(f"[{w}]" if i == chosen else w for i, w in enumerate(words)) + "\n"
    assert p.parse_thp_setting(text) == words[chosen]
    assert _sysfs_choice(text, "host.thp.enabled") == words[chosen]  # one parser for both


@PROPERTY
@given(text=sysfs_text)
def test_thp_setting_is_a_word_of_the_text_or_none(text):
    value = p.parse_thp_setting(text)
    if value is not None:
        assert value in text and not any(c in value for c in " \t\n[]")
    try:
        strict = p.thp_setting(text)
    except ValueError:
        assert value is None
    else:
        assert strict == value


# --- rules: facts of any shape never break the report ------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                      sysfs_text)
json_value = st.recursive(json_leaf, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.sampled_from(
        ["host", "gpus", "thp", "enabled", "defrag", "shmem_enabled", "process", "cpus_allowed",
         "mems_allowed", "cpu_affinity", "numa_node", "index", "virtualization", "kind", "hugetlb",
         "memlock_bytes", "iommu", "pcie", "memory"]), children, max_size=5)), max_leaves=20)


@PROPERTY
@given(facts=st.dictionaries(st.sampled_from(["host", "gpus", "cuda"]), json_value, max_size=3),
       measurements=st.dictionaries(st.sampled_from(["pinned_h2d_gbps", "first_touch_1thread_gbps"]),
                                    json_value, max_size=2))
def test_rules_evaluate_any_facts_without_raising(facts, measurements):
    findings = rules.evaluate(facts, measurements)
    for f in findings:
        assert f.severity in rules.SEVERITIES and f.id
