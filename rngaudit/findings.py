"""Findings: what the comparison concluded, with severity, ranks and remedy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rngaudit.schema import CallSiteDict, FindingDict
from rngaudit.wording import format_ranks

SEVERITIES = ("info", "warning", "error")  # the one severity order, mildest first

# Finding kinds are part of the public contract (report files and docs name them).
SAMPLER_DRAW_DIVERGENCE = "sampler-draw-divergence"
CONSUMPTION_MISMATCH = "consumption-mismatch"
STATE_DIVERGENCE = "state-divergence"
RANK_MISSING = "rank-missing"
WORKER_DUPLICATE_STREAM = "worker-duplicate-stream"
PERSISTENT_WORKER_STREAM = "persistent-worker-stream"
DATASET_DIVERGENCE = "dataset-divergence"
DATASET_CONTENT_DIVERGENCE = "dataset-content-divergence"
PARTITION_OVERLAP = "partition-overlap"
PEER_BATCH_DIVERGENCE = "peer-batch-divergence"  # peers of one replica: different batches
REPLICA_WEIGHT_DIVERGENCE = "replica-weight-divergence"  # replicas: different weights
REPLICA_STREAMS_IDENTICAL = "replica-streams-identical"  # replicas: one dropout stream (info)
EPOCH_ORDER_REPEATED = "epoch-order-repeated"
AUDIT_MISMATCH = "audit-mismatch"
MODE_MISMATCH = "mode-mismatch"
RANK_RAISED = "rank-raised"
RANK_INTERRUPTED = "rank-interrupted"
EVENTS_AGGREGATED = "events-aggregated"

KINDS = (
    SAMPLER_DRAW_DIVERGENCE,
    CONSUMPTION_MISMATCH,
    STATE_DIVERGENCE,
    RANK_MISSING,
    WORKER_DUPLICATE_STREAM,
    PERSISTENT_WORKER_STREAM,
    DATASET_DIVERGENCE,
    DATASET_CONTENT_DIVERGENCE,
    PARTITION_OVERLAP,
    PEER_BATCH_DIVERGENCE,
    REPLICA_WEIGHT_DIVERGENCE,
    REPLICA_STREAMS_IDENTICAL,
    EPOCH_ORDER_REPEATED,
    AUDIT_MISMATCH,
    MODE_MISMATCH,
    RANK_RAISED,
    RANK_INTERRUPTED,
    EVENTS_AGGREGATED,
)


@dataclass
class Finding:
    """One conclusion of an audit; serialises to the report's ``findings`` entries."""

    kind: str
    severity: str
    message: str
    ranks: list[int]
    generator: str | None = None
    call_site: CallSiteDict | None = None
    user_call_site: CallSiteDict | None = None
    remedy: str | None = None
    audit: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> FindingDict:
        out: FindingDict = {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "ranks": list(self.ranks),
            "audit": self.audit,
        }
        if self.generator is not None:
            out["generator"] = self.generator
        if self.call_site is not None:
            out["call_site"] = self.call_site
        if self.user_call_site is not None:
            out["user_call_site"] = self.user_call_site
        if self.remedy is not None:
            out["remedy"] = self.remedy
        if self.details:
            out["details"] = self.details
        return out

    def key(self) -> tuple[str, str, str]:
        """What the finding is about: its kind, and the dataset and path it names (if any)."""
        details = self.details
        return (self.kind, str(details.get("dataset", "")), str(details.get("path", "")))

    @classmethod
    def from_dict(cls, data: FindingDict) -> Finding:
        return cls(
            kind=str(data["kind"]),
            severity=str(data["severity"]),
            message=str(data["message"]),
            ranks=[int(r) for r in data.get("ranks", [])],
            generator=data.get("generator"),
            call_site=data.get("call_site"),
            user_call_site=data.get("user_call_site"),
            remedy=data.get("remedy"),
            audit=int(data.get("audit", 0)),
            details=dict(data.get("details", {})),
        )


def severity_rank(severity: str) -> int:
    """A severity's place in :data:`SEVERITIES` (-1 for anything else, ``ok`` included)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


def worst(a: str | None, b: str | None) -> str:
    """The worse of two verdicts or severities; ``ok`` when neither is a severity."""
    ranked = [v for v in (a, b) if v in SEVERITIES]
    return max(ranked, key=severity_rank) if ranked else "ok"


def verdict_of(findings: list[Finding]) -> str:
    """``error`` if any finding is an error, ``warning`` if any warns, else ``ok``."""
    severities = {f.severity for f in findings}
    if "error" in severities:
        return "error"
    if "warning" in severities:
        return "warning"
    return "ok"


def rank_missing(
    missing: list[int],
    arrived: list[int],
    *,
    where: str,
    timeout: float | None,
    unseen: str,
    **fields: Any,
) -> Finding:
    """Ranks that did not arrive at an exchange (``where``: "arrive at the rngaudit exchange")
    within ``timeout``: what was not compared (``unseen``) and who did arrive; ``fields``:
    the finding's severity, remedy, audit and details."""
    waited = f" within {timeout:g} s" if timeout is not None else ""
    message = (
        f"Rank(s) {format_ranks(missing)} did not {where}{waited} "
        f"(arrived: {format_ranks(arrived)}); {unseen} were not compared."
    )
    return Finding(kind=RANK_MISSING, message=message, ranks=list(missing), **fields)
