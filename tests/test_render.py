"""Tests for rngaudit.reports.report_text: golden files and the text layout's rules.

The samples in tests/data come from a real 2-rank run (tests/data/make_samples.py). Regenerate
the golden files after an intended change of output with
``RNGAUDIT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render.py`` (``make goldens`` does both),
then read the diff and copy the new renderings into the samples in ``docs/cli.md``.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from event_factory import make_event, site
from samples import DATA, EXTRA_DRAW, GOLDEN, PREPARE, check_golden

from rngaudit.audit_report import AuditReport
from rngaudit.findings import Finding
from rngaudit.reports.reading import load_report_dir
from rngaudit.reports.report_text import (
    MAX_TIMELINE_ROWS,
    WIDTH,
    render_json,
    render_markdown,
    render_summary,
    render_text,
)
from rngaudit.schema import Event, Loader, RankRecord
from rngaudit.wording import format_ranks, format_site, short_path

RENDERERS = {"txt": render_text, "md": render_markdown, "json": render_json}


def sample(name: str) -> AuditReport:
    return load_report_dir(DATA / name)


def event(seq: int, op: str = "aten.rand", fp: str | None = "aa", **extra: Any) -> Event:
    at = site("/x/train.py", 10 + seq)
    fields = {"call_site": at, "chain": [at], "user_call_site": at, **extra}
    return make_event(seq, op=op, fingerprint=fp, **fields)


def report_with(*timelines: list[Event]) -> AuditReport:
    ranks: list[RankRecord] = [{"rank": r, "events": events} for r, events in enumerate(timelines)]
    return AuditReport(ranks=ranks, world_size=len(ranks), run_id="r")


# Golden files ------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", sorted(RENDERERS))
@pytest.mark.parametrize("name", ["divergent", "clean"])
def test_golden(name: str, ext: str) -> None:
    check_golden(f"{name}.{ext}", RENDERERS[ext](sample(name)))


def test_summary_golden() -> None:
    # What `rngaudit run` prints at the end (docs/cli.md shows it).
    check_golden("divergent.summary.txt", render_summary(sample("divergent")))


@pytest.mark.parametrize("name", ["divergent", "clean"])
def test_rank_files_render_like_report_json(name: str, tmp_path: Path) -> None:
    for rank_file in (DATA / name).glob("rank-*.json"):
        shutil.copy(rank_file, tmp_path / rank_file.name)
    merged = load_report_dir(tmp_path)
    assert render_text(merged) == (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")


def test_json_round_trips() -> None:
    report = sample("divergent")
    assert json.loads(render_json(report)) == report.to_dict()


# Text layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["divergent", "clean"])
def test_text_fits_width_and_has_no_trailing_space(name: str) -> None:
    for line in render_text(sample(name)).splitlines():
        assert len(line) <= WIDTH, line
        assert line == line.rstrip()


def test_text_leads_with_verdict_then_findings() -> None:
    lines = render_text(sample("divergent")).splitlines()
    assert lines[0] == "rngaudit: ERROR (run sample-divergent, world size 2, mode warn)"
    assert lines[1] == "3 findings (1 error, 2 warnings)."
    assert lines[3] == "[error] sampler-draw-divergence"


def test_text_finding_fields() -> None:
    text = render_text(sample("divergent"))
    error, mismatch = text.split("\n\n")[1:3]
    # The sampler's draw: its generator, torch's line, the prepare() call that led there.
    assert error.startswith("[error] sampler-draw-divergence\n")
    assert "    generator:  torch.Generator#1 (RandomSampler.generator)\n" in error
    assert re.search(r"\n    drawn at:   torch/utils/data/sampler\.py:\d+ in __iter__\n", error)
    assert f"    user code:  sample_run.py:{PREPARE} in main\n" in error
    assert "    ranks:      0, 1\n" in error
    assert "    remedy:     Seed every rank identically before prepare()" in error
    # The unequal draw that split the ranks: rank 0's extra torch.rand, by its line.
    assert mismatch.startswith("[warning] consumption-mismatch\n")
    assert "    generator:  torch.default_generator\n" in mismatch
    assert f"    drawn at:   sample_run.py:{EXTRA_DRAW} in main\n" in mismatch
    assert "rank 0: x1; rank 1: x0" in " ".join(mismatch.split())


def test_text_marks_first_divergence() -> None:
    text = render_text(sample("divergent"))
    marked = [line for line in text.splitlines() if line.startswith(">>")]
    assert marked[0].startswith(">>   0  torch.default_generator")
    assert marked[-1] == (
        ">> first divergence at position 0: ranks differ in generator, op, call site or count."
    )
    # Both ranks were seeded alike: rank 0's extra draw and rank 1's first draw start from the
    # same state, and rank 0's extra draw is shown at its line.
    first = [rank["events"][0] for rank in sample("divergent").ranks]
    assert first[0]["op"] == "aten.uniform_" and first[1]["op"] == "aten.random_"
    assert first[0]["fingerprint"] == first[1]["fingerprint"]
    assert f"aten.uniform_ x1 fp {first[0]['fingerprint']}" in text
    assert f"sample_run.py:{EXTRA_DRAW}  " in text


def test_text_leaves_out_iteration_events() -> None:
    dropout = event(1, op="aten.bernoulli_", phase="iteration")
    text = render_text(report_with([event(0), dropout], [event(0), dropout]))
    assert "aten.rand x1" in text
    assert "aten.bernoulli_" not in text


def test_clean_text_says_no_divergence() -> None:
    text = render_text(sample("clean"))
    assert text.startswith("rngaudit: OK (")
    assert "No findings." in text
    assert ">>" not in text
    assert "No divergence" in text


def test_output_does_not_depend_on_where_the_report_was(tmp_path: Path) -> None:
    shutil.copytree(DATA / "divergent", tmp_path / "copy")
    report = load_report_dir(tmp_path / "copy")
    for render in RENDERERS.values():
        out = render(report)
        assert out == render(sample("divergent"))
        assert str(tmp_path) not in out


def test_divergence_by_fingerprint_only() -> None:
    report = report_with([event(0), event(1, fp="bb")], [event(0), event(1, fp="cc")])
    text = render_text(report)
    assert ">> first divergence at position 1: same draw, different generator state" in text


def test_seeds_with_different_prior_state_are_not_a_divergence() -> None:
    seed = {"op": "torch.manual_seed", "kind": "seed"}
    report = report_with([event(0, fp="x", **seed)], [event(0, fp="y", **seed)])
    assert "No divergence" in render_text(report)


def test_unknown_fingerprints_are_not_compared() -> None:
    report = report_with([event(0, fp=None)], [event(0, fp="aa")])
    assert "No divergence" in render_text(report)


def test_shorter_rank_shows_no_event() -> None:
    report = report_with([event(0), event(1)], [event(0)])
    text = render_text(report)
    assert "(no event)" in text
    assert ">> first divergence at position 1: rank 1 has no event here." in text


def test_timeline_per_audit_with_labels() -> None:
    report = report_with([event(0), event(1, audit=1)], [event(0), event(1, audit=1)])
    report.audits = [{"index": 0, "label": "epoch 0"}, {"index": 1, "label": "epoch 1"}]
    text = render_text(report)
    assert "Pre-iteration timeline, audit 0 'epoch 0'" in text
    assert "Pre-iteration timeline, audit 1 'epoch 1'" in text
    assert "audits: #0 epoch 0, #1 epoch 1" in text


def test_many_ranks_are_split_into_blocks_that_fit() -> None:
    timelines = [[event(0, fp=f"{rank}")] for rank in range(5)]
    text = render_text(report_with(*timelines))
    for rank in range(5):
        assert f"rank {rank}" in text
    assert all(len(line) <= WIDTH for line in text.splitlines())
    assert text.count("     #  rank") == 2  # 3 columns, then 2


def test_narrow_width_is_respected() -> None:
    text = render_text(sample("divergent"), width=60)
    assert all(len(line) <= 60 for line in text.splitlines())


def test_long_cells_are_shortened() -> None:
    long = event(0, generator="torch.Generator#12 (" + "x" * 80 + ")")
    deep = "/a/site-packages/" + "deep/" * 20 + "mod.py"
    long["call_site"] = {"file": deep, "line": 5, "function": "f"}
    text = render_text(report_with([long], [long]))
    assert "..." in text
    assert "deep/mod.py:5" in text
    assert all(len(line) <= WIDTH for line in text.splitlines())


def test_long_timeline_shows_the_divergence() -> None:
    rows = MAX_TIMELINE_ROWS + 140
    same = [event(i) for i in range(rows)]
    other = copy.deepcopy(same)
    other[80]["fingerprint"] = "zz"
    for render in (render_text, render_markdown):
        out = render(report_with(same, other))
        assert out.count("train.py:") == 2 * MAX_TIMELINE_ROWS  # one site per cell
    text = render_text(report_with(same, other))
    assert "        ... 75 earlier positions not shown\n" in text
    assert ">>  80  torch.default_generator" in text
    assert "        ... 65 later positions not shown\n" in text


def test_minimal_events_do_not_break_rendering() -> None:
    nulls = dict.fromkeys(("seq", "audit", "count", "generator", "op", "call_site"), None)
    partial = [{"phase": "pre-iteration"}, {"phase": "pre-iteration", **nulls}]
    # what report_read accepts from a file: any field may be absent or null
    report = report_with(
        cast(list[Event], partial), cast(list[Event], [{"phase": "pre-iteration", "seq": 0}])
    )
    assert "1  ?" in render_text(report) and "| 0 | `?`<br>? x1 |" in render_markdown(report)
    assert [len(r["events"]) for r in json.loads(render_json(report))["ranks"]] == [2, 1]


def test_report_without_records() -> None:
    report = AuditReport(findings=[Finding("rank-missing", "error", "gone", [1])], world_size=2)
    text = render_text(report)
    assert text.startswith("rngaudit: ERROR (run ?, world size 2")
    assert "timeline" not in text


# Markdown ----------------------------------------------------------------------------------


def test_markdown_escapes_pipes_in_cells() -> None:
    piped = event(0, generator="weird|name")
    md = render_markdown(report_with([piped], [piped]))
    assert "`weird\\|name`" in md


def test_markdown_marks_first_divergence() -> None:
    md = render_markdown(sample("divergent"))
    assert "| **>> 0** |" in md
    assert "**>>** first divergence at position 0" in md


# Summary and helpers -----------------------------------------------------------------------


def test_summary_has_verdict_and_each_finding_wrapped_whole() -> None:
    report = sample("divergent")
    lines = render_summary(report).splitlines()
    assert lines[0] == (
        "rngaudit: ERROR, 3 findings (1 error, 2 warnings); "
        "run sample-divergent, world size 2, mode warn"
    )
    assert all(len(line) <= WIDTH for line in lines)
    starts = [i for i, line in enumerate(lines) if not line.startswith("rngaudit:     ")][1:]
    assert len(starts) == 3
    for finding, start, stop in zip(
        report.findings, starts, [*starts[1:], len(lines)], strict=True
    ):
        text = " ".join(line.removeprefix("rngaudit:").strip() for line in lines[start:stop])
        whole = f"{finding.severity} {finding.kind}: {finding.message}"
        assert text == " ".join(whole.split())  # nothing cut (messages' line breaks are wrapped)
    assert lines[starts[0]].startswith("rngaudit:   error sampler-draw-divergence: Sampler ")
    assert lines[starts[1]].startswith("rngaudit:   warning consumption-mismatch: Ranks drew")
    assert lines[starts[2]].startswith("rngaudit:   warning state-divergence: torch.default_")


HTMLISH = Finding(
    kind="state-divergence",
    severity="error",
    message="Drawn in <module> of <stdin> & __init__ *twice*, see `x`",
    ranks=[0],
    generator="gen `a` <b>",
    call_site={"file": "<stdin>", "line": 1, "function": "<module>"},
    remedy="- use a <private> generator",
)


def test_markdown_escapes_html_and_emphasis() -> None:
    event_ = event(0, call_site={"file": "<stdin>", "line": 3, "function": "<module>"})
    report = AuditReport(
        findings=[HTMLISH], ranks=[{"rank": 0, "events": [event_]}], world_size=1, run_id="r"
    )
    md = render_markdown(report)
    outside_code = re.sub(r"(`+).*?\1", "", md)
    assert "<" not in outside_code.replace("<br>", "")
    assert r"Drawn in &lt;module&gt; of &lt;stdin&gt; &amp; \_\_init\_\_ \*twice\*, see \`x\`" in md
    assert "- **Generator:** ``gen `a` <b>``" in md  # a code span shows its text as written
    assert "- **Drawn at:** `<stdin>:1 in <module>`" in md
    assert "- **Remedy:** \\- use a &lt;private&gt; generator" in md
    assert "<br>&lt;stdin&gt;:3" in md  # the timeline cell
    assert "<br>" in md  # the renderer's own HTML stays


def test_summary_of_clean_report() -> None:
    assert render_summary(sample("clean")) == (
        "rngaudit: OK, no findings; run sample-clean, world size 2, mode warn\n"
    )


@pytest.mark.parametrize(
    ("path", "short"),
    [
        (
            "/venv/lib/python3.11/site-packages/torch/utils/data/sampler.py",
            "torch/utils/data/sampler.py",
        ),
        ("/usr/lib/python3/dist-packages/numpy/random/mtrand.py", "numpy/random/mtrand.py"),
        ("C:\\env\\Lib\\site-packages\\torch\\random.py", "torch/random.py"),
        ("/home/alice/proj/train.py", "train.py"),
        ("train.py", "train.py"),
        ("<string>", "<string>"),
        ("<frozen runpy>", "<frozen runpy>"),
    ],
)
def test_short_path(path: str, short: str) -> None:
    assert short_path(path) == short


def test_format_site() -> None:
    site = {"file": "/p/train.py", "line": 3, "function": "main"}
    assert format_site(site) == "train.py:3 in main"
    assert format_site(site, function=False) == "train.py:3"
    assert format_site(None) == ""
    assert format_site({"file": "/p/x.py", "line": 1}) == "x.py:1"


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([1], "1"),
        ([1, 0], "0, 1"),
        ([0, 1, 2, 3, 5, 7, 8], "0-3, 5, 7, 8"),
        ([2, 2], "2"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_loaders_section_lists_each_loader_and_its_early_draw_per_rank() -> None:
    loader: Loader = {
        "loader": "StatefulDataLoader#1", "num_workers": 2, "audit": 0,
        "sampler": "BatchSamplerShard > BatchSampler > RandomSampler",
        "generator": "torch.Generator#1 (RandomSampler.generator)",
        "drew_before_iteration": True, "output_digest": "d", "fingerprint": None,
    }  # fmt: skip
    ranks: list[RankRecord] = [
        {"rank": r, "events": [], "loaders": [{**loader, "fingerprint": f"fp{r}"}]} for r in (0, 1)
    ]
    report = AuditReport(ranks=ranks, world_size=2, run_id="x")
    text = render_text(report)
    assert "Loaders built in the audited windows:" in text
    assert "drew before iteration (state rank 0: fp0; rank 1: fp1)" in " ".join(text.split())
    assert "## Loaders" in render_markdown(report)
    assert "Loaders" not in render_text(AuditReport(ranks=[{"rank": 0, "events": []}]))
