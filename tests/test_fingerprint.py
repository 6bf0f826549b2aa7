"""Fingerprints: the fast memory reads hash exactly what getstate()/get_state() return."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rngaudit.capture import fingerprint


@pytest.fixture
def slow() -> Iterator[None]:
    """Force the exact slow paths (as if the memory layout had not been verified)."""
    saved = fingerprint._py_offset, fingerprint._np_aug_offset
    fingerprint._py_offset = fingerprint._np_aug_offset = None
    yield
    fingerprint._py_offset, fingerprint._np_aug_offset = saved


def test_the_memory_layouts_are_found_on_this_python_and_numpy() -> None:
    assert fingerprint._find_python_offset() is not None
    assert fingerprint._find_numpy_aug_offset() is not None


def _fast_and_slow(fn: object, obj: object) -> tuple[str, str]:
    fast = fn(obj)  # type: ignore[operator]
    saved = fingerprint._py_offset, fingerprint._np_aug_offset
    fingerprint._py_offset = fingerprint._np_aug_offset = None
    try:
        return fast, fn(obj)  # type: ignore[operator]
    finally:
        fingerprint._py_offset, fingerprint._np_aug_offset = saved


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), draws=st.integers(0, 700), gauss=st.booleans())
def test_python_random_fast_equals_slow(seed: int, draws: int, gauss: bool) -> None:
    rng = random.Random(seed)
    for _ in range(draws):
        rng.random()
    if gauss:
        rng.gauss(0, 1)  # leaves a cached second Gaussian
    fast, slow = _fast_and_slow(fingerprint.python_random, rng)
    assert fast == slow


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), draws=st.integers(0, 700), normals=st.integers(0, 3))
def test_numpy_random_state_fast_equals_slow(seed: int, draws: int, normals: int) -> None:
    rs = np.random.RandomState(seed)
    rs.random_sample(draws)
    for _ in range(normals):
        rs.standard_normal()  # odd counts leave a cached Gaussian
    fast, slow = _fast_and_slow(fingerprint.numpy_random_state, rs)
    assert fast == slow


def test_every_part_of_the_state_changes_the_fingerprint() -> None:
    rs = np.random.RandomState(5)
    before = fingerprint.numpy_random_state(rs)
    rs.standard_normal()  # key and pos change, and the Gaussian cache fills
    middle = fingerprint.numpy_random_state(rs)
    state = rs.get_state(legacy=False)
    state["gauss"] = 0.25  # only the cached Gaussian differs
    rs.set_state(state)
    assert len({before, middle, fingerprint.numpy_random_state(rs)}) == 3
    rng = random.Random(1)
    internal = rng.getstate()
    plain = fingerprint.python_random(rng)
    rng.gauss_next = 0.5  # type: ignore[attr-defined]
    assert fingerprint.python_random(rng) != plain
    rng.setstate(internal)
    assert fingerprint.python_random(rng) == plain


def test_other_generators_use_the_exact_slow_path(slow: None) -> None:
    pcg = np.random.RandomState(np.random.PCG64(1))
    assert fingerprint.numpy_random_state(pcg) == fingerprint.numpy_random_state(
        np.random.RandomState(np.random.PCG64(1))
    )
    assert fingerprint.of(random.SystemRandom()) is None  # no state to read


def test_the_first_fingerprint_inside_a_window_finds_the_layout(tmp_path: Path) -> None:
    """Finding the layout makes private generators: it must not record (or deadlock on) them."""
    from conftest import run_python

    code = (
        "import random, tempfile, rngaudit\n"
        "with rngaudit.audit(mode='report', report_dir=tempfile.mkdtemp()) as a:\n"
        "    random.random()\n"
        "print(sorted({e['generator'] for e in a.report.ranks[0]['events']}))\n"
    )
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['random (global)']"
