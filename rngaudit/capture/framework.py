"""Which framework drives this run, so that advice names the tools the user actually has."""

from __future__ import annotations

import sys

ACCELERATE, LIGHTNING, HF_TRAINER, TORCH = "accelerate", "lightning", "hf-trainer", "torch"

_SEED_ADVICE = {
    ACCELERATE: "accelerate.utils.set_seed(SEED) (without device_specific=True)",
    LIGHTNING: "lightning's seed_everything(SEED) with the same SEED on every rank",
    HF_TRAINER: "TrainingArguments(seed=SEED, data_seed=SEED) with the same SEED on every rank",
    TORCH: "torch.manual_seed(SEED) with the same SEED on every rank",
}


def detect() -> str:
    """The framework in use, from what is imported: Lightning, the Hugging Face Trainer,
    accelerate (an ``Accelerator`` state exists), else plain torch. Read, never imported."""
    if "lightning.pytorch" in sys.modules or "pytorch_lightning" in sys.modules:
        return LIGHTNING
    if "transformers.trainer" in sys.modules:
        return HF_TRAINER
    state = sys.modules.get("accelerate.state")
    if state is not None and getattr(getattr(state, "PartialState", None), "_shared_state", None):
        return ACCELERATE
    return TORCH


def seed_advice(kind: str) -> str:
    """How to seed every rank identically, in the words of ``kind``'s framework."""
    return _SEED_ADVICE.get(kind, _SEED_ADVICE[TORCH])
