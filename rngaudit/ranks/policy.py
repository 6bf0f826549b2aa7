"""The raise/warn policy: which findings make an audit raise, which warn, and their words."""

from __future__ import annotations

import warnings

from rngaudit.audit_report import AuditReport
from rngaudit.errors import (
    RNGAuditError,
    RNGAuditTimeoutError,
    RNGAuditWarning,
    RNGDivergenceError,
)
from rngaudit.findings import RANK_MISSING, Finding, severity_rank


def fails(finding: Finding, mode: str, strict: bool = False) -> bool:
    """Whether ``finding`` makes an audit in ``mode`` raise (``strict``: warnings too)."""
    return mode == "raise" and (
        finding.severity == "error" or (strict and finding.severity == "warning")
    )


def warns(finding: Finding, mode: str) -> bool:
    """Whether ``finding`` is worth a warning in ``mode`` (when it does not raise)."""
    return mode in ("raise", "warn") and finding.severity in ("warning", "error")


def act(report: AuditReport, mode: str, strict: bool = False, stacklevel: int = 3) -> None:
    """Raise or warn for a report's findings, as the mode says.

    ``stacklevel`` is the caller whose line a warning names, as in ``warnings.warn``.
    """
    failing = [f for f in report.findings if fails(f, mode, strict)]
    if failing:  # errors first, then the warnings strict mode fails on
        raise _error_for(sorted(failing, key=lambda f: -severity_rank(f.severity)), report)
    for finding in report.findings:
        if warns(finding, mode):
            warnings.warn(_format(finding), RNGAuditWarning, stacklevel=stacklevel)


def _format(finding: Finding) -> str:
    text = f"[{finding.kind}] {finding.message}"
    if finding.remedy:
        text += f"\nFix: {finding.remedy}"
    return text


def _error_for(failing: list[Finding], report: AuditReport) -> RNGAuditError:
    body = "\n\n".join(_format(f) for f in failing)
    message = f"rngaudit found {len(failing)} problem(s):\n\n{body}"
    missing = [r for f in failing if f.kind == RANK_MISSING for r in f.ranks]
    if missing:
        return RNGAuditTimeoutError(message, report, missing)
    return RNGDivergenceError(message, report)
