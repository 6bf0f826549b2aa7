"""Rendering a report, or the comparison of two runs, as one self-contained HTML page."""

from __future__ import annotations

import functools
import html
import importlib.resources
import json
from collections.abc import Callable, Iterator

from rngaudit.audit_report import AuditReport
from rngaudit.findings import Finding
from rngaudit.reports.diff_text import (
    change_line,
    divergent_events,
    event_line,
    event_where,
    rank_heading,
    verdict,
)
from rngaudit.reports.run_diff import RankDiff, RunDiff, ordered_events
from rngaudit.reports.view import (
    Timeline,
    audit_suffix,
    counts,
    divergence_note,
    event_sites,
    event_summary,
    finding_fields,
    loader_rows,
    rank_cell_key,
    report_line,
    run_cell_key,
    timeline_title,
    timelines,
)
from rngaudit.schema import Event, RankRecord
from rngaudit.wording import format_ranks, ranks_phrase

FOLD_MIN = 2  # equal positions in a row that are folded into one <details>
MAX_ROWS = 400  # positions shown per timeline (the page stays small for huge runs)

Cell = Event | None
CellKey = Callable[[Cell], object]  # what makes two cells equal, JSON-encodable


@functools.cache
def _page() -> tuple[str, str]:
    """The page around the body: page.html with page.css inlined (package data), split at
    ``{body}``. No network: no fonts, scripts or images from anywhere (the policy forbids
    them too)."""
    files = importlib.resources.files("rngaudit.reports")
    page = files.joinpath("page.html").read_text(encoding="utf-8")
    style = files.joinpath("page.css").read_text(encoding="utf-8")
    head, tail = page.replace("{style}", style, 1).split("{body}")
    return head, tail


def _head(title: str) -> str:
    return _page()[0].replace("{title}", _e(title), 1)


def render_html(report: AuditReport) -> str:
    """The report as one HTML page: verdict and findings with their fixes first, then the
    loaders, then each audit's timeline with ranks side by side (identical ranks grouped)."""
    parts = [_head(f"rngaudit report: {report.verdict.upper()}")]
    parts.append(
        f'<header class="v-{_e(report.verdict)}"><h1>rngaudit report: '
        f"{_e(report.verdict.upper())}</h1>"
        f"<div>{_e(report_line(report))}. {_e(counts(report.findings).capitalize())}.</div>"
        "</header>\n"
    )
    if report.findings:
        parts.append('<section id="findings"><h2>Findings</h2>\n')
        parts += [_finding(report, finding) for finding in report.findings]
        parts.append("</section>\n")
    parts.append(_loaders(report))
    first = True
    for timeline in timelines(report):
        parts.append(_report_timeline(timeline, first))
        first = first and timeline.divergence is None
    parts.append(_page()[1])
    return "".join(parts)


def render_diff_html(diff: RunDiff) -> str:
    """The comparison of two runs as one HTML page: settings that differ first, then per
    rank (identical ranks grouped) the two timelines side by side, the divergence marked."""
    word = verdict(diff)
    parts = [_head(f"rngaudit diff: {word}")]
    parts.append(
        f'<header class="v-{word.lower()}"><h1>rngaudit diff: {word}</h1>'
        f"<div>A: <code>{_e(diff.path_a)}</code> ({_e(report_line(diff.a))}, verdict "
        f"{_e(diff.a.verdict)})</div>"
        f"<div>B: <code>{_e(diff.path_b)}</code> ({_e(report_line(diff.b))}, verdict "
        f"{_e(diff.b.verdict)})</div></header>\n"
    )
    for title, items in (
        ("Environment differences", diff.environment),
        ("Set-up differences", diff.setup),
    ):
        if items:
            rows = "".join(
                f"<tr><td>{_e(d.what)}</td><td>{_e(d.a)}</td><td>{_e(d.b)}</td>"
                f"<td>{_e(format_ranks(d.ranks) if d.ranks else 'all')}</td></tr>"
                for d in items
            )
            parts.append(
                f'<section class="settings"><h2>{title}</h2><table class="plain">'
                "<tr><th>setting</th><th>run A</th><th>run B</th><th>ranks</th></tr>"
                f"{rows}</table></section>\n"
            )
    for note in diff.notes:
        parts.append(f'<p class="note">Note: {_e(note)}.</p>\n')
    first = True
    records_a = {r.get("rank"): r for r in diff.a.ranks}
    records_b = {r.get("rank"): r for r in diff.b.ranks}
    for rank_diff in diff.ranks:
        rank = rank_diff.ranks[0]
        parts.append(_diff_rank(rank_diff, records_a.get(rank), records_b.get(rank), first))
        first = first and rank_diff.position is None
    parts.append(_page()[1])
    return "".join(parts)


# Report pieces -----------------------------------------------------------------------------


def _finding(report: AuditReport, finding: Finding) -> str:
    sev = _e(finding.severity)
    rows = []
    for label, value in finding_fields(finding):
        if label == "remedy":
            rows.append(f'<dt>fix</dt><dd class="fix">{_e(value)}</dd>')
        elif label in ("generator", "drawn at", "user code"):
            rows.append(f"<dt>{_e(label)}</dt><dd><code>{_e(value)}</code></dd>")
        else:
            rows.append(f"<dt>{_e(label)}</dt><dd>{_e(value)}</dd>")
    return (
        f'<article class="finding s-{sev}"><h3><span class="badge">{sev}</span>'
        f"<code>{_e(finding.kind)}</code>{_e(audit_suffix(report, finding.audit))}</h3>"
        f"<div>{_e(finding.message)}</div><dl>{''.join(rows)}</dl></article>\n"
    )


def _loaders(report: AuditReport) -> str:
    """The loaders built in the audited windows, with sampler chains and early draws."""
    loaders = loader_rows(report)
    if not loaders:
        return ""
    rows = []
    for loader, draws in loaders:
        drawn: dict[str, list[int]] = {}
        for rank, fp in draws.items():
            drawn.setdefault(fp, []).append(rank)
        drew = "; ".join(f"{ranks_phrase(r)} state {fp}" for fp, r in drawn.items())
        drew = f"drew: {drew}" if drew else "no draw"
        rows.append(
            f"<tr><td><code>{_e(str(loader.get('loader')))}</code></td>"
            f"<td>{_e(str(loader.get('num_workers', 0)))}</td>"
            f"<td><code>{_e(str(loader.get('sampler') or 'no sampler'))}</code></td>"
            f"<td><code>{_e(str(loader.get('generator')))}</code></td><td>{_e(drew)}</td></tr>"
        )
    return (
        '<section id="loaders"><h2>Loaders built in the audited windows</h2>'
        '<table class="plain"><tr><th>loader</th><th>workers</th><th>sampler chain</th>'
        f"<th>generator</th><th>before iteration</th></tr>{''.join(rows)}</table></section>\n"
    )


def _report_timeline(timeline: Timeline, first: bool) -> str:
    """Ranks with identical columns grouped; positions where every group agrees folded."""
    groups: dict[str, list[int]] = {}
    for j, _rank in enumerate(timeline.ranks):
        column = [rank_cell_key(row[j]) for row in timeline.rows]
        groups.setdefault(json.dumps(column, default=str), []).append(j)
    members = list(groups.values())
    headers = [ranks_phrase([timeline.ranks[j] for j in js]) for js in members]
    rows = [[row[js[0]] for js in members] for row in timeline.rows]
    note_class = "note diverges" if timeline.divergence is not None else "note"
    return (
        f'<section class="timeline"><h2>{_e(timeline_title(timeline))}</h2>'
        f'<p class="{note_class}">{_e(divergence_note(timeline))}</p>'
        + _grid(headers, rows, timeline.divergence, first)
        + "</section>\n"
    )


# Diff pieces -------------------------------------------------------------------------------


def _diff_rank(
    rank_diff: RankDiff, record_a: RankRecord | None, record_b: RankRecord | None, first: bool
) -> str:
    heading = ranks_phrase(rank_diff.ranks).capitalize()
    parts = [f'<section class="rank"><h2>{_e(heading)}</h2>']
    note_class = "note diverges" if rank_diff.position is not None else "note"
    parts.append(f'<p class="{note_class}">{_e(rank_heading(rank_diff))}</p>')
    rows = divergent_events(rank_diff)
    if rows:
        items = "".join(
            f"<li><b>{_e(label)}:</b> "
            + (
                "nothing (its timeline ends here)"
                if event is None
                else f"<code>{_e(event_line(event))}</code> {_e(event_where(event))}"
            )
            + "</li>"
            for label, event in rows
        )
        parts.append(f"<ul>{items}</ul>")
    if not rank_diff.missing:
        events_a = ordered_events(record_a)
        events_b = ordered_events(record_b)
        depth = max(len(events_a), len(events_b))
        grid_rows = [
            [events_a[i] if i < len(events_a) else None, events_b[i] if i < len(events_b) else None]
            for i in range(depth)
        ]
        parts.append(_grid(["run A", "run B"], grid_rows, rank_diff.position, first, diff=True))
    if rank_diff.after:
        items = "".join(f"<li>{_e(change_line(c))}</li>" for c in rank_diff.after)
        more = f"<li>... and {rank_diff.after_more} more</li>" if rank_diff.after_more else ""
        parts.append(
            "<h3>From there on, the call sites that differ (draws in A, in B)</h3>"
            f'<ul class="mono">{items}{more}</ul>'
        )
    parts.append("</section>\n")
    return "".join(parts)


# The grid ----------------------------------------------------------------------------------


def _grid(
    headers: list[str],
    rows: list[list[Cell]],
    divergence: int | None,
    first: bool,
    *,
    diff: bool = False,
) -> str:
    """Columns side by side, one row per position; runs of equal positions folded."""
    key = run_cell_key if diff else rank_cell_key
    out = [f'<div class="scroll"><div class="grid" style="--cols: {len(headers)}">']
    out.append(
        '<div class="row head"><div class="pos">#</div>'
        + "".join(f"<div>{_e(h)}</div>" for h in headers)
        + "</div>"
    )
    shown = rows[:MAX_ROWS]
    for start, stop, equal in _stretches(shown, divergence, key):
        body = "".join(
            _row(i, shown[i], i == divergence, first and i == divergence, key)
            for i in range(start, stop)
        )
        if equal and stop - start >= FOLD_MIN:
            where = "every column" if len(headers) > 1 else "the column"
            out.append(
                f'<details class="fold"><summary>positions {start}-{stop - 1}: '
                f"{stop - start} equal positions in {where} (click to unfold)</summary>"
                f"{body}</details>"
            )
        else:
            out.append(body)
    out.append("</div></div>")
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="muted">{len(rows) - MAX_ROWS} later positions not shown.</p>')
    return "".join(out)


def _stretches(
    rows: list[list[Cell]], divergence: int | None, key: CellKey
) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, all columns equal) for maximal runs; the divergence is never folded."""
    flags = [i != divergence and _all_equal(cells, key) for i, cells in enumerate(rows)]
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or flags[i] != flags[start]:
            yield start, i, flags[start]
            start = i


def _all_equal(cells: list[Cell], key: CellKey) -> bool:
    return cells[0] is not None and len({json.dumps(key(c), default=str) for c in cells}) == 1


def _row(index: int, cells: list[Cell], divergent: bool, anchor: bool, key: CellKey) -> str:
    """One position; at the divergence, the cells that differ from most columns are marked
    (every cell when no value has a majority)."""
    classes = "row divergent" if divergent else "row"
    ident = ' id="first-divergence"' if anchor else ""
    keys = [json.dumps(key(cell), default=str) for cell in cells]
    common = max(set(keys), key=keys.count)
    majority = common if keys.count(common) * 2 > len(keys) else None
    out = [f'<div class="{classes}"{ident}><div class="pos">{index}</div>']
    for cell, cell_key in zip(cells, keys, strict=True):
        out.append(_cell(cell, divergent and cell_key != majority))
    out.append("</div>")
    return "".join(out)


def _cell(event: Cell, differs: bool) -> str:
    css = ' class="differs"' if differs else ""
    if event is None:
        return f'<div{css}><span class="none">(no event)</span></div>'
    sites = "".join(f'<div class="site mono">{_e(site)}</div>' for site in event_sites(event))
    return (
        f'<div{css}><div class="gen mono">{_e(str(event.get("generator") or "?"))}</div>'
        f'<div class="mono">{_e(event_summary(event))}</div>{sites}</div>'
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)
