"""ferry doctor's findings engine (python/ferry/rules/) on what it does not know: a missing
or None fact or measurement is silent, and malformed input, non-dict input and a rule that
raises or returns garbage become "could not be evaluated" info findings, never an
exception."""

import pytest

from ferry import rules

from rules_cases import (  # tests/python, on sys.path under pytest
    errors,
    format_findings,
    good_facts,
    good_measurements,
)


def test_empty_inputs_do_not_raise():
    assert rules.evaluate({}) == []
    assert rules.evaluate({}, {}) == []
    assert rules.evaluate(None, None) == []


def _leaf_paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _leaf_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaf_paths(v, prefix + (i,))


def _get_parent(root, path):
    for key in path[:-1]:
        root = root[key]
    return root


@pytest.mark.parametrize("path", [p for p in _leaf_paths(good_facts()) if p != ("cuda",)], ids=str)
def test_missing_or_none_fact_is_silent(path):
    for how in ("none", "delete"):
        f = good_facts()
        parent = _get_parent(f, path)
        if how == "none":
            parent[path[-1]] = None
        else:
            del parent[path[-1]]
        findings = rules.evaluate(f, good_measurements())
        assert errors(findings) == [], (how, path, findings)
        assert [x for x in findings if x.severity != "info"] == [], (how, path, findings)


@pytest.mark.parametrize("key", sorted(good_measurements()))
def test_missing_measurement_is_silent(key):
    m = good_measurements()
    del m[key]
    assert rules.evaluate(good_facts(), m) == []


def test_raising_rule_becomes_info_finding():
    def boom(facts, measurements):
        raise RuntimeError("kaboom")

    ok = rules.Rule("zz-ok", "warning", "ok", "always fires",
                    lambda f, m: rules.Verdict(["x"], "y"))
    bad_rule = rules.Rule("aa-boom", "critical", "boom", "raises", boom)
    findings = rules.evaluate({}, {}, rules=[bad_rule, ok])
    assert [x.id for x in findings] == ["zz-ok", "aa-boom"]
    err = findings[1]
    assert err.severity == "info"
    assert err.title == "rule aa-boom could not be evaluated: RuntimeError: kaboom"
    assert err.fix


def test_rule_returning_garbage_becomes_info_finding():
    rule = rules.Rule("garbage", "warning", "g", "returns a string", lambda f, m: "oops")
    weird = rules.Rule("weird", "warning", "w", "bad severity",
                       lambda f, m: rules.Verdict(["e"], "f", severity="fatal"))
    findings = rules.evaluate({}, {}, rules=[rule, weird])
    assert [(x.id, x.severity) for x in findings] == [("garbage", "info"), ("weird", "info")]
    assert all("could not be evaluated" in x.title for x in findings)


@pytest.mark.parametrize(
    "facts, measurements, rule_id",
    [
        ({"gpus": "not a list"}, {}, "bar1-small"),
        ({"host": {"thp": {"enabled": 7}}}, {}, "thp-disabled"),
        ({"host": {"process": {"mems_allowed": "zero"}}, "gpus": [{"numa_node": 0}]}, {}, "numa-mismatch"),
        (good_facts(), {"pinned_h2d_gbps": {"0": "55"}}, "pinned-bandwidth-low"),
        (good_facts(), {"pinned_h2d_gbps": 55.0}, "pinned-bandwidth-low"),
        ({"host": {"memlock_bytes": True}}, {}, "memlock-low"),
        ({"host": {"copy_engine": {"crew_threads": 2, "profile": {"named": False, "present": "no"}}}}, {},
         "small-crew-uncalibrated"),
    ],
)
def test_malformed_input_is_reported_not_raised(facts, measurements, rule_id):
    findings = rules.evaluate(facts, measurements)
    hit = [x for x in findings if x.id == rule_id and "could not be evaluated" in x.title]
    assert hit and hit[0].severity == "info"
    assert format_findings(findings)


def test_non_dict_inputs_are_reported():
    findings = rules.evaluate(["not", "a", "dict"], {})
    assert len(findings) == len(rules.RULES)
    assert all(x.severity == "info" and "could not be evaluated" in x.title for x in findings)
