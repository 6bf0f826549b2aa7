"""A Hugging Face ``TrainerCallback`` that audits from the Trainer's creation to the first step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from rngaudit.integrations._window import CallbackWindow
from rngaudit.with_block import WindowOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


class RNGAuditCallback(TrainerCallback):  # type: ignore[misc]
    """``Trainer(..., callbacks=[RNGAuditCallback()])``: one audit per ``Trainer``.

    Opens the audit when the Trainer is built (``on_init_end``: the process group exists,
    created by ``TrainingArguments``) and closes it at the first training step, after the
    training sampler drew the epoch-0 order; ranks compare there. ``evaluate()`` calls before
    ``train()`` are inside the window. Arguments are :func:`rngaudit.audit`'s.
    """

    def __init__(self, **options: Unpack[WindowOptions]) -> None:
        self.window = CallbackWindow(**options)

    @property
    def report(self) -> Any:
        """The audit's report after the first training step (None before)."""
        return self.window.report

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.open()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.close()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.window.close()  # training ended before a step
