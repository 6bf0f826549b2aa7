"""Compare the workers' first-batch draws: the same call site drawing from the same state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rngaudit.wording import format_site

DRAWS = "draws"  # evidence: a call site drew from the same generator state in two workers
STATE = "state"  # evidence: a generator advanced from the same state to the same state


@dataclass
class Duplicate:
    """One stream that two or more workers drew identically (a confirmed duplicate), or,
    ``confirmed=False``, a generator in the same state in several workers whose draws were
    not observed."""

    key: str  # the holder's path where the walk names it, else the call or creation site
    type: str  # the generator's family
    evidence: str  # DRAWS or STATE
    groups: list[list[int]]  # workers that drew the same stream, one list per stream shared
    reporting: list[int]  # the workers that drew from it (or hold it) at all
    distinct: int  # distinct streams among the reporting workers
    holder: str | None = None
    call_sites: list[str] = field(default_factory=list)
    user_sites: list[str] = field(default_factory=list)
    created_at: str | None = None
    confirmed: bool = True
    advanced: bool = True  # state evidence: it drew (False: it only appeared, in one state)

    @property
    def worker_ids(self) -> list[int]:
        return sorted(w for group in self.groups for w in group)


def _components(members: Mapping[int, set[str]]) -> list[list[int]]:
    """Workers joined when they share any fingerprint; only groups of two or more."""
    parent = {w: w for w in members}

    def root(w: int) -> int:
        while parent[w] != w:
            parent[w] = parent[parent[w]]
            w = parent[w]
        return w

    owner: dict[str, int] = {}
    for worker, fps in sorted(members.items()):
        for fp in fps:
            if fp in owner:
                parent[root(worker)] = root(owner[fp])
            else:
                owner[fp] = worker
    groups: dict[int, list[int]] = {}
    for worker in sorted(members):
        groups.setdefault(root(worker), []).append(worker)
    return sorted(g for g in groups.values() if len(g) >= 2)


def _distinct(members: Mapping[int, set[str]], groups: list[list[int]]) -> int:
    grouped = {w for g in groups for w in g}
    return len(groups) + len([w for w in members if w not in grouped])


def _ok(reports: Mapping[int, Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    return {w: r for w, r in reports.items() if isinstance(r, Mapping) and r.get("status") == "ok"}


def _items(report: Mapping[str, Any], name: str) -> Iterable[Mapping[str, Any]]:
    items = report.get(name)
    if not isinstance(items, list):
        return ()
    return (item for item in items if isinstance(item, Mapping))


def from_draws(reports: Mapping[int, Mapping[str, Any]]) -> list[Duplicate]:
    """Call sites that drew from the same generator state in two or more workers.

    Per (call site, op, holder), each worker's fingerprints before its draws there. A
    worker whose own fingerprints repeat at that site (a generator reset or rebuilt the same
    for every sample) is left out: its draws would repeat without workers too. A worker that
    drew there only once is no evidence either way (a generator reset to a constant before
    every draw looks the same as a shared one after one draw): the workers that share a
    stream are a confirmed duplicate when at least two of them drew there twice or more,
    from distinct states; else an unconfirmed one.
    """
    table: dict[tuple[str, str, str], dict[int, list[str]]] = {}
    meta: dict[tuple[str, str, str], tuple[str, str | None, set[str]]] = {}
    for worker, report in sorted(_ok(reports).items()):
        for draw in _items(report, "draws"):
            site = format_site(draw.get("site"))
            holder = draw.get("holder")
            holder = holder if isinstance(holder, str) else None
            key = (site, str(draw.get("op", "")), holder or "")
            fps = [fp for fp in draw.get("fingerprints") or () if isinstance(fp, str)]
            table.setdefault(key, {}).setdefault(worker, []).extend(fps)
            user = format_site(draw.get("user_site"))
            entry = meta.setdefault(key, (str(draw.get("type", "?")), holder, set()))
            if user:
                entry[2].add(user)
    found: list[Duplicate] = []
    for key, per_worker in table.items():
        members = {
            w: set(fps) for w, fps in per_worker.items() if fps and len(set(fps)) == len(fps)
        }
        groups = _components(members)
        if not groups:
            continue
        streams = {w for w, fps in members.items() if len(fps) >= 2}  # a stream, not a reset
        confirmed = [g for g in groups if len(streams.intersection(g)) >= 2]
        site, _, _ = key
        kind, holder, users = meta[key]
        found.append(
            Duplicate(
                key=holder or site,
                type=kind,
                evidence=DRAWS,
                groups=confirmed or groups,
                reporting=sorted(members),
                distinct=_distinct(members, confirmed or groups),
                holder=holder,
                call_sites=[site],
                user_sites=sorted(u for u in users if u != site),
                confirmed=bool(confirmed),
            )
        )
    return _merge(found)


def from_states(reports: Mapping[int, Mapping[str, Any]]) -> list[Duplicate]:
    """Generators that advanced from the same state to the same state in two or more workers
    over the first batch (numpy's generators whose draws no user-code call or return
    separated are seen this way), and generators that appeared during it in the same state:
    unconfirmed, both. One transition per worker cannot tell a stream the workers share from
    a generator reset to a constant before every sample."""
    pairs: dict[tuple[str, str], dict[int, list[str]]] = {}
    fresh: dict[tuple[str, str], dict[int, list[str]]] = {}
    meta: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    for worker, report in sorted(_ok(reports).items()):
        for state in _items(report, "states"):
            path = state.get("path")
            path = path if isinstance(path, str) else None
            created = format_site(state.get("created_at")) or None
            if path is None and created is None:
                continue  # neither held nor created where it could be named
            before, after = state.get("before"), state.get("after")
            if not isinstance(after, str):
                continue
            key = (path or f"created at {created}", str(state.get("type", "?")))
            meta.setdefault(key, (path, created))
            if isinstance(before, str):
                if before != after:  # it drew (or was reseeded) during the batch
                    pairs.setdefault(key, {}).setdefault(worker, []).append(f"{before}>{after}")
            elif path is not None:
                fresh.setdefault(key, {}).setdefault(worker, []).append(after)
    found: list[Duplicate] = []
    for table, advanced in ((pairs, True), (fresh, False)):
        for key, per_worker in table.items():
            members = {w: set(v) for w, v in per_worker.items() if len(set(v)) == len(v)}
            groups = _components(members)
            if not groups:
                continue
            path, created = meta[key]
            found.append(
                Duplicate(
                    key=key[0],
                    type=key[1],
                    evidence=STATE,
                    groups=groups,
                    reporting=sorted(members),
                    distinct=_distinct(members, groups),
                    holder=path,
                    created_at=created,
                    confirmed=False,
                    advanced=advanced,
                )
            )
    return found


def _merge(found: list[Duplicate]) -> list[Duplicate]:
    """One duplicate per key: the call sites of a holder drawn at several sites together (a
    confirmed site's evidence replaces the unconfirmed sites')."""
    merged: dict[str, Duplicate] = {}
    for dup in found:
        known = merged.get(dup.key)
        if known is None or (dup.confirmed and not known.confirmed):
            merged[dup.key] = dup
            continue
        if known.confirmed and not dup.confirmed:
            continue
        known.call_sites = sorted(set(known.call_sites) | set(dup.call_sites))
        known.user_sites = sorted(set(known.user_sites) | set(dup.user_sites))
        if len(dup.worker_ids) > len(known.worker_ids):
            known.groups, known.reporting, known.distinct = dup.groups, dup.reporting, dup.distinct
    return list(merged.values())


def duplicates(reports: Mapping[int, Mapping[str, Any]]) -> list[Duplicate]:
    """Every duplicated stream in the workers' draw reports, one per holder (or site): the
    draw evidence first; state evidence only for holders the draws did not already name."""
    by_draws = from_draws(reports)
    named = {d.key for d in by_draws}
    by_state = [d for d in from_states(reports) if d.key not in named]
    drew = {d.key for d in by_state if d.advanced}
    by_state = [d for d in by_state if d.advanced or d.key not in drew]
    return [*by_draws, *by_state]


def drawn(reports: Mapping[int, Mapping[str, Any]]) -> dict[str, int]:
    """The holders seen drawing (or advancing) in the first batch: path -> number of workers."""
    workers: dict[str, set[int]] = {}
    for worker, report in _ok(reports).items():
        for draw in _items(report, "draws"):
            holder = draw.get("holder")
            if isinstance(holder, str):
                workers.setdefault(holder, set()).add(worker)
        for state in _items(report, "states"):
            path = state.get("path")
            if isinstance(path, str) and state.get("before") != state.get("after"):
                workers.setdefault(path, set()).add(worker)
    return {path: len(ws) for path, ws in workers.items()}
