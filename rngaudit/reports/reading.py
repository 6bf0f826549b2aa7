"""Reading a report directory: report.json, or the per-rank files merged."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple, cast

from rngaudit import report_files, schema
from rngaudit.audit_report import SCHEMA_VERSION, AuditReport
from rngaudit.errors import ReportError
from rngaudit.findings import RANK_MISSING, SEVERITIES, Finding, worst
from rngaudit.report_files import MERGED_FILE, RANK_FILE
from rngaudit.wording import format_ranks

_RANK_PREFIX, _RANK_SUFFIX = RANK_FILE.split("{rank}")

MAX_DEPTH = 32  # report files nest 6 levels; deeper input is not a report (nor safe to walk)
MAX_WORLD_SIZE = 1 << 20  # ranks; a larger world_size is a corrupt or hostile file

_Shape = tuple[type, tuple[str, ...]]
_JSONTypes = tuple[type, ...]


def _as_declared(typed_dict: type) -> _Shape:
    """A shape whose required fields are the TypedDict's required keys (those of a base class
    that is not ``total=False``)."""
    required: frozenset[str] = getattr(typed_dict, "__required_keys__", frozenset())
    return typed_dict, tuple(name for name in typing.get_type_hints(typed_dict) if name in required)


# What each shape needs: its TypedDict in rngaudit.schema (the types of its fields) and the
# fields a file must have. Every other field may be absent or null; the type of every field
# present is checked against the TypedDict's annotation. The records' fields are all written
# by the producer, but a file needs only ``rank`` and ``events`` of them (see schema.py).
_REPORT = _as_declared(schema.ReportDict)
_RANK_FILE = _as_declared(schema.RankFileDict)
_FINDING = _as_declared(schema.FindingDict)
_AUDIT = _as_declared(schema.AuditDict)
_RECORD = (schema.RankRecord, ("rank", "events"))
_EVENT = (schema.Event, ())
_SITE = (schema.CallSiteDict, ())
_SAMPLER = (schema.SamplerDict, ())
_LOADER = (schema.Loader, ())


def _json_types(annotation: Any) -> _JSONTypes:
    """The JSON types a field's annotation allows: ``list[Event] | None`` -> ``(list,)``
    (null is decided by :func:`_check_fields`)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(
            t for arg in typing.get_args(annotation) if arg is not type(None)
            for t in _json_types(arg)
        )  # fmt: skip
    if typing.is_typeddict(annotation):
        return (dict,)
    origin = typing.get_origin(annotation)
    return (origin if origin is not None else annotation,)


@functools.cache
def _field_types(shape: type) -> dict[str, _JSONTypes]:
    """Field name -> allowed JSON types, from the TypedDict ``shape``."""
    return {
        name: _json_types(annotation) for name, annotation in typing.get_type_hints(shape).items()
    }


class _RankFile(NamedTuple):
    """One validated ``rank-<R>.json``."""

    rank: int
    path: Path
    run_id: str
    world_size: int
    mode: str
    findings: list[Finding]
    audits: list[schema.AuditDict]
    record: schema.RankRecord


_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    bool: "a boolean",
}


def find_report_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The report files in ``directory``: ``report.json`` first, then rank files by rank."""
    root = Path(directory)
    found = [root / MERGED_FILE] if (root / MERGED_FILE).is_file() else []
    return found + [path for _, path in _rank_files(root)]


def load_report_dir(path: str | os.PathLike[str]) -> AuditReport:
    """Load the report in ``path``: ``report.json`` if present, else the merged rank files.

    Raises :class:`~rngaudit.errors.ReportError`, with a one-line message, for any input
    that cannot be used.
    """
    report_files.flush()  # files this process is still writing in the background
    directory = Path(path)
    if not directory.exists():
        raise ReportError(f"report directory not found: {directory}")
    if not directory.is_dir():
        raise ReportError(f"not a directory: {directory}")
    rank_files = [_load_rank_file(path, rank) for rank, path in _rank_files(directory)]
    report_path = directory / MERGED_FILE
    if report_path.is_file():
        report = _load_report_file(report_path)
        for rank_file in rank_files:
            if rank_file.run_id != report.run_id:
                raise ReportError(
                    f"{report_path} is from run {report.run_id!r} but {rank_file.path} is from "
                    f"run {rank_file.run_id!r}: remove the stale files or use separate directories"
                )
        _add_rank_local_findings(report, rank_files)
        _fill_stubs(report, rank_files)
        return report
    if not rank_files:
        raise ReportError(
            f"no report files in {directory} "
            f"(expected {MERGED_FILE} or {RANK_FILE.format(rank='<R>')})"
        )
    return _merge(rank_files)


ATTEMPT_PREFIX = "attempt-"  # torchrun restart attempt N > 0 writes in DIR/attempt-N/


def attempt_dirs(path: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The torchrun restart attempts whose report files ``path`` holds, in order: attempt 0
    at its top level, attempt N in ``attempt-N/`` (config.attempt_dir)."""
    directory = Path(path)
    found = [(0, directory)] if find_report_files(directory) else []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    for entry in entries:
        number = entry.name[len(ATTEMPT_PREFIX) :]
        if not (entry.name.startswith(ATTEMPT_PREFIX) and number.isdigit() and int(number) > 0):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and find_report_files(entry.path):
                found.append((int(number), Path(entry.path)))
    return sorted(found)


def load_run(path: str | os.PathLike[str], attempt: int | None = None) -> AuditReport:
    """The report of a run in ``path``: one attempt's (``attempt``), or, when the directory
    holds several torchrun restart attempts, all of them in one report whose verdict is the
    worst, each finding, audit and event named by the attempt it came from."""
    attempts = attempt_dirs(path)
    if attempt is not None:
        chosen = [where for number, where in attempts if number == attempt]
        if not chosen:
            held = ", ".join(str(n) for n, _ in attempts) or "none"
            raise ReportError(f"no report of attempt {attempt} in {path} (attempts: {held})")
        return load_report_dir(chosen[0])
    if len(attempts) <= 1:
        return load_report_dir(attempts[0][1] if attempts else path)
    return combine_attempts([(number, load_report_dir(where)) for number, where in attempts])


def combine_attempts(reports: list[tuple[int, AuditReport]]) -> AuditReport:
    """One report of several attempts: their audits renumbered one after the other (labels
    prefixed ``attempt N:``), their findings (``details["attempt"]``, the message prefixed),
    each rank's events and loaders of every attempt in one record (its pid, host and states
    the last attempt's). The run id and mode are the last attempt's."""
    combined = AuditReport(
        world_size=max(r.world_size for _, r in reports),
        run_id=reports[-1][1].run_id,
        mode=reports[-1][1].mode,
    )
    records: dict[int, schema.RankRecord] = {}
    offset = 0
    for number, report in reports:
        shift = offset
        for audit in report.audits:
            index = int(audit.get("index", 0)) + shift
            label = f"attempt {number}: {audit.get('label') or ''}".rstrip(": ")
            combined.audits.append({**audit, "index": index, "label": label})
            offset = max(offset, index + 1)
        for finding in report.findings:
            copy = Finding.from_dict(finding.to_dict())
            copy.audit += shift
            copy.details["attempt"] = number
            copy.message = f"[attempt {number}] {copy.message}"
            combined.findings.append(copy)
        for record in report.ranks:
            rank = int(record["rank"])
            events = [
                cast(schema.Event, {**e, "audit": int(e.get("audit", 0)) + shift})
                for e in record["events"]
            ]
            loaders = [
                cast(schema.Loader, {**ld, "audit": int(ld.get("audit", 0)) + shift})
                for ld in record.get("loaders") or []
            ]
            held = records.get(rank)
            if held is not None:
                events = held["events"] + events
                loaders = list(held.get("loaders") or []) + loaders
            records[rank] = {**record, "events": events, "loaders": loaders}
    combined.ranks = [records[r] for r in sorted(records)]
    return combined


def _fill_stubs(report: AuditReport, rank_files: list[_RankFile]) -> None:
    """Above 64 ranks rank 0 keeps only one record per signature group; the ranks' own files
    hold the others (``same_as`` entries of ``report.json`` are replaced by them)."""
    own = {rank_file.rank: rank_file.record for rank_file in rank_files}
    report.ranks = [
        own.get(int(r["rank"]), r) if r.get("same_as") is not None else r for r in report.ranks
    ]


def _add_rank_local_findings(report: AuditReport, rank_files: list[_RankFile]) -> None:
    """Findings only another rank knows (its DataLoader worker checks, made after rank 0
    wrote ``report.json``) are carried over from that rank's file."""
    seen = {json.dumps(f.to_dict(), sort_keys=True) for f in report.findings}
    for rank_file in rank_files:
        for finding in rank_file.findings:
            key = json.dumps(finding.to_dict(), sort_keys=True)
            if key not in seen:
                seen.add(key)
                report.findings.append(finding)


def _rank_files(directory: Path) -> list[tuple[int, Path]]:
    """The rank files in ``directory`` by rank; two names for one rank (``rank-0.json`` and
    ``rank-00.json``) are refused: which one the rank wrote cannot be told."""
    found: dict[int, Path] = {}
    for path in sorted(directory.glob(RANK_FILE.format(rank="*"))):
        rank = path.name[len(_RANK_PREFIX) : len(path.name) - len(_RANK_SUFFIX)]
        if not (rank.isascii() and rank.isdigit() and path.is_file()):
            continue
        number = int(rank)  # a file name is short: no huge integer
        if number in found:
            raise ReportError(
                f"{found[number]} and {path.name} in {directory} are both rank {number}: "
                "remove the copy"
            )
        found[number] = path
    return sorted(found.items())


def _load_report_file(path: Path) -> AuditReport:
    data = _read_object(path, _REPORT)
    world_size = _check_world_size(data["world_size"], path)
    ranks = [_check_record(record, f"{path}: ranks[{i}]") for i, record in enumerate(data["ranks"])]
    seen: set[int] = set()
    for i, record in enumerate(ranks):
        if not 0 <= record["rank"] < world_size or record["rank"] in seen:
            raise ReportError(
                f"{path}: ranks[{i}] is rank {record['rank']}, which is "
                + ("a repeat" if record["rank"] in seen else f"outside world_size {world_size}")
            )
        seen.add(record["rank"])
    return AuditReport(
        findings=_findings(data["findings"], path),
        ranks=ranks,
        world_size=data["world_size"],
        run_id=data["run_id"],
        mode=data.get("mode") or "raise",
        audits=_audits(data.get("audits") or [], path),
        schema_version=SCHEMA_VERSION,
    )


def _load_rank_file(path: Path, rank: int) -> _RankFile:
    data = _read_object(path, _RANK_FILE)
    _check_world_size(data["world_size"], path)
    if data["rank"] != rank:
        raise ReportError(f"{path}: field 'rank' is {data['rank']}, but the file name says {rank}")
    if not 0 <= rank < data["world_size"]:
        raise ReportError(f"{path}: rank {rank} is outside world_size {data['world_size']}")
    record = _check_record(data["record"], f"{path}: record")
    if record["rank"] != rank:
        raise ReportError(f"{path}: record.rank is {record['rank']}, but the file is rank {rank}")
    return _RankFile(
        rank=rank,
        path=path,
        run_id=data["run_id"],
        world_size=data["world_size"],
        mode=data.get("mode") or "raise",
        findings=_findings(data["findings"], path),
        audits=_audits(data.get("audits") or [], path),
        record=record,
    )


def _merge(rank_files: list[_RankFile]) -> AuditReport:
    """One report from rank files (sorted by rank): findings deduplicated, gaps noted."""
    runs: dict[str, list[str]] = {}
    for rank_file in rank_files:
        runs.setdefault(rank_file.run_id, []).append(rank_file.path.name)
    if len(runs) > 1:
        listed = "; ".join(f"run {run!r} ({', '.join(names)})" for run, names in runs.items())
        raise ReportError(
            f"rank files from different runs in {rank_files[0].path.parent}: {listed}"
        )
    sizes = {rank_file.world_size: rank_file.path.name for rank_file in rank_files}
    if len(sizes) > 1:
        listed = ", ".join(f"{size} in {name}" for size, name in sorted(sizes.items()))
        raise ReportError(f"rank files disagree on world_size: {listed}")
    first = rank_files[0]

    findings: list[Finding] = []
    seen: set[str] = set()
    audits: dict[int, schema.AuditDict] = {}
    for rank_file in rank_files:
        for finding in rank_file.findings:
            key = json.dumps(finding.to_dict(), sort_keys=True)
            if key not in seen:
                seen.add(key)
                findings.append(finding)
        for audit in rank_file.audits:
            merged = audits.setdefault(audit["index"], audit.copy())
            merged["verdict"] = worst(merged.get("verdict"), audit.get("verdict"))

    present = {rank_file.rank for rank_file in rank_files}
    noted = {r for f in findings if f.kind == RANK_MISSING for r in f.ranks}
    missing = [r for r in range(first.world_size) if r not in present and r not in noted]
    if missing:
        findings.append(_rank_missing_finding(missing, first.world_size))

    return AuditReport(
        findings=findings,
        ranks=[rank_file.record for rank_file in rank_files],
        world_size=first.world_size,
        run_id=first.run_id,
        mode=first.mode,
        audits=[audits[index] for index in sorted(audits)],
        schema_version=SCHEMA_VERSION,
    )


def _rank_missing_finding(missing: list[int], world_size: int) -> Finding:
    names = ", ".join(f"rank-{r}.json" for r in missing[:3])
    if len(missing) > 3:
        names += f" and {len(missing) - 3} more are"
    else:
        names += " is" if len(missing) == 1 else " are"
    which = "rank" if len(missing) == 1 else "ranks"
    return Finding(
        kind=RANK_MISSING,
        severity="error",
        message=(
            f"No report file from {which} {format_ranks(missing)} of {world_size} "
            f"({names} missing): the audit cannot compare what it did not see."
        ),
        ranks=missing,
        remedy=(
            "Check that rank's log for an earlier failure; every rank must run the audit "
            "and write to the same RNGAUDIT_REPORT_DIR (a shared file system across nodes)."
        ),
    )


def _read_object(path: Path, shape: _Shape) -> dict[str, Any]:
    """The JSON object in ``path``, with a supported schema_version and the fields of
    ``shape``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not text.strip():
        raise ReportError(f"{path}: file is empty")
    try:
        data = json.loads(text, parse_constant=_not_a_number, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ReportError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ReportError(f"{path}: unusable JSON: {' '.join(str(exc).split())[:80]}") from None
    del text
    _check_depth(data, path)
    if not isinstance(data, dict):
        raise ReportError(f"{path}: top level is {_json_type(data)}, expected a JSON object")
    if "schema_version" not in data:
        raise ReportError(f"{path}: missing required field 'schema_version'")
    version = data["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ReportError(
            f"{path}: unsupported schema_version {json.dumps(version)} "
            f"(this rngaudit reads schema_version {SCHEMA_VERSION})"
        )
    _check_fields(data, shape, str(path))
    return data


def _not_a_number(literal: str) -> str:
    """``NaN``, ``Infinity`` and ``-Infinity`` (not JSON, but Python writes them) are kept as
    the strings they spell: what is read back out is then valid JSON."""
    return literal


def _finite_float(literal: str) -> float | str:
    """A number too large for a float (``1e400``) is kept as its text, not as infinity."""
    value = float(literal)
    return value if math.isfinite(value) else literal


def _check_depth(data: Any, path: Path) -> None:
    """Refuse JSON nested deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ReportError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))


def _check_world_size(world_size: int, path: Path) -> int:
    shown = world_size if abs(world_size) < 10**12 else f"of {len(str(abs(world_size)))} digits"
    if world_size < 1:
        raise ReportError(f"{path}: world_size must be at least 1, not {shown}")
    if world_size > MAX_WORLD_SIZE:
        raise ReportError(f"{path}: world_size {shown} is above the maximum, {MAX_WORLD_SIZE}")
    return world_size


def _check_fields(data: dict[str, Any], shape: _Shape, where: str) -> None:
    typed_dict, required = shape
    missing = [name for name in required if name not in data]
    if missing:
        fields = ", ".join(repr(name) for name in missing)
        plural = "s" if len(missing) > 1 else ""
        raise ReportError(f"{where}: missing required field{plural} {fields}")
    types = _field_types(typed_dict)
    for name in [*required, *(name for name in types if name not in required)]:
        value = data.get(name)
        if value is None and name not in required:
            continue
        if not any(_is_type(value, expected) for expected in types[name]):
            expected_names = " or ".join(_TYPE_NAMES[t] for t in types[name])
            raise ReportError(
                f"{where}: field {name!r} is {_json_type(value)}, expected {expected_names}"
            )


def _is_type(value: Any, expected: type) -> bool:
    if expected in (int, bool):
        return type(value) is expected
    return isinstance(value, expected)


def _check_record(record: Any, where: str) -> schema.RankRecord:
    if not isinstance(record, dict):
        raise ReportError(f"{where} is {_json_type(record)}, expected an object")
    _check_fields(record, _RECORD, where)
    for i, event in enumerate(record["events"]):
        if not isinstance(event, dict):
            raise ReportError(f"{where}.events[{i}] is {_json_type(event)}, expected an object")
        _check_fields(event, _EVENT, f"{where}.events[{i}]")
        _check_sites(event, f"{where}.events[{i}]")
        if event.get("sampler") is not None:
            _check_fields(event["sampler"], _SAMPLER, f"{where}.events[{i}].sampler")
    for i, loader in enumerate(record.get("loaders") or []):
        if not isinstance(loader, dict):
            raise ReportError(f"{where}.loaders[{i}] is {_json_type(loader)}, expected an object")
        _check_fields(loader, _LOADER, f"{where}.loaders[{i}]")
    return cast(schema.RankRecord, record)


def _check_sites(data: dict[str, Any], where: str) -> None:
    """``call_site``, ``user_call_site`` and ``chain`` entries: file, line, function."""
    sites = [(name, data.get(name)) for name in ("call_site", "user_call_site")]
    sites += [(f"chain[{i}]", site) for i, site in enumerate(data.get("chain") or [])]
    for name, site in sites:
        if site is None:
            continue
        if not isinstance(site, dict):
            raise ReportError(f"{where}.{name} is {_json_type(site)}, expected an object")
        _check_fields(site, _SITE, f"{where}.{name}")


def _findings(items: list[Any], path: Path) -> list[Finding]:
    findings = []
    for i, item in enumerate(items):
        where = f"{path}: findings[{i}]"
        if not isinstance(item, dict):
            raise ReportError(f"{where} is {_json_type(item)}, expected an object")
        _check_fields(item, _FINDING, where)
        if item["severity"] not in SEVERITIES:
            raise ReportError(
                f"{where}: unknown severity {item['severity']!r} "
                f"(expected one of {', '.join(SEVERITIES)})"
            )
        if not all(type(r) is int for r in item.get("ranks") or []):
            raise ReportError(f"{where}: field 'ranks' must hold integers")
        _check_sites({k: item.get(k) for k in ("call_site", "user_call_site")}, where)
        present = {k: v for k, v in item.items() if v is not None}
        findings.append(Finding.from_dict(cast(schema.FindingDict, present)))
    return findings


def _audits(items: list[Any], path: Path) -> list[schema.AuditDict]:
    for i, item in enumerate(items):
        where = f"{path}: audits[{i}]"
        if not isinstance(item, dict):
            raise ReportError(f"{where} is {_json_type(item)}, expected an object")
        _check_fields(item, _AUDIT, where)
    return cast(list[schema.AuditDict], list(items))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
