"""Unit tests for rngaudit.reports.view: what every renderer shows, on the sample reports of a
real 2-rank run (tests/data) and on hand-written events for the edges."""

from __future__ import annotations

from typing import Any

from event_factory import make_event, site
from samples import DATA, EXTRA_DRAW, PREPARE

from rngaudit.audit_report import AuditReport
from rngaudit.findings import Finding
from rngaudit.reports import view
from rngaudit.reports.reading import load_report_dir
from rngaudit.schema import AuditDict, Event, RankRecord


def _report(*columns: list[Event], audits: list[AuditDict] | None = None) -> AuditReport:
    ranks = [{"rank": r, "events": list(events)} for r, events in enumerate(columns)]
    data: Any = {"world_size": len(ranks), "ranks": ranks, "audits": audits or []}
    return AuditReport.from_dict(data)


def test_the_divergent_sample_parts_at_rank_0s_extra_draw() -> None:
    report = load_report_dir(DATA / "divergent")
    [timeline] = view.timelines(report)
    assert timeline.ranks == [0, 1] and timeline.audit == 0
    assert timeline.divergence == 0  # rank 0 drew once more, first: the columns part at once
    assert timeline.reason == "ranks differ in generator, op, call site or count"
    first = timeline.rows[0][0]
    assert first is not None and first["call_site"] is not None
    assert first["call_site"]["line"] == EXTRA_DRAW
    assert view.event_sites(first) == [f"sample_run.py:{EXTRA_DRAW}"]
    library = timeline.rows[0][1]
    assert library is not None
    assert view.event_sites(library)[1] == f"from sample_run.py:{PREPARE}"  # inside prepare()
    assert view.divergence_note(timeline).startswith("first divergence at position 0: ranks")
    assert view.timeline_title(timeline) == (
        f"Pre-iteration timeline, audit 0 {report.audits[0]['label']!r}"
    )


def test_the_samples_loader_rows_carry_each_ranks_early_state() -> None:
    report = load_report_dir(DATA / "divergent")
    rows = {loader["loader"]: draws for loader, draws in view.loader_rows(report)}
    assert rows["DataLoader#1"] == {}  # drew nothing before iteration
    early = rows["StatefulDataLoader#1"]  # prepare()'s prefetch drew, from unequal states
    assert sorted(early) == [0, 1] and early[0] != early[1]
    [sampler] = [f for f in report.findings if f.kind == "sampler-draw-divergence"]
    assert sampler.details["fingerprints"] == {str(r): fp for r, fp in early.items()}


def test_the_clean_sample_has_no_divergence_and_names_its_audits() -> None:
    report = load_report_dir(DATA / "clean")
    assert [t.divergence for t in view.timelines(report)] == [None]
    assert view.divergence_note(view.timelines(report)[0]).startswith("No divergence")
    assert view.counts(report.findings) == "no findings"
    check = report.audits[1]
    assert view.audit_name(check) == f"#1 {check['label']} (ok)"
    assert view.audit_suffix(report, 1) == f" (audit 1 {check['label']!r})"
    assert view.audit_suffix(report, 7) == " (audit 7)"
    assert view.report_line(report) == "run sample-clean, world size 2, mode warn"


def test_the_first_divergence_is_a_missing_event_a_different_event_or_state() -> None:
    a, b = site("train.py", 3), site("train.py", 4)
    same = [make_event(1, call_site=a), make_event(2, call_site=b)]
    assert view.timelines(_report(same, same))[0].divergence is None
    short = view.timelines(_report(same, same[:1]))[0]
    assert (short.divergence, short.reason) == (1, "rank 1 has no event here")
    recount = [same[0], make_event(2, call_site=b, count=2)]
    assert view.timelines(_report(same, recount))[0].divergence == 1
    state = [same[0], make_event(2, call_site=b, fingerprint="ffff0000")]
    moved = view.timelines(_report(same, state))[0]
    assert (moved.divergence, moved.reason) == (
        1,
        "same draw, different generator state (fingerprint)",
    )
    seeded = [same[0], make_event(2, call_site=b, kind="seed", fingerprint="ffff0000")]
    reseeded = [same[0], make_event(2, call_site=b, kind="seed", fingerprint="0000ffff")]
    assert view.timelines(_report(seeded, reseeded))[0].divergence is None  # no draw state
    assert view.timelines(_report(same, seeded))[0].divergence == 1  # a draw against a seed
    iterating = [*same, make_event(3, call_site=b, phase="iteration")]
    assert view.timelines(_report(same, iterating))[0].divergence is None  # after iteration


def test_timelines_are_per_audit_and_ranks_in_order() -> None:
    first, later = make_event(1, audit=0), make_event(2, audit=1)
    report = _report([first, later], [first, later], audits=[{"index": 1, "label": "epoch 1"}])
    report.ranks.reverse()  # records in any order: columns by rank
    got = view.timelines(report)
    assert [(t.audit, t.label, t.ranks) for t in got] == [(0, "", [0, 1]), (1, "epoch 1", [0, 1])]
    assert view.timeline_title(got[0]) == "Pre-iteration timeline, audit 0"


def test_cell_keys_tell_ranks_apart_by_state_and_runs_by_place() -> None:
    a = make_event(1, call_site=site("/run-a/train.py", 3), fingerprint="1")
    moved = make_event(1, call_site=site("/run-a/train.py", 3), fingerprint="2")
    assert view.rank_cell_key(a) != view.rank_cell_key(moved)
    assert view.rank_cell_key(None) is None and view.run_cell_key(None) is None
    seeded = make_event(1, kind="seed", fingerprint="1")
    reseeded = make_event(1, kind="seed", fingerprint="2")
    assert view.rank_cell_key(seeded) == view.rank_cell_key(reseeded)  # a seed's state: not read
    assert view.run_cell_key(a) != view.run_cell_key(moved)


def test_fields_counts_and_scalars() -> None:
    finding = Finding(
        "state-divergence",
        "warning",
        "differs",
        [0, 1, 2, 5],
        generator="torch.default_generator",
        details={"fingerprints": {"0": "a"}, "note": "x"},
    )
    assert view.finding_fields(finding) == [
        ("generator", "torch.default_generator"),
        ("ranks", "0-2, 5"),
        ("details", 'fingerprints={"0": "a"}, note=x'),
    ]
    error = Finding("sampler-draw-divergence", "error", "e", [0])
    assert view.counts([finding]) == "1 finding (1 warning)"
    assert view.counts([finding, error, finding]) == "3 findings (1 error, 2 warnings)"
    event = make_event(1, sampler={"chain": "S", "loader": None, "output_digest": None})
    assert view.event_summary(event) == "aten.uniform_ x1 fp 0000abcd [sampler]"
    record: RankRecord = {"rank": None}  # type: ignore[typeddict-item]
    assert view.number(record, "rank", 3) == 3 and view.number({"count": 2}, "count") == 2
