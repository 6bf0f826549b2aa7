"""One audit window opened and closed from a framework's callback hooks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rngaudit.with_block import Audit, WindowOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


class CallbackWindow:
    """Opens :func:`rngaudit.audit` at one hook and closes it at a later one, once per run.

    Closing raises (mode ``raise``) on every rank from the closing hook, as the with-block
    does; a window still open when the framework reports an exception is closed quietly.
    """

    def __init__(self, **options: Unpack[WindowOptions]) -> None:
        unknown = sorted(set(options) - WindowOptions.__optional_keys__)
        if unknown:  # audit() takes more (every_epoch): not a callback's
            raise TypeError(f"RNGAuditCallback() got an unexpected keyword argument {unknown[0]!r}")
        self._options = options
        Audit(**options)  # bad arguments fail here, when the callback is built
        self.audit: Audit | None = None
        self.done = False

    @property
    def report(self) -> Any:
        """The :class:`~rngaudit.audit_report.AuditReport` once the window closed, else None."""
        return self.audit.report if self.audit is not None else None

    def open(self) -> None:
        if self.audit is None and not self.done:
            self.audit = Audit(**self._options)
            self.audit.__enter__()

    def close(self, exc: BaseException | None = None) -> None:
        if self.audit is None or self.done:
            return
        self.done = True
        if exc is None:
            self.audit.__exit__(None, None, None)
        else:
            self.audit.__exit__(type(exc), exc, exc.__traceback__)
