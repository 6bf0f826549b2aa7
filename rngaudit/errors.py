"""Exceptions and warnings raised by rngaudit: one root, typed children."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rngaudit.audit_report import AuditReport


class RNGAuditError(Exception):
    """Root of every error rngaudit raises.

    ``report`` carries the :class:`~rngaudit.audit_report.AuditReport` when one exists.
    """

    def __init__(self, message: str, report: AuditReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class RNGDivergenceError(RNGAuditError):
    """Ranks drew randomness from diverging state in a way that corrupts training data."""


class RNGAuditTimeoutError(RNGAuditError):
    """Some ranks did not arrive at the fingerprint exchange within the timeout."""

    def __init__(self, message: str, report: AuditReport | None = None, missing: Any = ()) -> None:
        super().__init__(message, report)
        self.missing_ranks: tuple[int, ...] = tuple(missing)


class RNGAuditStoreError(RNGAuditTimeoutError):
    """The process group's store went away during an exchange: its host (rank 0, when no
    launcher hosts it) died or left. ``missing_ranks`` names the host when it is a rank."""


class WorkerDuplicateStreamError(RNGAuditError):
    """DataLoader workers were confirmed to share one random stream."""


class ConfigError(RNGAuditError):
    """A setting (argument or environment variable) has an unusable value."""


class ReportError(RNGAuditError):
    """A report directory or file cannot be used (missing, malformed, mixed runs)."""


class RNGAuditWarning(UserWarning):
    """A finding that does not stop the run (mode ``warn``, or severity ``warning``)."""
