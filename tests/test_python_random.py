"""Python ``random`` instrumentation, in process: what it records, draws unchanged, undone."""

from __future__ import annotations

import contextlib
import random
import tempfile
from typing import Any

import pytest
import recorder_alone
import wrapt

from rngaudit.capture import fingerprint, naming
from rngaudit.capture.instrument.python_random import DRAWS, STATE_OPS, PythonInstrumentation
from rngaudit.capture.patching import MISSING
from rngaudit.capture.recorder import Recorder

NAMES = [n for n in (*DRAWS, *STATE_OPS) if hasattr(random.Random, n)]


def recording() -> contextlib.AbstractContextManager[Recorder]:
    """A recorder of its own with only this instrumentation, undone on the way out."""
    return recorder_alone.recording(PythonInstrumentation)


_events = recorder_alone.events


def _attributes() -> dict[str, Any]:
    """What ``random`` and ``random.Random`` hold of their own under each audited name."""
    out = {f"random.{n}": vars(random).get(n, MISSING) for n in NAMES}
    out.update({f"Random.{n}": vars(random.Random).get(n, MISSING) for n in NAMES})
    return out


def test_every_draw_and_state_op_is_wrapped_while_installed_and_put_back_after() -> None:
    before = _attributes()
    assert "random.random" in before and before["random.random"] is not MISSING
    with recording():
        during = _attributes()
        assert all(isinstance(v, wrapt.FunctionWrapper) for v in during.values()), during
    assert all(now is before[k] for k, now in _attributes().items())
    with pytest.raises(RuntimeError, match="user code"), recording():
        random.random()
        raise RuntimeError("user code failed")
    assert all(now is before[k] for k, now in _attributes().items())  # also on error


def _draws(rng: Any) -> list[Any]:
    """Every audited draw of ``rng`` (the ``random`` module or a ``random.Random``), in order."""
    rng.seed(11)
    items = list(range(10))
    rng.shuffle(items)
    out: list[Any] = [
        rng.random(), rng.uniform(1, 2), rng.randint(0, 99), rng.randrange(0, 99, 3),
        rng.choice(items), rng.choices(items, k=3), items, rng.sample(items, 4),
        rng.gauss(0, 1), rng.normalvariate(0, 1), rng.lognormvariate(0, 1),
        rng.expovariate(2), rng.vonmisesvariate(0, 1), rng.gammavariate(2, 1),
        rng.betavariate(2, 3), rng.paretovariate(2), rng.weibullvariate(1, 2),
        rng.triangular(0, 1), rng.getrandbits(70), rng.randbytes(5),
    ]  # fmt: skip
    if hasattr(rng, "binomialvariate"):
        out.append(rng.binomialvariate(10, 0.3))
    state = rng.getstate()
    out.append(rng.random())
    rng.setstate(state)
    out.append(rng.random())  # the same again
    return out


def test_audited_draws_are_bit_identical_to_unaudited_ones() -> None:
    plain = (_draws(random), _draws(random.Random()), random.getstate())
    with recording() as rec:
        audited = (_draws(random), _draws(random.Random()), random.getstate())
    assert audited == plain
    assert {e["generator"] for e in _events(rec)} == {naming.PYTHON_GLOBAL, "random.Random#1"}


def test_draws_are_named_by_generator_and_kind_with_the_state_they_drew_from() -> None:
    random.seed(3)
    own = random.Random(9)
    global_before = fingerprint.python_random(random._inst)
    own_before = fingerprint.python_random(own)
    with recording() as rec:
        for _ in range(3):
            random.random()
        own.randint(0, 9)
        random.seed(4)
        own.setstate(own.getstate())
        random.SystemRandom().randint(0, 9)  # os.urandom: no state, not recorded
        next(tempfile._get_candidate_names())  # type: ignore[attr-defined]  # the stdlib's own
    got = {(e["op"], e["generator"], e["kind"]): e for e in _events(rec)}
    assert set(got) == {
        ("random.random", naming.PYTHON_GLOBAL, "draw"),
        ("random.randint", "random.Random#1", "draw"),
        ("random.seed", naming.PYTHON_GLOBAL, "seed"),
        ("random.setstate", "random.Random#1", "state"),
    }
    first = got[("random.random", naming.PYTHON_GLOBAL, "draw")]
    assert first["count"] == 3 and first["fingerprint"] == global_before
    assert got[("random.randint", "random.Random#1", "draw")]["fingerprint"] == own_before
    assert all(e["call_site"]["file"] == __file__ for e in got.values())


def test_a_disabled_recorder_and_the_auditors_own_draws_record_nothing() -> None:
    with recording() as rec:
        with rec.paused():
            random.random()
            random.Random(1).random()
        rec.enabled = False
        random.random()
        random.Random(1).random()
    assert _events(rec) == []
