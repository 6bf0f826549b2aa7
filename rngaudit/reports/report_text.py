"""Rendering an audit report as text, Markdown or JSON, and as a short summary."""

from __future__ import annotations

import json
import re
import textwrap
from typing import TextIO

from rngaudit.audit_report import AuditReport
from rngaudit.findings import Finding
from rngaudit.report_files import finite
from rngaudit.reports.view import (
    Timeline,
    audit_name,
    audit_suffix,
    counts,
    divergence_note,
    event_sites,
    event_summary,
    finding_fields,
    loader_rows,
    report_line,
    timeline_title,
    timelines,
)
from rngaudit.schema import Event
from rngaudit.wording import ranks_phrase

WIDTH = 100
MAX_TIMELINE_ROWS = 60

_MIN_COLUMN = 28
_GAP = "  "
_PREFIX = 8  # ">> " marker, position right-aligned in 3, two spaces
_LABEL = 12  # "user code:" and friends, padded
_INDENT = "    "


def render_json(report: AuditReport) -> str:
    """The report as ``report.json`` holds it (``AuditReport.to_dict()``), indented; valid
    JSON (a NaN or an infinity is written as the string ``"NaN"``, ``"Infinity"``)."""
    return json.dumps(finite(report.to_dict()), indent=2, allow_nan=False) + "\n"


def write_json(report: AuditReport, out: TextIO, chunk: int = 1 << 16) -> None:
    """:func:`render_json` written to ``out`` in pieces: no copy of the whole text in memory."""
    pieces: list[str] = []
    size = 0
    encoder = json.JSONEncoder(indent=2, allow_nan=False)
    for piece in encoder.iterencode(finite(report.to_dict())):
        pieces.append(piece)
        size += len(piece)
        if size >= chunk:
            out.write("".join(pieces))
            pieces, size = [], 0
    out.write("".join(pieces) + "\n")


def render_text(report: AuditReport, *, width: int = WIDTH) -> str:
    """Verdict, findings, then each audit's pre-iteration draws side by side per rank."""
    head = f"rngaudit: {report.verdict.upper()} ({report_line(report)})"
    lines = wrap(head, width, subsequent_indent=_INDENT, break_on_hyphens=False)
    if len(report.audits) > 1:
        audits = "audits: " + ", ".join(audit_name(a) for a in report.audits)
        lines += wrap(audits, width, subsequent_indent=_INDENT, break_on_hyphens=False)
    lines.append(counts(report.findings).capitalize() + ".")
    for finding in report.findings:
        lines += ["", *_text_finding(report, finding, width)]
    loaders = _loader_lines(report)
    if loaders:
        lines += ["", "Loaders built in the audited windows:"]
        for line in loaders:
            lines += wrap(line, width, initial_indent="  ", subsequent_indent="      ")
    for timeline in timelines(report):
        lines += ["", *_text_timeline(timeline, width)]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_markdown(report: AuditReport) -> str:
    """The text report's content as Markdown: lists for findings, tables for timelines."""
    lines = [
        f"# rngaudit report: {report.verdict.upper()}",
        "",
        f"- Run: {markdown_code(report.run_id)}",
        f"- World size: {report.world_size}",
        f"- Mode: {markdown_text(report.mode)}",
    ]
    if len(report.audits) > 1:
        lines.append("- Audits: " + ", ".join(markdown_text(audit_name(a)) for a in report.audits))
    lines.append(f"- {counts(report.findings).capitalize()}")
    if report.findings:
        lines += ["", "## Findings"]
    for number, finding in enumerate(report.findings, 1):
        lines += ["", *_markdown_finding(report, finding, number)]
    loaders = _loader_lines(report)
    if loaders:
        lines += ["", "## Loaders", "", *(f"- {markdown_text(line)}" for line in loaders)]
    for timeline in timelines(report):
        lines += ["", *_markdown_timeline(timeline)]
    return "\n".join(lines) + "\n"


def render_summary(report: AuditReport, *, width: int = WIDTH) -> str:
    """A few lines for the end of ``rngaudit run``: the verdict, then each finding wrapped."""
    lines = [
        f"rngaudit: {report.verdict.upper()}, {counts(report.findings)}; {report_line(report)}"
    ]
    for finding in report.findings:
        lines += wrap(
            f"{finding.severity} {finding.kind}: {finding.message}",
            width,
            initial_indent="rngaudit:   ",
            subsequent_indent="rngaudit:     ",
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"


# Shared pieces -----------------------------------------------------------------------------


_LONG_WORD = 1024  # characters: a longer word is cut into line-sized pieces before wrapping


class _Wrapper(textwrap.TextWrapper):
    """``textwrap``'s wrapping, in time linear in the text: ``textwrap`` alone copies the rest
    of a word longer than a line at every line it fills (quadratic in the word's length)."""

    def _split_chunks(self, text: str) -> list[str]:
        chunks = super()._split_chunks(text)
        if all(len(chunk) <= _LONG_WORD for chunk in chunks):
            return chunks
        room = max(1, self.width - max(len(self.initial_indent), len(self.subsequent_indent)))
        pieces: list[str] = []
        for chunk in chunks:
            if len(chunk) <= _LONG_WORD:
                pieces.append(chunk)
            elif not chunk.strip():
                pieces.append(" ")  # a long run of spaces: one break
            else:
                pieces += [chunk[i : i + room] for i in range(0, len(chunk), room)]
        return pieces


def wrap(
    text: str,
    width: int = WIDTH,
    *,
    initial_indent: str = "",
    subsequent_indent: str = "",
    break_on_hyphens: bool = True,
) -> list[str]:
    """``textwrap.wrap(text, width, ...)``, in linear time whatever the length of a word."""
    wrapper = _Wrapper(
        width,
        initial_indent=initial_indent,
        subsequent_indent=subsequent_indent,
        break_on_hyphens=break_on_hyphens,
    )
    return wrapper.wrap(text)


def _loader_lines(report: AuditReport) -> list[str]:
    """One line per loader (audit, name): sampler, generator, and the early draw per rank."""
    lines = []
    for loader, draws in loader_rows(report):
        if draws:
            by_fp: dict[str, list[int]] = {}
            for rank, fp in sorted(draws.items()):
                by_fp.setdefault(fp, []).append(rank)
            states = "; ".join(f"{ranks_phrase(r)}: {fp}" for fp, r in by_fp.items())
            drew = f"drew before iteration (state {states})"
        else:
            drew = "no draw before iteration"
        lines.append(
            f"{loader.get('loader')} ({loader.get('num_workers', 0)} workers), "
            f"{loader.get('sampler') or 'no sampler'}, {loader.get('generator')}: {drew}"
        )
    return lines


def _fit(text: str, width: int, *, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    return "..." + text[-(width - 3) :] if keep_end else text[: width - 3] + "..."


# Timelines ---------------------------------------------------------------------------------


def _visible_rows(timeline: Timeline, max_rows: int) -> tuple[int, int]:
    total = len(timeline.rows)
    if total <= max_rows:
        return 0, total
    anchor = timeline.divergence or 0
    start = max(0, min(anchor - 5, total - max_rows))
    return start, start + max_rows


# Text --------------------------------------------------------------------------------------


def _text_finding(report: AuditReport, finding: Finding, width: int) -> list[str]:
    lines = [f"[{finding.severity}] {finding.kind}{audit_suffix(report, finding.audit)}"]
    lines += wrap(finding.message, width, initial_indent=_INDENT, subsequent_indent=_INDENT)
    hanging = _INDENT + " " * _LABEL
    for label, value in finding_fields(finding):
        lines += wrap(
            value,
            width,
            initial_indent=_INDENT + f"{label}:".ljust(_LABEL),
            subsequent_indent=hanging,
            break_on_hyphens=False,
        )
    return lines


def _text_timeline(timeline: Timeline, width: int) -> list[str]:
    per_block = max(1, (width - _PREFIX + len(_GAP)) // (_MIN_COLUMN + len(_GAP)))
    columns = min(per_block, len(timeline.ranks))
    column_width = (width - _PREFIX - len(_GAP) * (columns - 1)) // columns
    start, stop = _visible_rows(timeline, MAX_TIMELINE_ROWS)
    title = f"{timeline_title(timeline)} (one column per rank, aligned by position):"
    lines = wrap(title, width)
    for first in range(0, len(timeline.ranks), columns):
        block = range(first, min(first + columns, len(timeline.ranks)))
        header = [f"rank {timeline.ranks[j]}" for j in block]
        if lines[-1]:
            lines.append("")
        lines.append(_text_row("", "#", header, column_width))
        lines.append(_text_row("", "", ["-" * column_width for _ in block], column_width))
        if start:
            lines.append(" " * _PREFIX + f"... {start} earlier positions not shown")
        for i in range(start, stop):
            cells = [_text_cell(timeline.rows[i][j], column_width) for j in block]
            marker = ">>" if i == timeline.divergence else ""
            position = str(i)
            for k in range(max(len(cell) for cell in cells)):
                texts = [cell[k] if k < len(cell) else "" for cell in cells]
                lines.append(_text_row(marker, position, texts, column_width))
                marker = position = ""
            lines.append("")
        if stop < len(timeline.rows):
            lines.append(
                " " * _PREFIX + f"... {len(timeline.rows) - stop} later positions not shown"
            )
    if lines[-1]:
        lines.append("")
    note = divergence_note(timeline)
    marker = ">> " if timeline.divergence is not None else ""
    lines += wrap(marker + note, width, subsequent_indent=" " * len(marker))
    return lines


def _text_row(marker: str, position: str, texts: list[str], column_width: int) -> str:
    head = f"{marker:<2} {position:>3}  "
    return head + _GAP.join(text.ljust(column_width) for text in texts)


def _text_cell(event: Event | None, column_width: int) -> list[str]:
    if event is None:
        return ["(no event)"]
    lines = [_fit(str(event.get("generator") or "?"), column_width)]
    lines.append(_fit(event_summary(event), column_width))
    lines += [_fit(site, column_width, keep_end=True) for site in event_sites(event)]
    return lines


# Markdown ----------------------------------------------------------------------------------


def _markdown_finding(report: AuditReport, finding: Finding, number: int) -> list[str]:
    title = f"### {number}. {markdown_text(finding.severity)}: {markdown_code(finding.kind)}"
    suffix = audit_suffix(report, finding.audit).strip()
    title += f" {markdown_text(suffix)}" if suffix else ""
    lines = [title, "", markdown_text(finding.message, lines=True), ""]
    code = {"generator", "drawn at", "user code"}
    for label, value in finding_fields(finding):
        shown = markdown_code(value) if label in code else markdown_text(value)
        lines.append(f"- **{label.capitalize()}:** {shown}")
    return lines


def _markdown_timeline(timeline: Timeline) -> list[str]:
    lines = [f"## {markdown_text(timeline_title(timeline))}", ""]
    lines.append("| # | " + " | ".join(f"rank {rank}" for rank in timeline.ranks) + " |")
    lines.append("|---:|" + "---|" * len(timeline.ranks))
    start, stop = _visible_rows(timeline, MAX_TIMELINE_ROWS)
    for i in range(start, stop):
        position = f"**>> {i}**" if i == timeline.divergence else str(i)
        cells = [_markdown_cell(event) for event in timeline.rows[i]]
        lines.append(f"| {position} | " + " | ".join(cells) + " |")
    hidden = len(timeline.rows) - (stop - start)
    lines.append("")
    if hidden:
        lines += [f"{hidden} positions not shown (earlier: {start}).", ""]
    note = markdown_text(divergence_note(timeline))
    lines.append(f"**>>** {note}" if timeline.divergence is not None else note)
    return lines


def _markdown_cell(event: Event | None) -> str:
    if event is None:
        return "(no event)"
    parts = [
        markdown_code(str(event.get("generator") or "?"), table=True),
        markdown_text(event_summary(event), table=True),
        *(markdown_text(site, table=True) for site in event_sites(event)),
    ]
    return "<br>".join(parts)


# What CommonMark, GitHub's extensions (tables, strikethrough, math) and the raw HTML GitHub
# allows could read as markup in text taken from a report: backslash-escaped, or an entity.
_MD_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "\\": "\\\\",
        "`": "\\`",
        "*": "\\*",
        "[": "\\[",
        "]": "\\]",
        "~": "\\~",
        "|": "\\|",
        "$": "\\$",
    }
)
_MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # inside a word it is inert
# Words GitHub links however they are escaped (its autolinks, mentions and issue references
# are found in the rendered text): shown as code spans, where nothing is linked.
_MD_LINKED = re.compile(r"://|www\.|@|mailto:|xmpp:|(?<![A-Za-z0-9_])#[0-9]", re.IGNORECASE)
_MD_LIST_NUMBER = re.compile(r"([0-9]{1,9})([.)])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SPACES = re.compile(r"(\s+)")


def markdown_text(text: str, *, table: bool = False, lines: bool = False) -> str:
    """Text that Markdown shows as written, nothing of it live: ``<module>`` becomes
    ``&lt;module&gt;``, ``__iter__`` does not turn bold, no HTML, link, image, table cell or
    block starts in it, and a word GitHub would link (a URL, ``@name``, ``#12``) is a code
    span. One line, unless ``lines`` (a paragraph: its line breaks kept, blank lines
    dropped); ``table``: it stands in a table cell."""
    parts = [part.strip() for part in _LINE_BREAK.split(text)]
    if not lines:
        return _md_line(" ".join(part for part in parts if part), table)
    return "\n".join(_md_line(part, table) for part in parts if part)


def _md_line(line: str, table: bool) -> str:
    words = _SPACES.split(line)  # linear in the text, whatever its words' lengths
    for i in range(0, len(words), 2):
        word = words[i]
        if _MD_LINKED.search(word):
            words[i] = markdown_code(word, table=table)
        elif word:
            words[i] = _MD_UNDERSCORE.sub(r"\_", word.translate(_MD_ESCAPES))
    text = "".join(words)
    if text[:1] in ("#", "-", "+", "="):  # not a heading, a list item or a heading's underline
        return "\\" + text
    number = _MD_LIST_NUMBER.match(text)
    if number:  # "1." does not start an ordered list
        return f"{number[1]}\\{number[2]}{text[number.end() :]}"
    return text


def markdown_code(text: str, *, table: bool = False) -> str:
    """An inline code span holding ``text`` as written, whatever backticks it contains (one
    line; ``table``: its pipes escaped, as a table cell needs)."""
    text = _LINE_BREAK.sub(" ", text)
    if table:
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
