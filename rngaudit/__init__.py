"""rngaudit: find randomness drawn in the wrong place in PyTorch training."""

from __future__ import annotations

from rngaudit.audit import Audit as Audit
from rngaudit.audit import audit as audit
from rngaudit.errors import RNGAuditError as RNGAuditError
from rngaudit.errors import RNGAuditStoreError as RNGAuditStoreError
from rngaudit.errors import RNGAuditTimeoutError as RNGAuditTimeoutError
from rngaudit.errors import RNGAuditWarning as RNGAuditWarning
from rngaudit.errors import RNGDivergenceError as RNGDivergenceError
from rngaudit.errors import WorkerDuplicateStreamError as WorkerDuplicateStreamError
from rngaudit.findings import Finding as Finding
from rngaudit.report import AuditReport as AuditReport
from rngaudit.report_write import flush as wait_for_reports

__version__ = "0.1.0"

__all__ = [
    "Audit",
    "AuditReport",
    "Finding",
    "RNGAuditError",
    "RNGAuditStoreError",
    "RNGAuditTimeoutError",
    "RNGAuditWarning",
    "RNGDivergenceError",
    "WorkerDuplicateStreamError",
    "audit",
    "wait_for_reports",
]
