"""The doctor's torch-pinned-register-fork finding and what it reads: PyTorch's
allocator settings parsed as PyTorch 2.11 parses them (facts/parsers/torch_alloc.py),
checked against PyTorch itself where it is installed; the fact collected from a real
environment in a fresh process; the rule firing and staying silent."""

import json
import os
import subprocess
import sys

import pytest

from ferry import facts, rules
from ferry.facts import parsers as p
from ferry.facts.torch_alloc import collect_torch_alloc_conf

from rules_cases import bad, errors, format_findings, good_facts, good_measurements, only  # tests/python

RULE = "torch-pinned-register-fork"

# (settings, PyTorch pins by registration: True/False, or None where PyTorch raises)
CASES = [
    ("", False),
    ("pinned_use_cuda_host_register:True", True),
    ("pinned_use_cuda_host_register:False", False),
    ("pinned_use_cuda_host_register:True,pinned_num_register_threads:8", True),
    ("pinned_num_register_threads:8,pinned_use_cuda_host_register:True", True),
    ("pinned_use_hip_host_register:True", True),  # the ROCm spelling is accepted on CUDA builds too
    (" pinned_use_cuda_host_register : Tr ue ", True),  # whitespace is dropped, also inside a word
    ("pinned_use_cuda_host_register,True", True),  # PyTorch does not check the separator
    ("pinned_use_cuda_host_register:True,pinned_use_cuda_host_register:False", False),  # the last one wins
    ("pinned_use_cuda_host_register:False,pinned_use_cuda_host_register:True", True),
    ("expandable_segments:True,roundup_power2_divisions:[256:1,>:2],pinned_use_cuda_host_register:True", True),
    ("expandable_segments:True", False),
    ("pinned_use_cuda_host_register:true", None),  # case matters
    ("pinned_use_cuda_host_register:1", None),
    ("pinned_use_cuda_host_register:TRUE", None),
    ("pinned_use_cuda_host_register:", None),
    ("pinned_use_cuda_host_register", None),
    ("expandable_segments:True,pinned_use_cuda_host_register:yes", None),
    ("roundup_power2_divisions:[256:1,>:2", None),  # a list without ']'
]


def parsed(text):
    try:
        return p.pinned_use_host_register(text)
    except ValueError:
        return None


@pytest.mark.parametrize("text, expected", CASES)
def test_settings_parsed_as_pytorch_parses_them(text, expected):
    assert parsed(text) is expected


def test_a_refused_setting_is_quoted():
    with pytest.raises(ValueError, match=r"'pinned_use_cuda_host_register:true'.*not 'true'"):
        p.pinned_use_host_register("pinned_use_cuda_host_register:true")


def test_tokens_are_pytorchs():
    assert p.alloc_conf_tokens("a:1, b : [x ,y]") == ["a", ":", "1", ",", "b", ":", "[", "x", ",", "y", "]"]
    assert p.alloc_conf_tokens(" \t\n") == []


@pytest.mark.parametrize("text, rest", [
    ("pinned_use_cuda_host_register:True", ""),
    ("pinned_use_cuda_host_register:True,pinned_num_register_threads:8", ""),
    ("expandable_segments:True, pinned_use_cuda_host_register:True,roundup_power2_divisions:[256:1,>:2]",
     "expandable_segments:True,roundup_power2_divisions:[256:1,>:2]"),
])
def test_the_fix_keeps_the_other_settings(text, rest):
    assert p.alloc_conf_without(text) == rest
    assert parsed(rest) is False


_PYTORCH_VERDICTS = """
import json, sys, warnings
import torch
warnings.simplefilter("ignore")
out = []
for text in json.loads(sys.argv[1]):
    try:
        torch._C._accelerator_setAllocatorSettings(text)
        out.append(True)
    except Exception:  # ValueError, or RuntimeError for an index out of bounds
        out.append(False)
print(json.dumps(out))
"""


def _pytorch(code, *args, env=None):
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pytorch_accepts_and_refuses_the_same_settings():
    """PyTorch itself (a fresh process: the settings are process-wide) accepts every
    case this parser accepts and refuses every case it refuses."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_accelerator_setAllocatorSettings"):
        pytest.skip(f"torch {torch.__version__} has no _accelerator_setAllocatorSettings")
    texts = [text for text, _ in CASES]
    accepted = _pytorch(_PYTORCH_VERDICTS, json.dumps(texts))
    assert {t: a for t, a in zip(texts, accepted)} == {t: e is not None for t, e in CASES}


def test_pytorch_reads_the_cuda_variable_first():
    """Where both variables are set, PyTorch's CUDA allocator reads
    PYTORCH_CUDA_ALLOC_CONF only (a setting PyTorch refuses shows which it read)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_accelerator_setAllocatorSettings"):
        pytest.skip(f"torch {torch.__version__} has no _accelerator_setAllocatorSettings")
    code = _PYTORCH_VERDICTS.replace("json.loads(sys.argv[1])", '[""]')  # the first use reads the environment
    bad_value = "pinned_use_cuda_host_register:true"
    env = {k: v for k, v in os.environ.items() if k not in p.ALLOC_CONF_VARIABLES}
    assert _pytorch(code, env=dict(env, PYTORCH_CUDA_ALLOC_CONF="", PYTORCH_ALLOC_CONF=bad_value)) == [True]
    assert _pytorch(code, env=dict(env, PYTORCH_ALLOC_CONF=bad_value)) == [False]
    assert _pytorch(code, env=dict(env, PYTORCH_CUDA_ALLOC_CONF=bad_value, PYTORCH_ALLOC_CONF="")) == [False]
    for environ in ({"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": bad_value},
                    {"PYTORCH_ALLOC_CONF": bad_value}):
        got = collect_torch_alloc_conf(environ)
        assert (got["error"] is None) == ("PYTORCH_CUDA_ALLOC_CONF" in environ)


# ---- the fact ---------------------------------------------------------------------------


def test_the_fact_names_the_variable_read_and_the_one_shadowed():
    both = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:True", "HOME": "/root"}
    assert collect_torch_alloc_conf(both) == {
        "variable": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True",
        "shadowed": ["PYTORCH_ALLOC_CONF"], "pinned_use_host_register": False, "error": None}
    assert collect_torch_alloc_conf({"PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:True"}) == {
        "variable": "PYTORCH_ALLOC_CONF", "value": "pinned_use_cuda_host_register:True", "shadowed": [],
        "pinned_use_host_register": True, "error": None}
    assert collect_torch_alloc_conf({}) == {"variable": None, "value": None, "shadowed": [],
                                            "pinned_use_host_register": False, "error": None}
    refused = collect_torch_alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:1"})
    assert refused["pinned_use_host_register"] is None and "'1'" in refused["error"]


@pytest.mark.parametrize("environ, expected", [
    ({"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"}, True),
    ({"PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:true"}, None),
    ({}, False),
])
def test_the_doctor_collects_it_from_the_real_environment(environ, expected):
    env = {k: v for k, v in os.environ.items() if k not in p.ALLOC_CONF_VARIABLES}
    code = "import json\nfrom ferry import facts\nprint(json.dumps(facts.collect(None)['host']['torch_alloc_conf']))"
    got = _pytorch(code, env=dict(env, **environ))
    assert got["pinned_use_host_register"] is expected
    assert got["variable"] == (next(iter(environ)) if environ else None)
    assert facts.collect(None)["host"]["torch_alloc_conf"] == collect_torch_alloc_conf(os.environ)


# ---- the rule -----------------------------------------------------------------------------


def _with_conf(environ):
    f = good_facts()
    f["host"]["torch_alloc_conf"] = collect_torch_alloc_conf(environ)
    return f


def test_fires_with_the_figures_and_a_fix_that_keeps_the_other_settings():
    text = "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    hit = only(rules.evaluate(_with_conf({"PYTORCH_CUDA_ALLOC_CONF": text}), good_measurements()), RULE)
    assert hit.severity == "warning"
    joined = " ".join(hit.evidence)
    assert f"PYTORCH_CUDA_ALLOC_CONF={text!r}" in joined
    assert "614 ms" in joined and "2049 MiB" in joined and "13 ms and 1 MiB" in joined
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`" in hit.fix
    assert "persistent_workers=True" in hit.fix and "ferry.torch.empty_pinned" in hit.fix
    assert RULE in format_findings([hit])


def test_fix_unsets_a_variable_left_empty_and_names_a_shadowed_one():
    environ = {"PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:True", "PYTORCH_CUDA_ALLOC_CONF": ""}
    assert [x for x in rules.evaluate(_with_conf(environ), good_measurements()) if x.id == RULE] == []
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True",
               "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    hit = only(rules.evaluate(_with_conf(environ), good_measurements()), RULE)
    assert "`unset PYTORCH_CUDA_ALLOC_CONF`" in hit.fix
    assert any("PYTORCH_ALLOC_CONF is set too" in e for e in hit.evidence)


@pytest.mark.parametrize("environ", [
    {},
    {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:False"},
    {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:true"},  # PyTorch refuses it: not registration
    {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_CUDA_ALLOC_CONF": "xpinned_use_cuda_host_register:True"},
])
def test_silent_where_pytorch_does_not_pin_by_registration(environ):
    findings = rules.evaluate(_with_conf(environ), good_measurements())
    assert findings == []


def test_silent_without_a_gpu_or_the_fact():
    f, m = bad(RULE)
    f["gpus"], f["cuda"] = [], None
    assert [x for x in rules.evaluate(f, m) if x.id == RULE] == []
    f, m = bad(RULE)
    del f["host"]["torch_alloc_conf"]
    assert [x for x in rules.evaluate(f, m) if x.id == RULE] == []


def test_malformed_fact_is_reported_not_raised():
    f = good_facts()
    f["host"]["torch_alloc_conf"] = {"pinned_use_host_register": "yes"}
    findings = rules.evaluate(f, good_measurements())
    assert [x.id for x in errors(findings)] == [RULE]
