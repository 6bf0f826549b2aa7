"""A Lightning ``Callback`` auditing from the process group's creation to the first batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rngaudit.integrations._window import CallbackWindow
from rngaudit.with_block import WindowOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:  # the unified package first, then the standalone one; neither is a dependency
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning import Callback as _Callback


class RNGAuditCallback(_Callback):  # type: ignore[misc]
    """``Trainer(callbacks=[RNGAuditCallback()])``: one audit per ``fit()``.

    Opens the audit in ``setup`` (Lightning has created the process group by then) and closes
    it at the first training batch, after the injected ``DistributedSampler`` drew the epoch-0
    order; ranks compare there. Evaluation and sanity-check loaders iterated before it are
    inside the window. Arguments are :func:`rngaudit.audit`'s.
    """

    def __init__(self, **options: Unpack[WindowOptions]) -> None:
        super().__init__()
        self.window = CallbackWindow(**options)

    @property
    def report(self) -> Any:
        """The audit's report after the first training batch (None before)."""
        return self.window.report

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.window.open()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.window.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.window.close(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.window.close()  # fit() ended before any training batch
