"""Tests of ferry doctor's findings engine (python/ferry/rules/): the GOOD machine gives no
finding, every rule fires on its BAD variant (tests/python/rules_cases.py) with evidence
and a fix and stays silent on the GOOD one; findings are sorted by severity then id, the
rule table is well formed and the text report shows every finding."""

import re

import pytest

from ferry import rules

from rules_cases import (  # tests/python, on sys.path under pytest
    BAD,
    REQUIRED_IDS,
    bad,
    errors,
    format_findings,
    good_facts,
    good_measurements,
    only,
)


# ------------------------------------------------------------------------------ good


def test_good_machine_has_no_findings():
    findings = rules.evaluate(good_facts(), good_measurements())
    assert [x for x in findings if x.severity in ("critical", "warning")] == []
    assert findings == []


def test_good_machine_without_measurements_has_no_findings():
    assert rules.evaluate(good_facts()) == []


# ------------------------------------------------------------------------------- bad


def test_every_rule_has_a_bad_variant():
    assert {r.id for r in rules.RULES} == set(BAD)
    assert REQUIRED_IDS <= set(BAD)


@pytest.mark.parametrize("rule_id", sorted(BAD))
def test_rule_fires_on_bad_machine(rule_id):
    severity, _ = BAD[rule_id]
    findings = rules.evaluate(*bad(rule_id))
    hit = only(findings, rule_id)
    assert hit.severity == severity
    assert hit.evidence and all(isinstance(e, str) and e for e in hit.evidence)
    assert hit.fix.strip()
    assert hit.title.strip()
    assert errors(findings) == []


@pytest.mark.parametrize("rule_id", sorted(BAD))
def test_rule_silent_on_good_machine(rule_id):
    assert [x for x in rules.evaluate(good_facts(), good_measurements()) if x.id == rule_id] == []


# ---------------------------------------------------------------- order, table, format


def test_sorted_by_severity_then_id():
    def fires(rid, sev):
        return rules.Rule(rid, sev, rid, rid, lambda f, m: rules.Verdict(["e"], "f"))

    table = [fires("b-info", "info"), fires("z-crit", "critical"), fires("a-info", "info"),
             fires("m-warn", "warning"), fires("a-crit", "critical")]
    assert [x.id for x in rules.evaluate({}, {}, rules=table)] == [
        "a-crit", "z-crit", "m-warn", "a-info", "b-info"]


def test_real_rules_sorted_on_a_bad_machine():
    f, m = good_facts(), good_measurements()
    for rule_id in ("thp-disabled", "iommu-translated", "bar1-small", "memlock-low", "pageable-path-slow"):
        BAD[rule_id][1](f, m)
    findings = rules.evaluate(f, m)
    rank = {s: i for i, s in enumerate(rules.SEVERITIES)}
    keys = [(rank[x.severity], x.id) for x in findings]
    assert keys == sorted(keys)
    assert {"thp-disabled", "iommu-translated", "bar1-small", "memlock-low", "pageable-path-slow"} <= {
        x.id for x in findings}


def test_rule_table_is_well_formed():
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids))
    for r in rules.RULES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.id), r.id
        assert r.severity in rules.SEVERITIES
        assert r.title.strip()
        assert r.doc.strip() and "\n" not in r.doc
        assert callable(r.check)


def test_format_findings_contains_every_id():
    findings = []
    for rule_id in sorted(BAD):
        findings += [x for x in rules.evaluate(*bad(rule_id)) if x.id == rule_id]
    text = format_findings(findings)
    for rule_id in BAD:
        assert rule_id in text
    assert "severity" in text and "fix:" in text


def test_format_findings_empty():
    assert "No findings" in format_findings([])


def test_findings_take_id_title_and_default_severity_from_the_rule_table():
    table = {r.id: r for r in rules.RULES}
    for rule_id, (severity, _) in BAD.items():
        hit = only(rules.evaluate(*bad(rule_id)), rule_id)
        assert hit.title == table[rule_id].title
        assert hit.severity == severity


def test_finding_to_dict_has_fixed_keys():
    hit = only(rules.evaluate(*bad("bar1-small")), "bar1-small")
    assert set(hit.to_dict()) == {"id", "severity", "title", "evidence", "fix"}


@pytest.mark.parametrize(
    "text, expected",
    [("0-3", {0, 1, 2, 3}), ("0,2,4-5\n", {0, 2, 4, 5}), ("", set()), ("0-7:2/4", {0, 1, 4, 5})],
)
def test_parse_cpulist(text, expected):
    assert rules.parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1"])
def test_parse_cpulist_rejects_with_value_quoted(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        rules.parse_cpulist(text)
