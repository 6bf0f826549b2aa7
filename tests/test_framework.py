"""Which framework drives the run, read from what is imported, and the seed advice in its words."""

from __future__ import annotations

import sys
import types

import pytest

from rngaudit.capture import framework

WATCHED = ("lightning.pytorch", "pytorch_lightning", "transformers.trainer", "accelerate.state")


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """None of the frameworks imported (the real ones, where other tests imported them, back
    after)."""
    for name in WATCHED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return monkeypatch


def _accelerate_state(shared: object) -> types.ModuleType:
    state = types.ModuleType("accelerate.state")
    state.PartialState = type("PartialState", (), {"_shared_state": shared})  # type: ignore[attr-defined]
    return state


def test_plain_torch_when_no_framework_is_imported_and_nothing_is_imported_to_tell(
    modules: pytest.MonkeyPatch,
) -> None:
    assert framework.detect() == framework.TORCH
    assert not any(name in sys.modules for name in WATCHED)


def test_accelerate_only_once_its_state_exists(modules: pytest.MonkeyPatch) -> None:
    modules.setitem(sys.modules, "accelerate.state", types.ModuleType("accelerate.state"))
    assert framework.detect() == framework.TORCH  # imported, no PartialState
    modules.setitem(sys.modules, "accelerate.state", _accelerate_state({}))
    assert framework.detect() == framework.TORCH  # imported, no Accelerator made
    modules.setitem(sys.modules, "accelerate.state", _accelerate_state({"backend": "gloo"}))
    assert framework.detect() == framework.ACCELERATE


@pytest.mark.parametrize("lightning", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_then_the_trainer_then_accelerate(
    modules: pytest.MonkeyPatch, lightning: str
) -> None:
    modules.setitem(sys.modules, "accelerate.state", _accelerate_state({"backend": "gloo"}))
    modules.setitem(sys.modules, "transformers.trainer", types.ModuleType("transformers.trainer"))
    assert framework.detect() == framework.HF_TRAINER  # the Trainer runs on accelerate
    modules.setitem(sys.modules, lightning, types.ModuleType(lightning))
    assert framework.detect() == framework.LIGHTNING


def test_the_seed_advice_names_each_frameworks_own_tool() -> None:
    assert "accelerate.utils.set_seed(SEED)" in framework.seed_advice(framework.ACCELERATE)
    assert "seed_everything(SEED)" in framework.seed_advice(framework.LIGHTNING)
    assert "TrainingArguments(seed=SEED" in framework.seed_advice(framework.HF_TRAINER)
    assert "torch.manual_seed(SEED)" in framework.seed_advice(framework.TORCH)
    assert framework.seed_advice("an unknown kind") == framework.seed_advice(framework.TORCH)
    advice = {
        framework.seed_advice(k)
        for k in (framework.ACCELERATE, framework.LIGHTNING, framework.HF_TRAINER, framework.TORCH)
    }
    assert len(advice) == 4
