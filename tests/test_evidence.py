"""The workers' first-batch evidence: which streams are duplicates, confirmed or not, and merged."""

from __future__ import annotations

from typing import Any

from rngaudit.workers import evidence

SITE = {"file": "/src/aug.py", "line": 7, "function": "jitter"}
OTHER = {"file": "/src/aug.py", "line": 9, "function": "crop"}


def _draw(fps: list[Any], holder: str | None = "dataset.rng", site: Any = SITE) -> Any:
    return {"site": site, "op": "random.random", "holder": holder, "type": "random.Random",
            "user_site": {"file": "/src/train.py", "line": 3}, "fingerprints": fps}  # fmt: skip


def _ok(*draws: Any, states: Any = ()) -> dict[str, Any]:
    return {"status": "ok", "draws": list(draws), "states": list(states)}


def test_workers_drawing_one_stream_twice_are_a_confirmed_duplicate() -> None:
    reports = {
        0: _ok(_draw(["a", "b"])),
        1: _ok(_draw(["a", "b"])),
        2: _ok(_draw(["c", "d"])),
        3: {"status": "error", "draws": [_draw(["a", "b"])]},  # not ok: not evidence
    }
    (dup,) = evidence.from_draws(reports)
    assert (dup.key, dup.evidence, dup.confirmed) == ("dataset.rng", evidence.DRAWS, True)
    assert dup.groups == [[0, 1]] and dup.reporting == [0, 1, 2] and dup.distinct == 2
    assert dup.worker_ids == [0, 1] and dup.call_sites == ["aug.py:7 in jitter"]
    assert dup.user_sites == ["train.py:3"] and dup.type == "random.Random"
    distinct = {w: _ok(_draw([f"s{w}", f"t{w}"])) for w in range(3)}
    assert evidence.from_draws(distinct) == []


def test_workers_sharing_any_state_are_one_group() -> None:
    reports = {0: _ok(_draw(["a", "x"])), 1: _ok(_draw(["a", "y"])), 2: _ok(_draw(["y", "z"]))}
    (dup,) = evidence.from_draws(reports)
    assert dup.groups == [[0, 1, 2]] and dup.distinct == 1
    bridged = {0: _ok(_draw(["a", "p"])), 1: _ok(_draw(["b", "q"])), 2: _ok(_draw(["a", "b"]))}
    (dup,) = evidence.from_draws(bridged)  # worker 2 shares a state with each
    assert dup.groups == [[0, 1, 2]] and dup.distinct == 1


def test_a_draw_made_right_in_user_code_names_no_other_user_site() -> None:
    direct = {w: _ok({**_draw(["a", "b"]), "user_site": SITE}) for w in range(2)}
    (dup,) = evidence.from_draws(direct)
    assert dup.call_sites == ["aug.py:7 in jitter"] and dup.user_sites == []


def test_one_draw_each_is_unconfirmed_and_a_worker_repeating_its_own_state_is_no_evidence() -> None:
    (once,) = evidence.from_draws({w: _ok(_draw(["a"])) for w in range(3)})
    assert once.confirmed is False and once.groups == [[0, 1, 2]]
    half = {0: _ok(_draw(["a", "b"])), 1: _ok(_draw(["a"]))}
    assert evidence.from_draws(half)[0].confirmed is False  # one worker's stream is not two
    reset = {w: _ok(_draw(["r", "r"])) for w in range(2)}  # reset for every sample
    assert evidence.from_draws(reset) == []


def test_malformed_reports_are_read_as_far_as_they_go() -> None:
    reports: dict[int, Any] = {
        0: _ok(_draw(["a", "b", 3])),  # a fingerprint that is not a string: left out
        1: {"status": "ok", "draws": [_draw(["a", "b"]), "junk", None], "states": "junk"},
        2: "not a report",
        3: {"status": "ok", "draws": {"not": "a list"}},
    }
    (dup,) = evidence.from_draws(reports)
    assert dup.groups == [[0, 1]] and dup.reporting == [0, 1]
    assert evidence.from_states(reports) == [] and evidence.drawn(reports) == {"dataset.rng": 2}


def test_a_holder_drawn_at_two_sites_is_one_duplicate_and_confirmed_evidence_wins() -> None:
    both = {w: _ok(_draw(["a", "b"]), _draw(["c", "d"], site=OTHER)) for w in range(2)}
    (merged,) = evidence.from_draws(both)
    assert merged.call_sites == ["aug.py:7 in jitter", "aug.py:9 in crop"]
    for draws in ((_draw(["e"], site=OTHER), _draw(["a", "b"])),
                  (_draw(["a", "b"]), _draw(["e"], site=OTHER))):  # fmt: skip
        (dup,) = evidence.from_draws({w: _ok(*draws) for w in range(2)})
        assert dup.confirmed and dup.call_sites == ["aug.py:7 in jitter"]
    (by_site,) = evidence.from_draws({w: _ok(_draw(["a", "b"], holder=None)) for w in range(2)})
    assert by_site.key == "aug.py:7 in jitter" and by_site.holder is None


def _state(path: str | None, before: str | None, after: Any, created: Any = None) -> Any:
    return {"path": path, "type": "numpy.Generator", "created_at": created, "before": before,
            "after": after}  # fmt: skip


def test_states_that_advanced_alike_or_appeared_alike_are_unconfirmed_duplicates() -> None:
    advanced = {w: _ok(states=[_state("dataset.g", "s0", "s1")]) for w in range(3)}
    (dup,) = evidence.from_states(advanced)
    assert (dup.key, dup.evidence, dup.confirmed, dup.advanced) == (
        "dataset.g", evidence.STATE, False, True
    )  # fmt: skip
    assert dup.groups == [[0, 1, 2]] and dup.holder == "dataset.g"
    unused = {w: _ok(states=[_state("dataset.g", "s0", "s0")]) for w in range(2)}
    assert evidence.from_states(unused) == [] and evidence.drawn(unused) == {}
    apart = {w: _ok(states=[_state("dataset.g", "s0", f"s{w + 1}")]) for w in range(2)}
    assert evidence.from_states(apart) == []
    made = {w: _ok(states=[_state(None, "c", "c1", SITE)]) for w in range(2)}
    (created,) = evidence.from_states(made)
    assert created.key == "created at aug.py:7 in jitter" and created.created_at is not None
    fresh = {w: _ok(states=[_state("dataset.h", None, "f")]) for w in range(2)}
    (appeared,) = evidence.from_states(fresh)
    assert appeared.advanced is False and appeared.groups == [[0, 1]]
    nameless = {w: _ok(states=[_state(None, "c", "c1")]) for w in range(2)}
    assert evidence.from_states(nameless) == []  # neither held nor created where named
    assert evidence.from_states({0: _ok(states=[_state("p", "a", None)])}) == []


def test_draw_evidence_comes_first_and_a_holder_is_named_once() -> None:
    reports = {
        w: _ok(
            _draw(["a", "b"]),
            states=[
                _state("dataset.rng", "s0", "s1"),
                _state("dataset.g", "s0", "s1"),
                _state("dataset.g", None, "f"),
            ],
        )
        for w in range(2)
    }
    found = evidence.duplicates(reports)
    assert [(d.key, d.evidence, d.advanced) for d in found] == [
        ("dataset.rng", evidence.DRAWS, True),
        ("dataset.g", evidence.STATE, True),
    ]
    assert evidence.drawn(reports) == {"dataset.rng": 2, "dataset.g": 2}
