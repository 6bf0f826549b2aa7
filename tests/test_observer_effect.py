"""Zero observer effect: audited runs draw bit-identical values, and every patch is undone."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_python
from hypothesis import given, settings
from hypothesis import strategies as st

import rngaudit
from rngaudit.instrument.numpy_random import DRAWS as NUMPY_DRAWS
from rngaudit.instrument.python_random import DRAWS as PY_DRAWS
from rngaudit.instrument.torch_ops import intercepting

Op = Callable[[dict[str, Any]], Any]


def _split() -> list[list[int]]:
    dataset: Any = range(9)
    parts: Any = torch.utils.data.random_split(dataset, [4, 5])
    return [list(p) for p in parts]


def _t(x: torch.Tensor) -> bytes:
    return bytes(x.detach().reshape(-1).contiguous().numpy().tobytes())


OPS: dict[str, Op] = {
    "torch.rand": lambda s: _t(torch.rand(5)),
    "torch.randn": lambda s: _t(torch.randn(3, 2)),
    "torch.randint": lambda s: _t(torch.randint(0, 100, (4,))),
    "torch.randperm": lambda s: _t(torch.randperm(17)),
    "torch.randperm(gen)": lambda s: _t(torch.randperm(17, generator=s["g"])),
    "torch.rand(gen)": lambda s: _t(torch.rand(3, generator=s["g"])),
    "tensor.uniform_": lambda s: _t(torch.empty(4).uniform_()),
    "tensor.normal_(gen)": lambda s: _t(torch.empty(4).normal_(generator=s["g"])),
    "tensor.random_": lambda s: _t(torch.empty((), dtype=torch.int64).random_()),
    "bernoulli": lambda s: _t(torch.bernoulli(torch.full((6,), 0.5))),
    "multinomial": lambda s: _t(torch.multinomial(torch.ones(5), 3)),
    "dropout": lambda s: _t(torch.nn.functional.dropout(torch.ones(8), 0.5)),
    "nn.init": lambda s: _t(torch.nn.Linear(3, 3).weight),
    "random_split": lambda s: _split(),
    "torch.manual_seed": lambda s: torch.manual_seed(s["seed"]).initial_seed(),
    "random.random": lambda s: random.random(),
    "random.shuffle": lambda s: (lambda x: (random.shuffle(x), x)[1])(list(range(8))),
    "random.choice": lambda s: random.choice("abcdef"),
    "random.gauss": lambda s: random.gauss(0, 1),
    "random.Random": lambda s: s["r"].random(),
    "random.Random.sample": lambda s: s["r"].sample(range(20), 4),
    "random.seed": lambda s: random.seed(s["seed"]),
    "np.random.rand": lambda s: np.random.rand(3).tobytes(),
    "np.random.randint": lambda s: np.random.randint(0, 50, 4).tobytes(),
    "np.random.permutation": lambda s: np.random.permutation(9).tobytes(),
    "np.random.seed": lambda s: np.random.seed(s["seed"] % 2**32),
    "np.Generator": lambda s: s["n"].random(3).tobytes(),
    "np.default_rng": lambda s: np.random.default_rng(s["seed"]).integers(0, 9, 3).tobytes(),
    "np.RandomState": lambda s: s["rs"].rand(2).tobytes(),
}


def run(seed: int, ops: list[str]) -> list[Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    state = {
        "seed": seed + 1,
        "g": torch.Generator().manual_seed(seed + 2),
        "r": random.Random(seed + 3),
        "n": np.random.default_rng(seed + 4),
        "rs": np.random.RandomState(seed % 2**32),
    }
    out = [OPS[name](state) for name in ops]
    out.append(_t(torch.get_rng_state()))
    out.append(random.getstate())
    out.append(repr(np.random.get_state(legacy=False)))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**40), ops=st.lists(st.sampled_from(sorted(OPS)), max_size=25))
def test_audited_and_unaudited_runs_draw_bit_identical_values(
    seed: int, ops: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    plain = run(seed, ops)
    with rngaudit.audit(mode="report", report_dir=tmp_path_factory.mktemp("r")):
        audited = run(seed, ops)
    assert audited == plain


def _patched_surface() -> dict[str, Any]:
    """Every attribute any instrumentation patches, by identity."""
    import numpy.random as npr
    import torch.cuda
    import torch.random

    surface: dict[str, Any] = {}
    for mod in (torch, torch.random, torch.cuda):
        for name in (
            "manual_seed",
            "seed",
            "set_rng_state",
            "fork_rng",
            "manual_seed_all",
            "seed_all",
            "set_rng_state_all",
        ):
            if hasattr(mod, name):
                surface[f"{mod.__name__}.{name}"] = getattr(mod, name)
    for name in (*PY_DRAWS, "seed", "setstate"):
        if hasattr(random, name):
            surface[f"random.{name}"] = getattr(random, name)
        surface[f"Random.__dict__.{name}"] = random.Random.__dict__.get(name)
    for name in (*NUMPY_DRAWS, "seed", "set_state", "default_rng"):
        if hasattr(npr, name):
            surface[f"numpy.random.{name}"] = getattr(npr, name)
    return surface


def _assert_restored(before: dict[str, Any]) -> None:
    after = _patched_surface()
    assert after.keys() == before.keys()
    for key, original in before.items():
        assert after[key] is original, key
    assert not intercepting()


def test_originals_are_restored_after_a_normal_exit(report_dir: Path) -> None:
    before = _patched_surface()
    with rngaudit.audit(report_dir=report_dir):
        assert torch.manual_seed is not before["torch.manual_seed"]
        assert random.random is not before["random.random"]
        assert intercepting()
        torch.rand(1)
    _assert_restored(before)


class Boom(Exception):
    pass


def test_originals_are_restored_and_the_exception_propagates_unchanged(report_dir: Path) -> None:
    before = _patched_surface()
    boom = Boom("user error")
    with pytest.raises(Boom) as caught, rngaudit.audit(report_dir=report_dir) as a:
        torch.rand(1)
        raise boom
    assert caught.value is boom
    _assert_restored(before)
    assert a.report is not None  # the report is still written
    assert rngaudit.wait_for_reports()
    assert (report_dir / "report.json").exists()


def test_originals_are_restored_after_nested_use(report_dir: Path) -> None:
    before = _patched_surface()
    with rngaudit.audit(report_dir=report_dir):
        with rngaudit.audit(report_dir=report_dir):
            random.random()
        assert random.random is not before["random.random"]  # outer window still open
        random.random()
    _assert_restored(before)


def test_an_audit_object_cannot_be_entered_twice(report_dir: Path) -> None:
    a = rngaudit.audit(report_dir=report_dir)
    with a, pytest.raises(rngaudit.RNGAuditError):
        a.__enter__()


def test_forked_workers_do_not_inherit_the_instrumentation(tmp_path: Path) -> None:
    import json

    from conftest import run_python

    proc = run_python(["tests/envmode/forked_worker_mode.py", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [1.0, 1.0, 1.0, 1.0]


COMPILE_BACKENDS = ["aot_eager", "inductor"]


@pytest.fixture(scope="module")
def compiled_dropout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One process runs each backend unaudited then audited (dynamo reset, seeded, in between)."""
    report_root = tmp_path_factory.mktemp("compiled")
    backends = COMPILE_BACKENDS if shutil.which("cc") or shutil.which("gcc") else ["aot_eager"]
    script = "tests/envmode/compiled_dropout.py"
    proc = run_python([script, str(report_root), *backends], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return report_root, json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_torch_compile_with_dropout_is_bit_identical_and_stays_compiled(
    compiled_dropout: tuple[Path, dict[str, Any]], backend: str
) -> None:
    report_root, runs = compiled_dropout
    if f"{backend} plain" not in runs:
        pytest.skip("inductor on CPU needs a C compiler")
    lines, expected = runs[f"{backend} audited"], runs[f"{backend} plain"]
    assert lines[:2] == expected[:2]  # same values inside and after the window
    assert expected[2] == "graphs 1 frames {'total': 1, 'ok': 1}"
    # compiled, never skipped: once more after the window at most (dynamo guards on the
    # thread's dispatch keys, and the window's key is switched off when it closes)
    assert lines[2] in (expected[2], "graphs 2 frames {'total': 2, 'ok': 2}"), lines[2]
    assert lines[3] == "stack 0"
    events = json.loads((report_root / backend / "report.json").read_text())["ranks"][0]["events"]
    drawn = {e["op"] for e in events if e["op"].startswith("aten.")}
    assert drawn == ({"aten.random_"} if backend == "inductor" else {"aten.native_dropout"}), drawn
