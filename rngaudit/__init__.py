"""rngaudit: find randomness drawn in the wrong place in PyTorch training."""

from __future__ import annotations

from rngaudit.errors import RNGAuditError as RNGAuditError
from rngaudit.errors import RNGAuditStoreError as RNGAuditStoreError
from rngaudit.errors import RNGAuditTimeoutError as RNGAuditTimeoutError
from rngaudit.errors import RNGAuditWarning as RNGAuditWarning
from rngaudit.errors import RNGDivergenceError as RNGDivergenceError
from rngaudit.errors import WorkerDuplicateStreamError as WorkerDuplicateStreamError
from rngaudit.findings import Finding as Finding
from rngaudit.reports.files import flush as wait_for_reports
from rngaudit.reports.model import AuditReport as AuditReport
from rngaudit.with_block import Audit as Audit
from rngaudit.with_block import audit as audit

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
