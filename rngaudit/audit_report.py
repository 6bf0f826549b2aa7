"""The audit report: verdict, findings and per-rank records, as objects and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from rngaudit.findings import Finding, verdict_of
from rngaudit.schema import AuditDict, RankRecord, ReportDict

SCHEMA_VERSION = 1


@dataclass
class AuditReport:
    """What an audit found. ``a.report`` after ``with rngaudit.audit() as a``.

    ``ranks`` holds one record per rank (``rank`` and ``events`` at least), as exchanged.
    """

    findings: list[Finding] = field(default_factory=list)
    ranks: list[RankRecord] = field(default_factory=list)
    world_size: int = 1
    run_id: str = ""
    mode: str = "raise"
    audits: list[AuditDict] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def verdict(self) -> str:
        """``"ok"``, ``"warning"`` or ``"error"``."""
        return verdict_of(self.findings)

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> ReportDict:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "verdict": self.verdict,
            "world_size": self.world_size,
            "mode": self.mode,
            "audits": list(self.audits),
            "findings": [f.to_dict() for f in self.findings],
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_dict(cls, data: ReportDict) -> AuditReport:
        return cls(
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            ranks=list(data.get("ranks", [])),
            world_size=int(data.get("world_size", 1)),
            run_id=str(data.get("run_id", "")),
            mode=str(data.get("mode", "raise")),
            audits=list(data.get("audits", [])),
            schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
        )
