"""numpy instrumentation, in process: the global RNG's calls and new generators, draws unchanged."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import numpy as np
import pytest
import recorder_alone
import wrapt

from rngaudit.capture import fingerprint, naming
from rngaudit.capture.instrument.numpy_random import DRAWS, STATE_OPS, NumpyInstrumentation
from rngaudit.capture.recorder import Recorder

NAMES = [n for n in (*DRAWS, *STATE_OPS, "default_rng") if hasattr(np.random, n)]


def recording() -> contextlib.AbstractContextManager[Recorder]:
    """A recorder of its own with only this instrumentation, undone on the way out."""
    return recorder_alone.recording(NumpyInstrumentation)


_events = recorder_alone.events


def _attributes() -> dict[str, Any]:
    return {n: vars(np.random)[n] for n in NAMES}


def test_the_global_functions_and_default_rng_are_wrapped_then_put_back() -> None:
    before = _attributes()
    assert len(before) > 30
    with recording():
        assert all(isinstance(v, wrapt.FunctionWrapper) for v in _attributes().values())
    assert all(now is before[k] for k, now in _attributes().items())
    with pytest.raises(RuntimeError, match="user code"), recording():
        np.random.rand()
        raise RuntimeError("user code failed")
    assert all(now is before[k] for k, now in _attributes().items())  # also on error


def _draws() -> list[Any]:
    """Draws of the legacy global RNG and of a generator ``default_rng`` made, in order."""
    np.random.seed(5)
    items = np.arange(10)
    np.random.shuffle(items)
    out = [
        np.random.rand(3), np.random.randn(2), np.random.randint(0, 9, 4),
        np.random.random(2), np.random.choice(10, 3), items, np.random.permutation(6),
        np.random.uniform(size=2), np.random.normal(size=2), np.random.binomial(5, 0.5, 2),
        np.random.poisson(3, 2), np.random.beta(2, 3), np.random.exponential(),
        np.random.gamma(2.0), np.random.bytes(4), np.random.multinomial(5, [0.5, 0.5]),
        np.random.dirichlet([1, 1]), np.random.standard_t(3),
    ]  # fmt: skip
    state = np.random.get_state()
    out.append(np.random.rand())
    np.random.set_state(state)
    out.append(np.random.rand())
    gen = np.random.default_rng(4)
    out += [gen.random(3), gen.integers(0, 9, 3), gen.permutation(5), type(gen.bit_generator)]
    return out


def test_audited_draws_are_bit_identical_to_unaudited_ones() -> None:
    plain = _draws()
    with recording() as rec:
        audited = _draws()
    assert len(audited) == len(plain)
    for a, b in zip(audited, plain, strict=True):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (a, b)
    assert len(_events(rec)) > 20


def test_draws_seeds_and_new_generators_are_recorded_with_the_state_drawn_from() -> None:
    np.random.seed(1)
    glob = np.random.mtrand._rand
    before = fingerprint.numpy_random_state(glob)
    with recording() as rec:
        for _ in range(2):
            np.random.rand(2)
        np.random.seed(2)
        np.random.set_state(np.random.get_state())
        gen = np.random.default_rng(0)
        created_line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        gen.random()  # a Generator's own method: C, not wrapped, seen through its state
        with rec.paused():
            np.random.default_rng(1)  # the auditor's own: not recorded
    got = {(e["op"], e["kind"]): e for e in _events(rec)}
    assert set(got) == {
        ("numpy.random.rand", "draw"),
        ("numpy.random.seed", "seed"),
        ("numpy.random.set_state", "state"),
        ("numpy.random.default_rng", "create"),
    }
    rand = got[("numpy.random.rand", "draw")]
    assert rand["generator"] == naming.NUMPY_GLOBAL and rand["count"] == 2
    assert rand["fingerprint"] == before
    created = got[("numpy.random.default_rng", "create")]
    assert created["generator"] == "numpy.Generator#1 (PCG64)"
    assert created["call_site"]["file"] == __file__
    assert created["call_site"]["line"] == created_line
    assert created["fingerprint"] == fingerprint.numpy_generator(np.random.default_rng(0))
