"""Tests for rngaudit.reports.reading: report.json read, rank files merged, bad input refused."""

from __future__ import annotations

import json
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
from samples import AUDIT, DATA

from rngaudit import schema
from rngaudit.errors import ReportError
from rngaudit.findings import RANK_MISSING
from rngaudit.reports.reading import find_report_files, load_report_dir


def rank_doc(
    rank: int, *, run_id: str = "run-a", world_size: int = 2, **extra: Any
) -> dict[str, Any]:
    """A minimal valid ``rank-<R>.json``."""
    doc: dict[str, Any] = {
        "schema_version": 1,
        "run_id": run_id,
        "world_size": world_size,
        "rank": rank,
        "mode": "raise",
        "verdict": "ok",
        "audits": [{"index": 0, "label": "epoch 0", "verdict": "ok"}],
        "findings": [],
        "record": {"rank": rank, "pid": 100 + rank, "host": "h", "events": [], "states": {}},
    }
    doc.update(extra)
    return doc


def write(directory: Path, name: str, content: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    text = content if isinstance(content, str) else json.dumps(content, indent=2)
    path.write_text(text, encoding="utf-8")
    return path


def copy_rank_files(sample: str, target: Path, ranks: tuple[int, ...] = (0, 1)) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for rank in reversed(ranks):  # creation order must not matter
        shutil.copy(DATA / sample / f"rank-{rank}.json", target / f"rank-{rank}.json")
    return target


def load_error(path: Path) -> str:
    with pytest.raises(ReportError) as info:
        load_report_dir(path)
    message = str(info.value)
    assert "\n" not in message
    return message


# Reading -----------------------------------------------------------------------------------


def test_loads_report_json() -> None:
    report = load_report_dir(DATA / "divergent")
    assert report.run_id == "sample-divergent"
    assert report.world_size == 2
    assert report.verdict == "error"
    assert [f.kind for f in report.findings] == [
        "sampler-draw-divergence",
        "consumption-mismatch",
        "state-divergence",
    ]
    assert [r["rank"] for r in report.ranks] == [0, 1]
    label = f"audit at sample_run.py:{AUDIT} in main"
    assert report.audits == [{"index": 0, "label": label, "verdict": "error"}]


def test_loads_clean_report() -> None:
    report = load_report_dir(DATA / "clean")
    assert report.verdict == "ok"
    assert report.findings == []


def test_accepts_str_path() -> None:
    assert load_report_dir(str(DATA / "clean")).verdict == "ok"


@pytest.mark.parametrize("sample", ["divergent", "clean"])
def test_merging_rank_files_gives_the_merged_report(sample: str, tmp_path: Path) -> None:
    merged = load_report_dir(copy_rank_files(sample, tmp_path))
    expected = json.loads((DATA / sample / "report.json").read_text())
    assert merged.to_dict() == expected


def test_merge_deduplicates_findings(tmp_path: Path) -> None:
    both = [json.loads((DATA / "divergent" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert both[0]["findings"] == both[1]["findings"] != []  # each rank wrote every finding
    report = load_report_dir(copy_rank_files("divergent", tmp_path))
    assert len(report.findings) == len(both[0]["findings"]) == 3


def test_merge_keeps_findings_seen_by_one_rank_only(tmp_path: Path) -> None:
    only_1 = {"kind": "state-divergence", "severity": "warning", "message": "m", "ranks": [1]}
    write(tmp_path, "rank-0.json", rank_doc(0))
    write(tmp_path, "rank-1.json", rank_doc(1, findings=[only_1]))
    report = load_report_dir(tmp_path)
    assert [f.kind for f in report.findings] == ["state-divergence"]
    assert report.verdict == "warning"


def test_merge_takes_the_worst_audit_verdict(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0))
    bad = [{"index": 0, "label": "epoch 0", "verdict": "error"}, {"index": 1, "verdict": "ok"}]
    write(tmp_path, "rank-1.json", rank_doc(1, audits=bad))
    report = load_report_dir(tmp_path)
    assert report.audits == [
        {"index": 0, "label": "epoch 0", "verdict": "error"},
        {"index": 1, "verdict": "ok"},
    ]


def test_merge_notes_a_missing_rank(tmp_path: Path) -> None:
    copy_rank_files("clean", tmp_path, ranks=(0,))
    report = load_report_dir(tmp_path)
    assert report.verdict == "error"
    (finding,) = report.findings
    assert finding.kind == RANK_MISSING
    assert finding.severity == "error"
    assert finding.ranks == [1]
    assert "rank-1.json" in finding.message
    assert [r["rank"] for r in report.ranks] == [0]


def test_merge_notes_several_missing_ranks_once(tmp_path: Path) -> None:
    write(tmp_path, "rank-1.json", rank_doc(1, world_size=4))
    report = load_report_dir(tmp_path)
    assert [(f.kind, f.ranks) for f in report.findings] == [(RANK_MISSING, [0, 2, 3])]


def test_merge_does_not_repeat_a_noted_missing_rank(tmp_path: Path) -> None:
    noted = {"kind": RANK_MISSING, "severity": "error", "message": "rank 2 timed out", "ranks": [2]}
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=3, findings=[noted]))
    write(tmp_path, "rank-1.json", rank_doc(1, world_size=3, findings=[noted]))
    report = load_report_dir(tmp_path)
    assert [f.message for f in report.findings] == ["rank 2 timed out"]


def test_report_json_wins_over_rank_files(tmp_path: Path) -> None:
    shutil.copytree(DATA / "divergent", tmp_path / "r")
    (tmp_path / "r" / "rank-1.json").unlink()
    report = load_report_dir(tmp_path / "r")
    assert not any(f.kind == RANK_MISSING for f in report.findings)
    assert len(report.ranks) == 2


def test_ignores_other_files(tmp_path: Path) -> None:
    copy_rank_files("clean", tmp_path)
    write(tmp_path, "rank-x.json", "not json")
    write(tmp_path, ".rank-0.json.abc.tmp", "partial")
    write(tmp_path, "notes.txt", "hello")
    assert load_report_dir(tmp_path).verdict == "ok"


def test_find_report_files_lists_report_then_ranks(tmp_path: Path) -> None:
    for name in ("rank-10.json", "rank-2.json", "report.json", "other.json"):
        write(tmp_path, name, "{}")
    assert [p.name for p in find_report_files(tmp_path)] == [
        "report.json",
        "rank-2.json",
        "rank-10.json",
    ]


# Unusable input ----------------------------------------------------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    assert "report directory not found" in load_error(tmp_path / "nope")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    path = write(tmp_path, "report.json", "{}")
    assert "not a directory" in load_error(path)


def test_directory_without_report_files(tmp_path: Path) -> None:
    write(tmp_path, "notes.txt", "x")
    message = load_error(tmp_path)
    assert "no report files" in message
    assert "report.json" in message and "rank-<R>.json" in message


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "report.json", '{\n  "schema_version": 1,\n  "run_id": "x"\n  "oops"\n}')
    message = load_error(tmp_path)
    assert str(tmp_path / "report.json") in message
    assert "invalid JSON at line 4" in message


def test_malformed_rank_file_names_it(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0))
    write(tmp_path, "rank-1.json", '{"schema_version": 1,')
    message = load_error(tmp_path)
    assert "rank-1.json" in message and "invalid JSON at line 1" in message


def test_empty_file(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", "  \n")
    assert "rank-0.json: file is empty" in load_error(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_bytes(b'{"run_id": "\xff"}')
    assert "not UTF-8" in load_error(tmp_path)


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unknown_schema_version(tmp_path: Path, version: Any) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, schema_version=version))
    message = load_error(tmp_path)
    assert f"unsupported schema_version {json.dumps(version)}" in message
    assert "reads schema_version 1" in message


def test_missing_schema_version(tmp_path: Path) -> None:
    doc = rank_doc(0)
    del doc["schema_version"]
    write(tmp_path, "rank-0.json", doc)
    assert "missing required field 'schema_version'" in load_error(tmp_path)


@pytest.mark.parametrize(
    ("content", "kind"), [("[1, 2]", "an array"), ('"x"', "a string"), ("3", "a number")]
)
def test_top_level_not_an_object(tmp_path: Path, content: str, kind: str) -> None:
    write(tmp_path, "report.json", content)
    assert f"top level is {kind}, expected a JSON object" in load_error(tmp_path)


def test_report_json_missing_fields(tmp_path: Path) -> None:
    write(tmp_path, "report.json", {"schema_version": 1, "run_id": "x", "findings": []})
    message = load_error(tmp_path)
    assert "missing required fields 'world_size', 'ranks'" in message


def test_fields_the_schema_marks_not_required_may_be_absent(tmp_path: Path) -> None:
    """Fields of total=False classes in records (Report, Finding, Audit) may be absent."""
    finding = {"kind": "k", "severity": "info", "message": "m"}
    doc = {"schema_version": 1, "run_id": "x", "world_size": 1, "findings": [finding]}
    write(tmp_path, "report.json", {**doc, "ranks": [{"rank": 0, "events": []}]})
    report = load_report_dir(tmp_path)
    assert (report.mode, report.audits, report.verdict) == ("raise", [], "ok")
    assert (report.findings[0].ranks, report.findings[0].audit) == ([], 0)


def test_rank_file_missing_fields(tmp_path: Path) -> None:
    doc = rank_doc(0)
    del doc["record"]
    write(tmp_path, "rank-0.json", doc)
    assert "rank-0.json: missing required field 'record'" in load_error(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("world_size", "2", "field 'world_size' is a string, expected an integer"),
        ("world_size", True, "field 'world_size' is a boolean, expected an integer"),
        ("findings", {}, "field 'findings' is an object, expected an array"),
        ("run_id", 7, "field 'run_id' is a number, expected a string"),
        ("mode", [], "field 'mode' is an array, expected a string"),
    ],
)
def test_field_of_wrong_type(tmp_path: Path, field: str, value: Any, expected: str) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, **{field: value}))
    assert expected in load_error(tmp_path)


def test_world_size_below_one(tmp_path: Path) -> None:
    doc = json.loads((DATA / "clean" / "report.json").read_text())
    write(tmp_path, "report.json", {**doc, "world_size": 0})
    assert "world_size must be at least 1" in load_error(tmp_path)


@pytest.mark.parametrize(
    ("finding", "expected"),
    [
        ("boom", "findings[0] is a string, expected an object"),
        ({"kind": "k", "severity": "error"}, "findings[0]: missing required field 'message'"),
        ({"kind": "k", "severity": "fatal", "message": "m"}, "unknown severity 'fatal'"),
        ({"kind": "k", "severity": "error", "message": "m", "ranks": ["0"]}, "integers"),
        (
            {"kind": "k", "severity": "error", "message": "m", "call_site": "x.py:1"},
            "field 'call_site' is a string, expected an object",
        ),
    ],
)
def test_malformed_finding(tmp_path: Path, finding: Any, expected: str) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, findings=[finding]))
    assert expected in load_error(tmp_path)


def test_null_optional_finding_fields_are_accepted(tmp_path: Path) -> None:
    finding = {"kind": "k", "severity": "info", "message": "m", "ranks": None, "remedy": None}
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=1, findings=[finding]))
    (loaded,) = load_report_dir(tmp_path).findings
    assert loaded.ranks == [] and loaded.remedy is None


def test_malformed_audit_entry(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, audits=[{"label": "x"}]))
    assert "audits[0]: missing required field 'index'" in load_error(tmp_path)


def test_malformed_rank_record(tmp_path: Path) -> None:
    doc = json.loads((DATA / "clean" / "report.json").read_text())
    doc["ranks"][1] = {"rank": 1}
    write(tmp_path, "report.json", doc)
    assert "ranks[1]: missing required field 'events'" in load_error(tmp_path)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (3, "record.events[0] is a number, expected an object"),
        ({"seq": "0"}, "record.events[0]: field 'seq' is a string, expected an integer"),
        ({"call_site": []}, "field 'call_site' is an array, expected an object"),
    ],
)
def test_malformed_event(tmp_path: Path, event: Any, expected: str) -> None:
    doc = rank_doc(0)
    doc["record"]["events"] = [event]
    write(tmp_path, "rank-0.json", doc)
    assert expected in load_error(tmp_path)


def test_rank_field_disagrees_with_file_name(tmp_path: Path) -> None:
    write(tmp_path, "rank-1.json", rank_doc(0))
    assert "field 'rank' is 0, but the file name says 1" in load_error(tmp_path)


def test_record_rank_disagrees_with_file(tmp_path: Path) -> None:
    doc = rank_doc(1)
    doc["record"]["rank"] = 0
    write(tmp_path, "rank-1.json", doc)
    assert "record.rank is 0" in load_error(tmp_path)


def test_rank_outside_world_size(tmp_path: Path) -> None:
    write(tmp_path, "rank-2.json", rank_doc(2, world_size=2))
    assert "rank 2 is outside world_size 2" in load_error(tmp_path)


def test_rank_files_from_different_runs(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, run_id="run-a"))
    write(tmp_path, "rank-1.json", rank_doc(1, run_id="run-b"))
    write(tmp_path, "rank-2.json", rank_doc(2, run_id="run-a", world_size=3))
    message = load_error(tmp_path)
    assert "rank files from different runs" in message
    assert "run 'run-a' (rank-0.json, rank-2.json); run 'run-b' (rank-1.json)" in message


def test_rank_files_disagree_on_world_size(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=2))
    write(tmp_path, "rank-1.json", rank_doc(1, world_size=4))
    assert "disagree on world_size: 2 in rank-0.json, 4 in rank-1.json" in load_error(tmp_path)


def test_stale_rank_file_next_to_report_json(tmp_path: Path) -> None:
    shutil.copytree(DATA / "clean", tmp_path / "r")
    write(tmp_path / "r", "rank-1.json", rank_doc(1, run_id="old-run"))
    message = load_error(tmp_path / "r")
    assert "report.json is from run 'sample-clean'" in message
    assert "rank-1.json is from run 'old-run'" in message


def test_malformed_rank_file_next_to_report_json(tmp_path: Path) -> None:
    shutil.copytree(DATA / "clean", tmp_path / "r")
    write(tmp_path / "r", "rank-1.json", "[]")
    assert "rank-1.json: top level is an array" in load_error(tmp_path / "r")


def test_findings_only_a_rank_file_has_are_merged_into_report_json(tmp_path: Path) -> None:
    """A worker check on rank 1 after rank 0 wrote report.json is not lost."""
    import shutil

    src = Path(__file__).parent / "data" / "clean"
    shutil.copytree(src, tmp_path / "r")
    rank1 = tmp_path / "r" / "rank-1.json"
    doc = json.loads(rank1.read_text())
    doc["findings"].append(
        {"kind": "worker-duplicate-stream", "severity": "error", "message": "m", "ranks": [1]}
    )
    rank1.write_text(json.dumps(doc))
    report = load_report_dir(tmp_path / "r")
    assert report.verdict == "error"
    assert [f.ranks for f in report.findings if f.kind == "worker-duplicate-stream"] == [[1]]


# Hostile input: one line, bounded time and memory (issue 11, item 14) ----------------------


def test_json_nested_100000_levels(tmp_path: Path) -> None:
    write(tmp_path, "report.json", "[" * 100_000 + "]" * 100_000)
    assert "nested deeper than 32 levels" in load_error(tmp_path)


def test_json_nested_deeper_than_a_report_in_a_free_form_field(tmp_path: Path) -> None:
    deep: Any = {}
    for _ in range(40):
        deep = {"x": deep}
    finding = {"kind": "k", "severity": "error", "message": "m", "details": deep}
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=1, findings=[finding]))
    assert "nested deeper than 32 levels" in load_error(tmp_path)


def test_integer_of_5000_digits(tmp_path: Path) -> None:
    text = json.dumps(rank_doc(0)).replace('"world_size": 2', '"world_size": ' + "9" * 5000)
    write(tmp_path, "rank-0.json", text)
    message = load_error(tmp_path)
    assert "unusable JSON" in message and len(message) < 300


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"loaders": "x"}, "record: field 'loaders' is a string, expected an array"),
        ({"loaders": ["x"]}, "record.loaders[0] is a string, expected an object"),
        ({"loaders": [{"num_workers": "2"}]}, "field 'num_workers' is a string"),
        ({"loaders": [{"drew_before_iteration": 1}]}, "is a number, expected a boolean"),
        ({"events": [{"call_site": "x"}]}, "field 'call_site' is a string"),
        ({"events": [{"chain": ["x"]}]}, "events[0].chain[0] is a string, expected an object"),
        ({"events": [{"call_site": {"line": "7"}}]}, "field 'line' is a string"),
        ({"events": [{"sampler": {"chain": 3}}]}, "sampler: field 'chain' is a number"),
    ],
)
def test_malformed_record_parts(tmp_path: Path, record: dict[str, Any], expected: str) -> None:
    doc = rank_doc(0, world_size=1)
    doc["record"].update(record)
    write(tmp_path, "rank-0.json", doc)
    assert expected in load_error(tmp_path)


def test_malformed_finding_call_site(tmp_path: Path) -> None:
    finding = {"kind": "k", "severity": "error", "message": "m", "call_site": ["f", 1]}
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=1, findings=[finding]))
    assert "findings[0]: field 'call_site' is an array, expected an object" in load_error(tmp_path)


def _placed(shape: str, name: str) -> tuple[dict[str, Any], str]:
    """A rank file whose ``shape`` entry has field ``name`` set to a number no field takes,
    and where the message should say so."""
    doc = rank_doc(0, world_size=1)
    bad = {name: 1.5}
    if shape == "Event":
        doc["record"]["events"] = [bad]
        return doc, "record.events[0]"
    if shape == "Loader":
        doc["record"]["loaders"] = [bad]
        return doc, "record.loaders[0]"
    if shape == "RankRecord":
        doc["record"].update(bad)
        return doc, "record"
    if shape == "FindingDict":
        doc["findings"] = [{"kind": "k", "severity": "info", "message": "m", **bad}]
        return doc, "findings[0]"
    if shape == "AuditDict":
        doc["audits"] = [{"index": 0, **bad}]
        return doc, "audits[0]"
    doc.update(bad)  # RankFileDict
    return doc, "rank-0.json"


@pytest.mark.parametrize(
    ("shape", "name"),
    [
        (shape, name)
        for shape in ("Event", "Loader", "RankRecord", "FindingDict", "AuditDict", "RankFileDict")
        for name in typing.get_type_hints(getattr(schema, shape))
        if name != "schema_version"  # checked first, with its own message
    ],
)
def test_every_field_of_the_schema_is_type_checked(tmp_path: Path, shape: str, name: str) -> None:
    """The reader's checks come from the TypedDicts in rngaudit.schema, field for field."""
    doc, where = _placed(shape, name)
    write(tmp_path, "rank-0.json", doc)
    assert f"{where}: field {name!r} is a number, expected " in load_error(tmp_path)


def test_a_field_of_two_types_names_both(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, audits=[{"index": 0, "deferred": "x"}]))
    expected = "audits[0]: field 'deferred' is a string, expected an array or a boolean"
    assert expected in load_error(tmp_path)


@pytest.mark.parametrize("world_size", [20_000_000, 1_000_000_000, 10**40])
def test_a_rank_file_claiming_a_huge_world(tmp_path: Path, world_size: int) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=world_size))
    message = load_error(tmp_path)
    assert "world_size" in message and "above the maximum, 1048576" in message
    assert len(message) < 300


def test_the_largest_world_loads_quickly_with_a_short_finding(tmp_path: Path) -> None:
    write(tmp_path, "rank-0.json", rank_doc(0, world_size=1 << 20))
    report = load_report_dir(tmp_path)
    (missing,) = [f for f in report.findings if f.kind == RANK_MISSING]
    assert missing.message.startswith("No report file from ranks 1-1048575 of 1048576 ")
    assert "rank-1.json, rank-2.json, rank-3.json and 1048572 more are missing" in missing.message


@pytest.mark.parametrize(("rank", "why"), [(5, "outside world_size 2"), (0, "a repeat")])
def test_report_json_ranks_must_fit_the_world(tmp_path: Path, rank: int, why: str) -> None:
    doc = json.loads((DATA / "clean" / "report.json").read_text())
    doc["ranks"][1]["rank"] = rank
    write(tmp_path, "report.json", doc)
    assert f"ranks[1] is rank {rank}, which is {why}" in load_error(tmp_path)


def test_same_as_entries_of_report_json_are_filled_from_the_rank_files(tmp_path: Path) -> None:
    event = {"seq": 1, "generator": "torch.default_generator", "op": "aten.rand"}
    rep = {"rank": 0, "events": [event]}
    merged = {
        "schema_version": 1,
        "run_id": "run-a",
        "verdict": "ok",
        "world_size": 2,
        "findings": [],
        "ranks": [rep, {"rank": 1, "signature": "s", "same_as": 0, "events": []}],
    }
    write(tmp_path, "report.json", merged)
    write(tmp_path, "rank-0.json", rank_doc(0, record=rep))
    write(tmp_path, "rank-1.json", rank_doc(1, record={"rank": 1, "events": [event]}))
    report = load_report_dir(tmp_path)
    assert report.ranks == [rep, {"rank": 1, "events": [event]}]
