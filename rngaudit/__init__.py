"""rngaudit: find randomness drawn in the wrong place in PyTorch training."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rngaudit.errors import RNGAuditError as RNGAuditError
from rngaudit.errors import RNGAuditStoreError as RNGAuditStoreError
from rngaudit.errors import RNGAuditTimeoutError as RNGAuditTimeoutError
from rngaudit.errors import RNGAuditWarning as RNGAuditWarning
from rngaudit.errors import RNGDivergenceError as RNGDivergenceError
from rngaudit.errors import WorkerDuplicateStreamError as WorkerDuplicateStreamError

if TYPE_CHECKING:
    from rngaudit.audit_report import AuditReport as AuditReport
    from rngaudit.epochs.keyed import sample_key as sample_key
    from rngaudit.findings import Finding as Finding
    from rngaudit.report_files import flush as wait_for_reports
    from rngaudit.with_block import Audit as Audit
    from rngaudit.with_block import audit as audit

__version__ = "0.1.0"

# The public names that need the engine are imported on first use, so that `import rngaudit`
# (and the CLI, which reads only reports) loads no instrumentation.
_LAZY = {
    "Audit": ("rngaudit.with_block", "Audit"),
    "audit": ("rngaudit.with_block", "audit"),
    "AuditReport": ("rngaudit.audit_report", "AuditReport"),
    "Finding": ("rngaudit.findings", "Finding"),
    "sample_key": ("rngaudit.epochs.keyed", "sample_key"),
    "wait_for_reports": ("rngaudit.report_files", "flush"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rngaudit' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "sample_key",
    "wait_for_reports",
]
