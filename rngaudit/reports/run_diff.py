"""Comparing two runs: where each rank's timeline first parts, and what differs after."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rngaudit.audit_report import AuditReport
from rngaudit.reports.reading import load_report_dir
from rngaudit.schema import DRAW, Event, Loader, RankRecord
from rngaudit.wording import format_site

LOOKAHEAD = 32  # how far ahead an event is searched for before two events count as different
BEFORE = 3  # common events shown before the first divergence
MAX_AFTER = 12  # call sites listed in the summary of what differs afterwards

# Why a rank's timelines part.
ONLY_A, ONLY_B = "only-in-a", "only-in-b"
DIFFERENT_EVENT, DIFFERENT_STATE, DIFFERENT_COUNT = (
    "different-event",
    "different-state",
    "different-count",
)
REASONS = {
    ONLY_A: "a draw present in run A only",
    ONLY_B: "a draw present in run B only",
    DIFFERENT_EVENT: "the runs made different draws here",
    DIFFERENT_STATE: "same draw, different generator state (fingerprint)",
    DIFFERENT_COUNT: "same draw, made a different number of times",
}


@dataclass
class Difference:
    """One setting that differs between the runs (a version, a seed, a loader's workers)."""

    what: str
    a: str
    b: str
    ranks: list[int] = field(default_factory=list)  # empty: the whole run

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "a": self.a, "b": self.b, "ranks": self.ranks}


@dataclass
class SiteChange:
    """After the divergence: how one call site's draws differ between the runs."""

    generator: str
    op: str
    site: str
    user_site: str
    count_a: int
    count_b: int
    states_differ: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator,
            "op": self.op,
            "site": self.site,
            "user_site": self.user_site,
            "count_a": self.count_a,
            "count_b": self.count_b,
            "states_differ": self.states_differ,
        }


@dataclass
class RankDiff:
    """One rank's comparison (ranks with the same outcome share one)."""

    ranks: list[int]
    events_a: int
    events_b: int
    position: int | None = None  # index in the rank's ordered events; None: identical
    reason: str = ""
    a: Event | None = None  # run A's event at the divergence (None: A's timeline ended)
    b: Event | None = None
    before: list[Event] = field(default_factory=list)
    after: list[SiteChange] = field(default_factory=list)
    after_more: int = 0
    missing: str = ""  # "a" or "b": the rank has no record in that run

    @property
    def identical(self) -> bool:
        return self.position is None and not self.missing

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "identical": self.identical,
            "missing_in": self.missing or None,
            "events_a": self.events_a,
            "events_b": self.events_b,
            "position": self.position,
            "reason": self.reason or None,
            "a": _brief(self.a) if self.a else None,
            "b": _brief(self.b) if self.b else None,
            "before": [_brief(e) for e in self.before],
            "after": [change.to_dict() for change in self.after],
            "after_more": self.after_more,
        }


@dataclass
class RunDiff:
    """Two runs compared: settings first, then per rank the first point where they part."""

    path_a: str
    path_b: str
    a: AuditReport
    b: AuditReport
    environment: list[Difference]
    setup: list[Difference]
    ranks: list[RankDiff]
    notes: list[str]

    @property
    def identical(self) -> bool:
        return not self.environment and not self.setup and all(r.identical for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "a": _run_dict(self.path_a, self.a),
            "b": _run_dict(self.path_b, self.b),
            "environment": [d.to_dict() for d in self.environment],
            "setup": [d.to_dict() for d in self.setup],
            "ranks": [r.to_dict() for r in self.ranks],
            "notes": self.notes,
        }


def diff_dirs(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str]) -> RunDiff:
    """Load two report directories (validated as for ``rngaudit report``) and compare them.

    Raises :class:`~rngaudit.errors.ReportError` for unusable input.
    """
    return diff_reports(load_report_dir(path_a), load_report_dir(path_b), str(path_a), str(path_b))


def diff_reports(a: AuditReport, b: AuditReport, path_a: str = "A", path_b: str = "B") -> RunDiff:
    """Compare two runs' reports; linear in the number of events."""
    records_a = {_rank(r): r for r in a.ranks}
    records_b = {_rank(r): r for r in b.ranks}
    notes = [
        f"run {name} recorded no environment (a report from an older rngaudit)"
        for name, records in (("A", records_a), ("B", records_b))
        if records and not any(isinstance(r.get("environment"), dict) for r in records.values())
    ]
    ranks = [
        _rank_diff(rank, records_a.get(rank), records_b.get(rank))
        for rank in sorted(set(records_a) | set(records_b))
    ]
    return RunDiff(
        path_a=path_a,
        path_b=path_b,
        a=a,
        b=b,
        environment=_environment(a, b, records_a, records_b),
        setup=_loaders(records_a, records_b),
        ranks=_grouped(ranks),
        notes=notes,
    )


# Settings ----------------------------------------------------------------------------------


def _environment(
    a: AuditReport,
    b: AuditReport,
    records_a: dict[int, RankRecord],
    records_b: dict[int, RankRecord],
) -> list[Difference]:
    found = []
    if a.world_size != b.world_size:
        found.append(Difference("world size", str(a.world_size), str(b.world_size)))
    fields = _env_fields(records_a) | _env_fields(records_b)
    for name in sorted(fields, key=_field_order):
        found += _per_rank(name, records_a, records_b)
    return found


def _env_fields(records: dict[int, RankRecord]) -> set[str]:
    names: set[str] = set()
    for record in records.values():
        env = record.get("environment")
        if not isinstance(env, dict):
            continue
        for key, value in env.items():
            if isinstance(value, dict):
                names.update(f"{key}.{inner}" for inner in value)
            else:
                names.add(key)
    return names


def _field_order(name: str) -> tuple[int, str]:
    order = ("packages", "python", "seeds", "variables")
    head = name.split(".", 1)[0]
    return (order.index(head) if head in order else len(order), name)


def _env_value(record: RankRecord, name: str) -> str | None:
    env = record.get("environment")
    if not isinstance(env, dict):
        return None
    head, _, inner = name.partition(".")
    value = env.get(head)
    if inner:
        value = value.get(inner) if isinstance(value, dict) else None
    return None if value is None else str(value)


def _env_label(name: str) -> str:
    head, _, inner = name.partition(".")
    return {
        "packages": f"{inner} version",
        "seeds": f"seed of {inner}",
        "variables": f"${inner}",
    }.get(head, name)


def _per_rank(
    name: str,
    records_a: dict[int, RankRecord],
    records_b: dict[int, RankRecord],
) -> list[Difference]:
    """Differences of one setting, ranks with the same pair of values grouped; only ranks
    recorded in both runs and with an environment in both are compared."""
    pairs: dict[tuple[str, str], list[int]] = {}
    for rank in sorted(set(records_a) & set(records_b)):
        ra, rb = records_a[rank], records_b[rank]
        if not all(isinstance(r.get("environment"), dict) for r in (ra, rb)):
            continue
        va, vb = _env_value(ra, name), _env_value(rb, name)
        if va != vb:
            pairs.setdefault((_shown(va), _shown(vb)), []).append(rank)
    common = len(set(records_a) & set(records_b))
    label = _env_label(name)
    return [
        Difference(label, va, vb, [] if len(ranks) == common and len(pairs) == 1 else ranks)
        for (va, vb), ranks in pairs.items()
    ]


def _shown(value: str | None) -> str:
    return "(none)" if value is None else value


_LOADER_FIELDS = ("num_workers", "sampler", "generator")


def _loaders(
    records_a: dict[int, RankRecord], records_b: dict[int, RankRecord]
) -> list[Difference]:
    """Loaders built in the audited windows: workers, sampler chain, generator; by name."""
    pairs: dict[tuple[str, str, str, str], list[int]] = {}
    for rank in sorted(set(records_a) & set(records_b)):
        la, lb = _loader_table(records_a[rank]), _loader_table(records_b[rank])
        for name in [*la, *(n for n in lb if n not in la)]:
            if name not in la or name not in lb:
                built = ("yes" if name in la else "no", "yes" if name in lb else "no")
                pairs.setdefault((name, "built", *built), []).append(rank)
                continue
            for key in _LOADER_FIELDS:
                va, vb = _shown(_str(la[name].get(key))), _shown(_str(lb[name].get(key)))
                if va != vb:
                    pairs.setdefault((name, key, va, vb), []).append(rank)
    common = len(set(records_a) & set(records_b))
    return [
        Difference(f"{name} {key}", va, vb, [] if len(ranks) == common else ranks)
        for (name, key, va, vb), ranks in pairs.items()
    ]


def _loader_table(record: RankRecord) -> dict[str, Loader]:
    table: dict[str, Loader] = {}
    for loader in record.get("loaders") or []:
        if isinstance(loader, dict):
            table.setdefault(str(loader.get("loader")), loader)
    return table


def _str(value: object) -> str | None:
    return None if value is None else str(value)


# Timelines ---------------------------------------------------------------------------------


def _rank(record: RankRecord) -> int:
    rank = record.get("rank")
    return rank if isinstance(rank, int) else 0


def ordered_events(record: RankRecord | None) -> list[Event]:
    """A rank's events in the order they first happened (audit, then sequence number)."""
    if record is None:
        return []
    events = [e for e in record.get("events") or [] if isinstance(e, dict)]
    return sorted(events, key=lambda e: (_int(e.get("audit")), _int(e.get("seq"))))


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


EventKey = tuple[str | None, str | None, str | None, str | None, str, str, str | None]


def event_key(event: Event) -> EventKey:
    """What makes two runs' events the same draw: generator, op, kind, phase, call sites,
    sampler chain (file names shortened, so two checkouts of a program compare equal)."""
    sampler = event.get("sampler")
    return (
        event.get("kind"),
        event.get("generator"),
        event.get("op"),
        event.get("phase"),
        format_site(event.get("call_site"), function=False),
        format_site(event.get("user_call_site"), function=False),
        sampler.get("chain") if isinstance(sampler, dict) else None,
    )


def _state_differs(a: Event, b: Event) -> bool:
    """Both are draws whose recorded generator states differ. (A seeding's state before it
    is not compared: for an unseeded generator it is random on every run.)"""
    fa, fb = a.get("fingerprint"), b.get("fingerprint")
    return a.get("kind") == DRAW and bool(fa) and bool(fb) and fa != fb


def _rank_diff(rank: int, ra: RankRecord | None, rb: RankRecord | None) -> RankDiff:
    events_a, events_b = ordered_events(ra), ordered_events(rb)
    result = RankDiff([rank], len(events_a), len(events_b))
    if ra is None or rb is None:
        result.missing = "a" if ra is None else "b"
        return result
    keys_a = [event_key(e) for e in events_a]
    keys_b = [event_key(e) for e in events_b]
    for i in range(min(len(events_a), len(events_b)) + 1):
        ea = events_a[i] if i < len(events_a) else None
        eb = events_b[i] if i < len(events_b) else None
        if ea is None and eb is None:
            return result
        if ea is None or eb is None:
            reason = ONLY_B if ea is None else ONLY_A
        elif keys_a[i] != keys_b[i]:
            reason = _which_extra(keys_a, keys_b, i)
        elif _state_differs(ea, eb):
            reason = DIFFERENT_STATE
        elif _int(ea.get("count")) != _int(eb.get("count")):
            reason = DIFFERENT_COUNT
        else:
            continue
        result.position, result.reason = i, reason
        result.a, result.b = ea, eb  # for an extra draw, the other run's next event
        result.before = events_a[max(0, i - BEFORE) : i]
        changes = _after(events_a[i:], events_b[i:])
        result.after, result.after_more = changes[:MAX_AFTER], max(0, len(changes) - MAX_AFTER)
        return result
    return result


def _which_extra(keys_a: list[EventKey], keys_b: list[EventKey], i: int) -> str:
    """At ``i`` the events differ: is one run's event an extra one (the other run has the
    same event a little later), or are they simply different draws?"""
    for k in range(1, LOOKAHEAD + 1):
        if i + k < len(keys_b) and keys_b[i + k] == keys_a[i]:
            return ONLY_B
        if i + k < len(keys_a) and keys_a[i + k] == keys_b[i]:
            return ONLY_A
    return DIFFERENT_EVENT


@dataclass
class _SiteDraws:
    """One call site's draws after the divergence, per run: counts and generator states."""

    event: Event  # the first seen
    counts: list[int] = field(default_factory=lambda: [0, 0])
    states: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))


def _after(events_a: list[Event], events_b: list[Event]) -> list[SiteChange]:
    """From the divergence on, per (generator, op, call site): draws in each run, and
    whether the generator states differed; only the call sites that differ."""
    table: dict[EventKey, _SiteDraws] = {}
    for column, events in ((0, events_a), (1, events_b)):
        for event in events:
            row = table.setdefault(event_key(event), _SiteDraws(event))
            row.counts[column] += max(1, _int(event.get("count")))
            fingerprint = event.get("fingerprint")
            if event.get("kind") == DRAW and fingerprint:
                row.states[column].append(fingerprint)
    changes = []
    for row in table.values():
        (count_a, count_b), (fps_a, fps_b), event = row.counts, row.states, row.event
        states_differ = bool(fps_a) and bool(fps_b) and fps_a != fps_b
        if count_a == count_b and not states_differ:
            continue
        changes.append(
            SiteChange(
                generator=str(event.get("generator") or "?"),
                op=str(event.get("op") or "?"),
                site=format_site(event.get("call_site")),
                user_site=format_site(event.get("user_call_site")),
                count_a=count_a,
                count_b=count_b,
                states_differ=states_differ,
            )
        )
    return changes


def _grouped(diffs: Iterable[RankDiff]) -> list[RankDiff]:
    """Ranks whose comparison came out the same, as one entry."""
    groups: dict[str, RankDiff] = {}
    for diff in diffs:
        data = diff.to_dict()
        data.pop("ranks")
        key = json.dumps(data, sort_keys=True, default=str)
        if key in groups:
            groups[key].ranks += diff.ranks
        else:
            groups[key] = diff
    return list(groups.values())


def _brief(event: Event) -> dict[str, Any]:
    """The fields of an event a diff shows."""
    return {
        "generator": event.get("generator"),
        "op": event.get("op"),
        "kind": event.get("kind"),
        "count": event.get("count"),
        "fingerprint": event.get("fingerprint"),
        "call_site": event.get("call_site"),
        "user_call_site": event.get("user_call_site"),
        "phase": event.get("phase"),
        "audit": event.get("audit"),
    }


def _run_dict(path: str, report: AuditReport) -> dict[str, Any]:
    return {
        "path": path,
        "run_id": report.run_id,
        "world_size": report.world_size,
        "mode": report.mode,
        "verdict": report.verdict,
    }
