"""What every renderer shows of a report, computed once: timelines, the identity of an event,
a finding's fields, the loaders, the run line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from rngaudit.audit_report import AuditReport
from rngaudit.findings import SEVERITIES, Finding
from rngaudit.reports.run_diff import event_key
from rngaudit.schema import DRAW, PRE_ITERATION, AuditDict, Event, Loader
from rngaudit.wording import format_ranks, format_site


def report_line(report: AuditReport) -> str:
    return f"run {report.run_id or '?'}, world size {report.world_size}, mode {report.mode}"


def counts(findings: list[Finding]) -> str:
    """``2 findings (1 error, 1 warning)``, or ``no findings``."""
    if not findings:
        return "no findings"
    counts = [
        f"{n} {severity}{'s' if n > 1 else ''}"
        for severity in reversed(SEVERITIES)
        if (n := sum(f.severity == severity for f in findings))
    ]
    noun = "finding" if len(findings) == 1 else "findings"
    return f"{len(findings)} {noun} ({', '.join(counts)})"


def audit_name(audit: AuditDict) -> str:
    name = f"#{audit.get('index', 0)}"
    if audit.get("label"):
        name += f" {audit['label']}"
    if audit.get("verdict"):
        name += f" ({audit['verdict']})"
    return name


def audit_suffix(report: AuditReport, index: int) -> str:
    """`` (audit 1 "epoch 1")`` when the report holds several audits, else nothing."""
    if len(report.audits) <= 1:
        return ""
    labels = {a.get("index"): a.get("label") for a in report.audits}
    label = labels.get(index)
    return f" (audit {index} {label!r})" if label else f" (audit {index})"


def finding_fields(finding: Finding) -> list[tuple[str, str]]:
    fields = [
        ("generator", finding.generator or ""),
        ("drawn at", format_site(finding.call_site)),
        ("user code", format_site(finding.user_call_site)),
        ("ranks", format_ranks(finding.ranks)),
        ("remedy", finding.remedy or ""),
        ("details", ", ".join(f"{k}={scalar(v)}" for k, v in finding.details.items())),
    ]
    return [(label, value) for label, value in fields if value]


def scalar(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass
class Timeline:
    """One audit's pre-iteration events, one column per rank, aligned by position."""

    audit: int
    label: str
    ranks: list[int]
    rows: list[list[Event | None]]
    divergence: int | None
    reason: str


def timelines(report: AuditReport) -> list[Timeline]:
    records = sorted(report.ranks, key=lambda r: number(r, "rank"))
    per_rank = [
        [e for e in r.get("events") or [] if e.get("phase") == PRE_ITERATION] for r in records
    ]
    audits = sorted({number(e, "audit") for events in per_rank for e in events})
    labels = {a.get("index"): str(a.get("label") or "") for a in report.audits}
    timelines = []
    for audit in audits:
        columns = [
            sorted(
                (e for e in events if number(e, "audit") == audit), key=lambda e: number(e, "seq")
            )
            for events in per_rank
        ]
        depth = max(len(column) for column in columns)
        rows = [[col[i] if i < len(col) else None for col in columns] for i in range(depth)]
        ranks = [number(r, "rank") for r in records]
        divergence, reason = first_divergence(rows, ranks)
        timelines.append(Timeline(audit, labels.get(audit, ""), ranks, rows, divergence, reason))
    return timelines


def number(data: Mapping[str, object], key: str, default: int = 0) -> int:
    """An integer field of a record or event; ``default`` when it is absent or null."""
    value = data.get(key)
    return value if isinstance(value, int) else default


def first_divergence(rows: list[list[Event | None]], ranks: list[int]) -> tuple[int | None, str]:
    for i, cells in enumerate(rows):
        absent = [rank for rank, cell in zip(ranks, cells, strict=True) if cell is None]
        if absent:
            which = "rank" if len(absent) == 1 else "ranks"
            verb = "has" if len(absent) == 1 else "have"
            return i, f"{which} {format_ranks(absent)} {verb} no event here"
        events = [cell for cell in cells if cell is not None]
        if len({rank_event_key(e) for e in events}) > 1:
            return i, "ranks differ in generator, op, call site or count"
        fingerprints = [e.get("fingerprint") for e in events]
        if (
            all(e.get("kind") == DRAW for e in events)
            and all(fingerprints)
            and len(set(fingerprints)) > 1
        ):
            return i, "same draw, different generator state (fingerprint)"
    return None, ""


EventKey = tuple[str | None, str | None, str | None, str, int]


def rank_event_key(event: Event) -> EventKey:
    return (
        event.get("kind"),
        event.get("generator"),
        event.get("op"),
        format_site(event.get("call_site")),
        number(event, "count", 1),
    )


def event_summary(event: Event) -> str:
    """``aten.rand x1 fp 5e6f7a8b [sampler]``."""
    text = f"{event.get('op') or '?'} x{number(event, 'count', 1)}"
    if event.get("fingerprint"):
        text += f" fp {str(event['fingerprint'])[:8]}"
    if event.get("sampler"):
        text += " [sampler]"
    return text


def event_sites(event: Event) -> list[str]:
    """The library call site, then the user's call site when it is another place."""
    site = format_site(event.get("call_site"), function=False)
    user = format_site(event.get("user_call_site"), function=False)
    return [s for s in (site, f"from {user}" if user and user != site else "") if s]


def divergence_note(timeline: Timeline) -> str:
    if timeline.divergence is None:
        return "No divergence: every rank made the same draws from the same generator state."
    return f"first divergence at position {timeline.divergence}: {timeline.reason}."


def timeline_title(timeline: Timeline) -> str:
    label = f" {timeline.label!r}" if timeline.label else ""
    return f"Pre-iteration timeline, audit {timeline.audit}{label}"


def loader_rows(report: AuditReport) -> list[tuple[Loader, dict[int, str]]]:
    """One row per loader (audit, name), first seen first: the loader, and the state each
    rank's loader drew from before iteration (rank -> fingerprint, in the records' order)."""
    seen: dict[tuple[int | None, str], Loader] = {}
    early: dict[tuple[int | None, str], dict[int, str]] = {}
    for record in report.ranks:
        for loader in record.get("loaders") or []:
            key = (loader.get("audit"), str(loader.get("loader")))
            seen.setdefault(key, loader)
            draws = early.setdefault(key, {})
            if loader.get("drew_before_iteration"):
                draws[int(record.get("rank", 0))] = str(loader.get("fingerprint"))
    return [(loader, early[key]) for key, loader in seen.items()]


Cell = Event | None


def rank_cell_key(cell: Cell) -> object:
    """What makes two ranks' cells of a timeline equal (JSON-encodable): the event, and the
    state a draw was made from."""
    if cell is None:
        return None
    return [*rank_event_key(cell), cell.get("fingerprint") if cell.get("kind") == DRAW else None]


def run_cell_key(cell: Cell) -> object:
    """What makes two runs' cells equal: the runs' event identity (``run_diff.event_key``),
    the count and the state a draw was made from."""
    if cell is None:
        return None
    state = cell.get("fingerprint") if cell.get("kind") == DRAW else None
    return [*event_key(cell), cell.get("count"), state]
