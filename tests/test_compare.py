"""Comparison rules on rank records: which differences are findings, and which are not."""

from __future__ import annotations

import random

from event_factory import make_event
from event_factory import site as make_site

from rngaudit.findings import Finding
from rngaudit.ranks.rules import compare, signature
from rngaudit.schema import CallSiteDict, Event, RankRecord, SamplerDict


def site(file: str, line: int, function: str = "f") -> CallSiteDict:
    return make_site(file, line, function)


SAMPLER_SITE = site("/venv/site-packages/torch/utils/data/sampler.py", 182, "__iter__")
ACCEL_SITE = site("/venv/site-packages/accelerate/data_loader.py", 1250, "prepare_data_loader")
USER = site("/work/train.py", 14, "<module>")


def event(
    seq: int,
    generator: str,
    op: str,
    cs: CallSiteDict,
    fp: str,
    *,
    sampler: bool = False,
    count: int = 1,
    phase: str = "pre-iteration",
) -> Event:
    drew: SamplerDict = {
        "chain": "BatchSamplerShard > BatchSampler > RandomSampler",
        "loader": "StatefulDataLoader#1",
        "output_digest": fp,
    }
    return make_event(
        seq,
        generator=generator,
        op=op,
        call_site=cs,
        chain=[cs, USER],
        user_call_site=USER,
        count=count,
        fingerprint=fp,
        phase=phase,
        sampler=drew if sampler else None,
    )


def record(
    rank: int, events: list[Event], entry: str = "e", exit_: str = "x", seed: int = 1
) -> RankRecord:
    return {
        "rank": rank,
        "events": events,
        "states": {
            "entry": {"torch.default_generator": entry},
            "exit": {"torch.default_generator": exit_},
        },
        "initial_seeds": {"torch.default_generator": seed},
    }


def kinds(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.kind, f.severity) for f in findings}


def test_identical_ranks_have_no_findings() -> None:
    evs = [
        event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "aa"),
        event(2, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, "bb", sampler=True),
    ]
    assert compare([record(0, evs), record(1, evs)], 2, []) == []


def test_sampler_draw_from_differing_state_is_an_error_naming_everything() -> None:
    r0 = [
        event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "a0"),
        event(
            2,
            "torch.Generator#1 (RandomSampler.generator)",
            "aten.randperm",
            SAMPLER_SITE,
            "b0",
            sampler=True,
        ),
    ]
    r1 = [
        event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "a1"),
        event(
            2,
            "torch.Generator#1 (RandomSampler.generator)",
            "aten.randperm",
            SAMPLER_SITE,
            "b1",
            sampler=True,
        ),
    ]
    found = compare([record(0, r0, "e0", "x0", 11), record(1, r1, "e1", "x1", 22)], 2, [])
    errors = [f for f in found if f.severity == "error"]
    assert [f.kind for f in errors] == ["sampler-draw-divergence"]
    f = errors[0]
    assert f.ranks == [0, 1]
    assert f.generator == "torch.Generator#1 (RandomSampler.generator)"
    assert f.call_site == SAMPLER_SITE and f.user_call_site == USER
    for needle in (
        "BatchSamplerShard > BatchSampler > RandomSampler",
        "StatefulDataLoader#1",
        "rank 0: b0",
        "rank 1: b1",
        "train.py:14",
        "sampler.py:182",
        "duplicates some samples and drops others",
        "seeds differ",
    ):
        assert needle in f.message, needle
    assert f.remedy and "set_seed" in f.remedy and "generator=" in f.remedy
    # the accelerate seeding draw differs too, but it is not a sampler draw: no error for it
    assert all(f.call_site != ACCEL_SITE for f in errors)


def test_divergent_non_sampler_draw_is_not_an_error() -> None:
    """accelerate seeds a fresh sampler generator from differing state: overwritten by the
    broadcast before use, so not an error."""
    r0 = [event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "a0")]
    r1 = [event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "a1")]
    found = compare([record(0, r0, "e0", "x0"), record(1, r1, "e1", "x1")], 2, [])
    assert "error" not in {f.severity for f in found}
    assert kinds(found) == {("state-divergence", "info")}


def test_sampler_draws_during_iteration_are_not_pre_iteration_errors() -> None:
    r0 = [
        event(
            1,
            "torch.Generator#1",
            "aten.randperm",
            SAMPLER_SITE,
            "b0",
            sampler=True,
            phase="iteration",
        )
    ]
    r1 = [
        event(
            1,
            "torch.Generator#1",
            "aten.randperm",
            SAMPLER_SITE,
            "b1",
            sampler=True,
            phase="iteration",
        )
    ]
    assert compare([record(0, r0), record(1, r1)], 2, []) == []


def test_extra_draw_on_one_rank_is_a_consumption_mismatch() -> None:
    stray = site("/work/train.py", 9, "<module>")
    r0 = [
        event(1, "torch.default_generator", "aten.rand", stray, "aa"),
        event(2, "torch.default_generator", "aten.random_", ACCEL_SITE, "bb"),
    ]
    r1 = [event(1, "torch.default_generator", "aten.random_", ACCEL_SITE, "aa")]
    found = compare([record(0, r0, "e", "x0"), record(1, r1, "e", "x1")], 2, [])
    mismatch = [f for f in found if f.kind == "consumption-mismatch"]
    assert len(mismatch) == 1 and mismatch[0].severity == "warning"
    assert "train.py:9" in mismatch[0].message and "rank 0: x1; rank 1: x0" in mismatch[0].message
    state = [f for f in found if f.kind == "state-divergence"]
    assert state and state[0].severity == "warning"  # equal at entry, split inside the window


def test_missing_rank_is_an_error_naming_it() -> None:
    found = compare([record(0, []), record(2, [])], 3, [1], timeout=5)
    assert [(f.kind, f.severity, f.ranks) for f in found] == [("rank-missing", "error", [1])]
    assert "Rank(s) 1 did not arrive" in found[0].message and "5 s" in found[0].message


def test_findings_do_not_depend_on_record_order() -> None:
    r0 = [event(1, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, "b0", sampler=True)]
    r1 = [event(1, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, "b1", sampler=True)]
    r2 = [event(1, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, "b0", sampler=True)]
    records = [record(0, r0), record(1, r1), record(2, r2)]
    expected = [f.to_dict() for f in compare(records, 3, [])]
    for _ in range(5):
        random.shuffle(records)
        assert [f.to_dict() for f in compare(records, 3, [])] == expected
    assert "ranks 0, 2: b0; rank 1: b1" in expected[0]["message"]


def test_ranks_with_equal_records_are_compared_once_and_all_named() -> None:
    def sampler_rank(rank: int) -> RankRecord:
        fp = "b0" if rank % 2 == 0 else "b1"
        evs = [event(1, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, fp, sampler=True)]
        return record(rank, evs, seed=rank % 2)

    records = [sampler_rank(r) for r in range(6)]
    found = compare(records, 6, [])
    errors = [f for f in found if f.kind == "sampler-draw-divergence"]
    assert len(errors) == 1 and errors[0].ranks == [0, 1, 2, 3, 4, 5]
    assert "ranks 0, 2, 4: b0; ranks 1, 3, 5: b1" in errors[0].message
    assert errors[0].details["fingerprints"] == {str(r): ("b0", "b1")[r % 2] for r in range(6)}
    # precomputed signatures (as ranks send them) give the same findings
    for r in records:
        r["signature"] = signature(r)
    assert [f.to_dict() for f in compare(records, 6, [])] == [f.to_dict() for f in found]


def test_all_ranks_equal_is_clean_whatever_the_world_size() -> None:
    evs = [event(1, "torch.Generator#1", "aten.randperm", SAMPLER_SITE, "bb", sampler=True)]
    assert compare([record(r, evs) for r in range(64)], 64, []) == []


def test_advice_fits_the_framework_of_the_run() -> None:
    """No accelerate advice in a plain torch or Lightning run; accelerate's when it drives."""

    def records(framework: str | None) -> list[RankRecord]:
        out = []
        for rank in (0, 1):
            evs = [event(1, "torch.default_generator", "aten.randperm", SAMPLER_SITE, f"b{rank}",
                         sampler=True)]  # fmt: skip
            rec = record(rank, evs, f"e{rank}", f"x{rank}", rank)
            if framework is not None:
                rec["framework"] = framework
            out.append(rec)
        return out

    for framework, words in (
        ("torch", "torch.manual_seed(SEED)"),
        ("lightning", "seed_everything(SEED)"),
        ("hf-trainer", "TrainingArguments(seed=SEED"),
    ):
        found = compare(records(framework), 2, [])
        text = " ".join(f"{f.message} {f.remedy}" for f in found)
        assert words in text, framework
        assert "accelerate" not in text.lower() and "prepare()" not in text, framework
    accel = " ".join(f"{f.message} {f.remedy}" for f in compare(records("accelerate"), 2, []))
    assert "Accelerate synchronizes RNG" in accel and "set_seed" in accel
    legacy = compare(records(None), 2, [])  # older records: accelerate's wording, as before
    assert any("Accelerate synchronizes RNG" in f.message for f in legacy)
