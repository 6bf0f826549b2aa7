"""Tests of the sample reports in tests/data: the producer's shapes, scrubbed, and the docs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from samples import AUDIT, CASES, DATA, EXTRA_DRAW, PREPARE, SCENARIO, check_golden

from rngaudit.capture import environment
from rngaudit.cli import main
from rngaudit.findings import Finding
from rngaudit.reports.reading import load_report_dir
from rngaudit.schema import CallSiteDict, Event, Loader, RankRecord, SamplerDict

ROOT = Path(__file__).resolve().parent.parent
HEX8 = re.compile(r"[0-9a-f]{8}")  # fingerprint.py: a crc32 as 8 hex digits
FILES = ("rank-0.json", "rank-1.json", "report.json")

# The top level of each file, as session.Session.write and AuditReport.to_dict write it.
REPORT_KEYS = {
    "schema_version", "run_id", "verdict", "world_size", "mode", "audits", "findings", "ranks",
}  # fmt: skip
RANK_FILE_KEYS = {
    "schema_version", "run_id", "world_size", "rank", "mode", "verdict", "audits", "findings",
    "record",
}  # fmt: skip
# A rank record on disk (records.RankRecord): always these; exception / same_as when set.
RECORD_KEYS = {"rank", "pid", "host", "events", "loaders", "states", "run_id", "environment"}
RECORD_OPTIONAL = {"exception", "same_as"}
FINDING_KEYS = {f.name for f in dataclasses.fields(Finding)}


def load(case: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / case / name).read_text(encoding="utf-8"))
    return data


def records(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["ranks"]) if "ranks" in doc else [doc["record"]]


def sites(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from (s for s in (event["call_site"], event["user_call_site"]) if s is not None)
    yield from event["chain"]


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


ALL = [(case, name) for case in CASES for name in FILES]


@pytest.mark.parametrize(("case", "name"), ALL)
def test_sample_has_exactly_the_producers_fields(case: str, name: str) -> None:
    """Every object in a sample has the keys its producer writes, and no other (a
    hand-written ``last_fingerprint`` or 16-digit fingerprint fails here)."""
    doc = load(case, name)
    assert set(doc) == (REPORT_KEYS if name == "report.json" else RANK_FILE_KEYS)
    assert doc["schema_version"] == 1 and doc["world_size"] == 2
    for finding in doc["findings"]:
        assert {"kind", "severity", "message", "ranks", "audit"} <= set(finding) <= FINDING_KEYS
        assert Finding.from_dict(finding).to_dict() == finding  # the producer's own serializer
    for record in records(doc):
        assert RECORD_KEYS <= set(record) <= RECORD_KEYS | RECORD_OPTIONAL
        assert set(record) <= set(RankRecord.__optional_keys__)
        assert set(record["environment"]) == {"python", "packages", "seeds", "variables"}
        assert set(record["environment"]["packages"]) == set(environment.PACKAGES)
        assert set(record["states"]) == {"entry", "exit"}
        for states in record["states"].values():
            assert all(HEX8.fullmatch(fingerprint) for fingerprint in states.values())
        for loader in record["loaders"]:
            # "samples" only for a loader over a split of a root dataset (none in the samples)
            assert set(loader) == Loader.__required_keys__ | Loader.__optional_keys__ - {"samples"}
            for digest in (loader["fingerprint"], loader["output_digest"]):
                assert digest is None or HEX8.fullmatch(digest)
        assert record["events"], "a sample without events shows nothing"
        for event in record["events"]:
            # "aggregated" only on the events of generators beyond the named ones
            assert set(event) == Event.__required_keys__
            assert set(Event.__annotations__) - set(event) == {"aggregated"}
            assert event["fingerprint"] is None or HEX8.fullmatch(event["fingerprint"])
            for site in sites(event):
                assert set(site) == CallSiteDict.__required_keys__
            if event["sampler"] is not None:
                assert set(event["sampler"]) == SamplerDict.__required_keys__
                assert HEX8.fullmatch(event["sampler"]["output_digest"])


@pytest.mark.parametrize(("case", "name"), ALL)
def test_sample_is_scrubbed(case: str, name: str) -> None:
    doc = load(case, name)
    assert doc["run_id"] == f"sample-{case}"
    for record in records(doc):
        assert record["run_id"] == doc["run_id"] and record["host"] == "host"
        assert record["pid"] == 1000 + record["rank"]
        assert {e["pid"] for e in record["events"]} == {record["pid"]}
        assert re.fullmatch(r"\d+\.\d+", record["environment"]["python"])
        for event in record["events"]:
            for site in sites(event):
                assert site["file"].startswith(("/venv/site-packages/", "/repo/")), site
    text = (DATA / case / name).read_text(encoding="utf-8")
    assert str(ROOT) not in text and "/tmp/" not in text


@pytest.mark.parametrize("case", CASES)
def test_samples_load_and_come_from_the_scenario_as_it_is(case: str) -> None:
    """The samples name sample_run.py's lines as they are: editing it means regenerating."""
    report = load_report_dir(DATA / case)  # the reader's checks
    assert report.audits[0]["label"] == f"audit at sample_run.py:{AUDIT} in main"
    user_sites = {
        (site["file"], site["line"])
        for record in report.ranks
        for event in record["events"]
        if (site := event["user_call_site"]) is not None
    }
    scenario = "/repo/" + SCENARIO.relative_to(ROOT).as_posix()
    extra = {(scenario, EXTRA_DRAW)} if case == "divergent" else set()
    assert user_sites == {(scenario, PREPARE)} | extra


def test_divergent_sample_names_generator_call_site_and_ranks() -> None:
    report = load_report_dir(DATA / "divergent")
    assert report.verdict == "error"
    error = report.errors()[0]
    assert error.kind == "sampler-draw-divergence" and error.ranks == [0, 1]
    assert error.generator == "torch.Generator#1 (RandomSampler.generator)"
    assert error.call_site is not None and error.user_call_site is not None
    assert error.call_site["file"] == "/venv/site-packages/torch/utils/data/sampler.py"
    assert error.user_call_site["line"] == PREPARE
    # The two ranks' sampler draws: from different states, so different indices.
    draws = [
        next(e for e in record["events"] if e["sampler"] is not None) for record in report.ranks
    ]
    assert draws[0]["fingerprint"] != draws[1]["fingerprint"]
    samplers = [draw["sampler"] for draw in draws]
    assert samplers[0] is not None and samplers[1] is not None
    assert samplers[0]["output_digest"] != samplers[1]["output_digest"]
    mismatch = next(f for f in report.findings if f.kind == "consumption-mismatch")
    assert mismatch.call_site is not None and mismatch.call_site["line"] == EXTRA_DRAW


def test_clean_sample_draws_alike_on_both_ranks() -> None:
    report = load_report_dir(DATA / "clean")
    assert report.verdict == "ok" and report.findings == []
    first, second = ([dict(e, pid=0) for e in r["events"]] for r in report.ranks)
    assert first == second


def test_diff_of_the_samples(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    """`rngaudit diff` of the two runs: the same program, the second with rank 0's extra draw."""
    monkeypatch.chdir(ROOT)
    assert main(["diff", "tests/data/clean", "tests/data/divergent"]) == 1
    out = capsys.readouterr().out
    check_golden("diff.txt", out)
    assert f"at sample_run.py:{EXTRA_DRAW} in main" in out
    assert "Rank 1: identical" in out


# The docs' samples -------------------------------------------------------------------------

SAMPLE = re.compile(r"<!-- sample: (\S+) -->\n(```[a-z]*\n)(.*?)```\n", re.DOTALL)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
UPDATE = os.environ.get("RNGAUDIT_UPDATE_GOLDEN") == "1"


def _golden(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _block(match: re.Match[str], content: str) -> str:
    return f"<!-- sample: {match.group(1)} -->\n{match.group(2)}{content}```\n"


def test_docs_samples_are_the_golden_renderings() -> None:
    """Every ``<!-- sample: PATH -->`` block in the docs is PATH's content, verbatim
    (``RNGAUDIT_UPDATE_GOLDEN=1`` copies the golden files into the docs first)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        if UPDATE:
            text = SAMPLE.sub(lambda m: _block(m, _golden(m.group(1))), text)
            doc.write_text(text, encoding="utf-8")
        for match in SAMPLE.finditer(text):
            path, _, shown = match.groups()
            found.append(path)
            assert shown == _golden(path), f"{doc.name}: {path}"
    assert {
        "tests/golden/divergent.txt",
        "tests/golden/clean.txt",
        "tests/golden/divergent.summary.txt",
        "tests/golden/diff.txt",
    } <= set(found)


def test_the_samples_regenerate_byte_identical_from_a_real_run() -> None:
    """tests/data/divergent is what a real 2-rank run of sample_run.py writes now (scrubbed by
    make_samples.py): the goldens rendered from it are renderings of today's producer."""
    spec = importlib.util.spec_from_file_location("make_samples", DATA / "make_samples.py")
    assert spec is not None and spec.loader is not None
    make_samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_samples)
    texts = make_samples.capture("divergent")
    assert sorted(texts) == sorted(FILES)
    for name, text in texts.items():
        assert text == (DATA / "divergent" / name).read_text(encoding="utf-8"), name
