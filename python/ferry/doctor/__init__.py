"""`ferry doctor`: the facts of this machine, what ferry measured on it, and the
findings (ferry.rules) that explain what holds host<->GPU transfers back.

The modules, bottom-up:
  plan.py         the modes (quick, default, full): sizes and time budgets
  model.py        the report model: sections of labelled rows, tables, findings
  steps.py        the measurements, one Step each: when it runs, its keys, its rows
  run.py          one run: facts, the steps within the budget, the rules -> a dict
  report.py       the dict -> sections (findings first, measurements, facts)
  text_report.py  sections -> text;  html_report.py  sections -> one HTML page
The command line (`ferry doctor`, --json, --html) is in ferry/cli.py.

Progress goes to stderr ("ferry doctor: [4/8] pinned bandwidth ...") unless
--json. The report (also the --json object) has fixed keys: the facts at the top
level (facts_version, host, cuda, gpus, notes; see facts/__init__.py), ferry
(versions), mode, measurements (each step's keys, documented with the step in
steps.py; GB/s = 10^9 bytes/s, one direction; per-GPU figures are
{"<gpu index>": value}), skipped ([{what, keys, why}]: each measurement that did
not run, and why), findings ([{id, severity, title, evidence, fix}], ferry.rules),
pool (stats of the pool the doctor used: the pinned pool of the allocation
measurement, else the THP first-touch pool) and elapsed_seconds.
"""

from .plan import PLANS, Plan  # noqa: F401
from .run import run  # noqa: F401
