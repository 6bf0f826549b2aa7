"""The audit report's model under its offline name (owned by :mod:`rngaudit.audit_report`)."""

from __future__ import annotations

from rngaudit.audit_report import SCHEMA_VERSION as SCHEMA_VERSION
from rngaudit.audit_report import AuditReport as AuditReport
