"""Rendering the comparison of two runs (``rngaudit diff``) as text, Markdown or JSON."""

from __future__ import annotations

import json

from rngaudit.report_files import finite
from rngaudit.reports.report_text import WIDTH, markdown_code, markdown_text, wrap
from rngaudit.reports.run_diff import (
    DIFFERENT_COUNT,
    DIFFERENT_EVENT,
    DIFFERENT_STATE,
    ONLY_A,
    ONLY_B,
    REASONS,
    Difference,
    RankDiff,
    RunDiff,
    SiteChange,
)
from rngaudit.reports.view import event_summary, report_line
from rngaudit.schema import Event
from rngaudit.wording import format_site, ranks_phrase

_INDENT = "  "
_LABEL = 17


def render_diff_json(diff: RunDiff) -> str:
    """The comparison as one JSON object (``RunDiff.to_dict()``), indented."""
    return json.dumps(finite(diff.to_dict()), indent=2, allow_nan=False) + "\n"


def render_diff_text(diff: RunDiff, *, width: int = WIDTH) -> str:
    """Settings that differ first, then per rank where the timelines part and what follows."""
    lines = [f"rngaudit diff: {verdict(diff)}"]
    lines += [_fit_line(f"A: {run_line(diff, 'a')}", width)]
    lines += [_fit_line(f"B: {run_line(diff, 'b')}", width)]
    for title, items in (
        ("Environment differences", diff.environment),
        ("Set-up differences", diff.setup),
    ):
        if items:
            lines += ["", f"{title}:"]
            for item in items:
                lines += _wrap(difference_line(item), width, _INDENT, _INDENT * 3)
    for note in diff.notes:
        lines += ["", *_wrap(f"Note: {note}.", width, "", _INDENT)]
    for rank_diff in diff.ranks:
        lines += ["", *_text_rank(rank_diff, width)]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_diff_markdown(diff: RunDiff) -> str:
    """The text comparison's content as Markdown (text from the reports escaped: nothing of it
    is live, see :func:`rngaudit.reports.report_text.markdown_text`)."""
    lines = [
        f"# rngaudit diff: {verdict(diff)}",
        "",
        f"- A: {_md_run(diff, 'a')}",
        f"- B: {_md_run(diff, 'b')}",
    ]
    for title, items in (
        ("Environment differences", diff.environment),
        ("Set-up differences", diff.setup),
    ):
        if items:
            lines += ["", f"## {title}", ""]
            lines += [f"- {markdown_text(difference_line(d))}" for d in items]
    for note in diff.notes:
        lines += ["", f"> Note: {markdown_text(note)}."]
    for rank_diff in diff.ranks:
        lines += ["", *_markdown_rank(rank_diff)]
    return "\n".join(lines) + "\n"


# Shared pieces -----------------------------------------------------------------------------


def verdict(diff: RunDiff) -> str:
    return "IDENTICAL" if diff.identical else "DIFFERENT"


def run_line(diff: RunDiff, side: str) -> str:
    path, report = (diff.path_a, diff.a) if side == "a" else (diff.path_b, diff.b)
    return f"{path} ({report_line(report)}, verdict {report.verdict})"


def difference_line(item: Difference) -> str:
    where = f" ({ranks_phrase(item.ranks)})" if item.ranks else ""
    return f"{item.what}{where}: A {item.a}, B {item.b}"


def rank_heading(rank_diff: RankDiff) -> str:
    """``Rank 0: the timelines part at event 2: a draw present in run B only.``"""
    who = ranks_phrase(rank_diff.ranks).capitalize()
    if rank_diff.missing:
        other = "B" if rank_diff.missing == "a" else "A"
        return f"{who}: recorded in run {other} only."
    if rank_diff.position is None:
        return f"{who}: identical ({rank_diff.events_a} events, same generator states)."
    return (
        f"{who}: the timelines part at event {rank_diff.position} "
        f"(of {rank_diff.events_a} in A, {rank_diff.events_b} in B): "
        f"{REASONS[rank_diff.reason]}."
    )


def divergent_events(rank_diff: RankDiff) -> list[tuple[str, Event | None]]:
    """The events at the divergence, each with what it is: ``[("only in B", event), ...]``."""
    reason = rank_diff.reason
    if reason == ONLY_B:
        return [("only in B", rank_diff.b), ("A goes on with", rank_diff.a)]
    if reason == ONLY_A:
        return [("only in A", rank_diff.a), ("B goes on with", rank_diff.b)]
    if reason in (DIFFERENT_EVENT, DIFFERENT_STATE, DIFFERENT_COUNT):
        return [("A drew", rank_diff.a), ("B drew", rank_diff.b)]
    return []


def event_line(event: Event) -> str:
    """``torch.default_generator aten.rand x1 fp 1a2b3c4d``."""
    return f"{event.get('generator') or '?'} {event_summary(event)}"


def event_where(event: Event) -> str:
    """``at torch/nn/init.py:616 in kaiming_uniform_, from train.py:6 in <module>``."""
    site = format_site(event.get("call_site"))
    user = format_site(event.get("user_call_site"))
    text = f"at {site}" if site else "at an unknown call site"
    if user and user != site:
        text += f", from {user}"
    return text


def change_line(change: SiteChange) -> str:
    where = change.site + (f", from {change.user_site}" if change.user_site != change.site else "")
    state = ", generator state differs" if change.states_differ else ""
    return (
        f"{change.generator} {change.op} at {where or '?'}: "
        f"{change.count_a} in A, {change.count_b} in B{state}"
    )


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _fit_line(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _md_run(diff: RunDiff, side: str) -> str:
    path, report = (diff.path_a, diff.a) if side == "a" else (diff.path_b, diff.b)
    return f"{markdown_code(str(path))} ({markdown_text(report_line(report))}, verdict " + (
        f"{markdown_text(report.verdict)})"
    )


# Text --------------------------------------------------------------------------------------


def _text_rank(rank_diff: RankDiff, width: int) -> list[str]:
    lines = _wrap(rank_heading(rank_diff), width, "", _INDENT)
    hanging = _INDENT + " " * _LABEL
    for label, event in divergent_events(rank_diff):
        head = _INDENT + f"{label}:".ljust(_LABEL)
        if event is None:
            lines += _wrap("(nothing: its timeline ends here)", width, head, hanging)
            continue
        lines += _wrap(event_line(event), width, head, hanging)
        lines += _wrap(event_where(event), width, hanging, hanging + _INDENT)
    if rank_diff.before:
        lines.append(_INDENT + "before it, in both runs:")
        first = (rank_diff.position or 0) - len(rank_diff.before)
        for i, event in enumerate(rank_diff.before, first):
            text = f"{event_line(event)} {event_where(event)}"
            lines += _wrap(text, width, _INDENT * 2 + f"{i:>3}  ", _INDENT * 2 + " " * 5)
    if rank_diff.after:
        lines.append(_INDENT + "from there on, the call sites that differ (draws in A, in B):")
        for change in rank_diff.after:
            lines += _wrap(change_line(change), width, _INDENT * 2, _INDENT * 4)
        if rank_diff.after_more:
            lines.append(_INDENT * 2 + f"... and {rank_diff.after_more} more call sites")
    return lines


# Markdown ----------------------------------------------------------------------------------


def _markdown_rank(rank_diff: RankDiff) -> list[str]:
    heading = markdown_text(ranks_phrase(rank_diff.ranks).capitalize())
    lines = [f"## {heading}", "", markdown_text(rank_heading(rank_diff))]
    rows = divergent_events(rank_diff)
    if rows:
        lines += [""]
        for label, event in rows:
            if event is None:
                lines.append(f"- **{label}:** nothing (its timeline ends here)")
            else:
                lines.append(f"- **{label}:** {_md_event(event)}")
    if rank_diff.before:
        lines += ["", "Before it, in both runs:", ""]
        first = (rank_diff.position or 0) - len(rank_diff.before)
        for i, event in enumerate(rank_diff.before, first):
            lines.append(f"- {i}: {_md_event(event)}")
    if rank_diff.after:
        lines += ["", "From there on, the call sites that differ:", ""]
        lines += ["| generator | op | call site | draws in A | draws in B | state differs |"]
        lines += ["|---|---|---|---:|---:|---|"]
        for c in rank_diff.after:
            where = c.site + (f" from {c.user_site}" if c.user_site != c.site else "")
            lines.append(
                f"| {markdown_code(c.generator, table=True)} | {markdown_text(c.op, table=True)} "
                f"| {markdown_text(where, table=True)} | {c.count_a} | "
                f"{c.count_b} | {'yes' if c.states_differ else ''} |"
            )
        if rank_diff.after_more:
            lines += ["", f"... and {rank_diff.after_more} more call sites."]
    return lines


def _md_event(event: Event) -> str:
    return f"{markdown_code(event_line(event))} {markdown_text(event_where(event))}"
