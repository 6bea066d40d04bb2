"""What a rule is and what it gives: Rule (id, severity, title, doc, check), the
Verdict its check returns, and the Finding the report shows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

SEVERITIES = ("critical", "warning", "info")
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One piece of advice. `evidence` quotes facts and figures with units; `fix` is a
    concrete command or option."""

    id: str
    severity: str
    title: str
    evidence: list[str] = field(default_factory=list, hash=False)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with fixed keys: id, severity, title, evidence, fix."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """What a rule's check found: the evidence (figures with units), the fix, and a
    severity only where the evidence changes the rule's default."""

    evidence: list[str]
    fix: str
    severity: Optional[str] = None


@dataclass(frozen=True)
class Rule:
    """A check. `check(facts, measurements)` returns a Verdict or None (nothing to say,
    or not enough known to say it); the Finding takes id, severity and title from here."""

    id: str
    severity: str  # default severity; a check may raise or lower it with the evidence
    title: str  # what the finding says, the same every time it fires
    doc: str  # one line: what the rule checks
    check: Callable[[dict, dict], Optional[Verdict]]
