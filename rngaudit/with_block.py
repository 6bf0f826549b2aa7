"""The public ``audit()`` context manager and decorator: one recording window, one verdict."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from contextlib import ContextDecorator
from types import TracebackType
from typing import Any, TypedDict, TypeVar

from rngaudit import config, peek
from rngaudit.audit_report import AuditReport
from rngaudit.capture import instrument as instrumentation  # noqa: F401  (registers the installer)
from rngaudit.capture.callsite import here
from rngaudit.capture.instrument import torch_ops as instrument_torch
from rngaudit.capture.recorder import RECORDER, Window
from rngaudit.epochs import order_check
from rngaudit.errors import RNGAuditError
from rngaudit.findings import Finding
from rngaudit.ranks import exchange, layout, session
from rngaudit.ranks.policy import act

log = logging.getLogger("rngaudit")
_F = TypeVar("_F", bound=Callable[..., Any])


class WindowOptions(TypedDict, total=False):
    """The keyword arguments of :func:`audit` that a framework callback takes too
    (``RNGAuditCallback(mode="warn")``); their defaults are :class:`Audit`'s."""

    mode: str
    report_dir: str | os.PathLike[str] | None
    timeout: float | None
    strict: bool


def audit(
    *,
    mode: str = "raise",
    report_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    strict: bool = False,
    every_epoch: bool = False,
    groups: Sequence[Sequence[int]] | None = None,
) -> Audit:
    """Audit the randomness drawn inside a ``with`` block (or a decorated function).

    ``mode``: ``"raise"`` (raise on an error finding, on every rank), ``"warn"`` (emit
    :class:`RNGAuditWarning`) or ``"report"`` (only write the report). ``strict`` also
    treats warning findings as errors. ``report_dir`` defaults to ``$RNGAUDIT_REPORT_DIR``
    or ``./rngaudit-report``; ``timeout`` (seconds a rank waits for the others) to
    ``$RNGAUDIT_TIMEOUT`` or 120 (above 0, at most 86400). An unusable argument raises
    :class:`~rngaudit.errors.ConfigError`; an unusable environment value gives one
    :class:`RNGAuditWarning` and its default.

    Sharded loaders (prepared by accelerate, or with a ``DistributedSampler``) built or iterated
    inside the block are checked at their first batch: every rank must be about to shard the
    same order of the same dataset. ``every_epoch=True`` repeats that check at every epoch.

    ``groups``: the data-parallel groups (lists of ranks, as DDP's process groups would be
    given), for the process, ahead of what a ``DeviceMesh`` says (docs/with-tensor-
    parallelism.md); a rank's position in its group is its replica, and the ranks at one
    position are peers fed the same batch (``[[0, 2], [1, 3]]``: ranks 0 and 1 are peers).
    Also ``$RNGAUDIT_DP_GROUPS="0,2;1,3"``.
    """
    return Audit(
        mode=mode,
        report_dir=report_dir,
        timeout=timeout,
        strict=strict,
        every_epoch=every_epoch,
        groups=groups,
    )


class Audit(ContextDecorator):
    """One audit window. After exit, ``report`` holds the :class:`AuditReport`."""

    def __init__(
        self,
        *,
        mode: str = "raise",
        report_dir: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        strict: bool = False,
        every_epoch: bool = False,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.settings = config.resolve(mode, report_dir, timeout, strict)
        if groups is not None:
            layout.declare(groups)
        instrument_torch.prepare()  # one-time kernel registration: here, not in the window
        self.every_epoch = bool(every_epoch)
        self._args: dict[str, Any] = {
            "mode": mode,
            "report_dir": report_dir,
            "timeout": timeout,
            "strict": strict,
            "every_epoch": every_epoch,
            "groups": groups,
        }
        self.report: AuditReport | None = None
        self._window: Window | None = None
        self._index = 0
        self._entry: dict[str, str | None] = {}
        self._label = ""
        self._session: session.Session | None = None

    def _recreate_cm(self) -> Audit:
        return Audit(**self._args)  # each decorated call gets its own window

    def __call__(self, func: _F) -> _F:
        """Decorate a plain function; a generator or coroutine function is refused."""
        kind = _deferred_kind(func)
        if kind:
            name = getattr(func, "__qualname__", repr(func))
            raise TypeError(
                f"rngaudit.audit() cannot decorate {kind} {name}: calling it only creates "
                "the generator or coroutine, its body runs later (between next() calls or "
                "awaits, interleaved with other code), so the window would audit nothing. "
                "Put `with rngaudit.audit():` inside it, around the set-up to check."
            )
        return super().__call__(func)

    def __enter__(self) -> Audit:
        if self._window is not None:
            raise RNGAuditError("this audit() is already active; create a new one to nest")
        stack = here(1)
        where = stack.user_site or stack.call_site
        self._label = f"audit at {where.short()}" if where else "audit"
        self._session = session.for_dir(self.settings.report_dir, self.settings.mode)
        self._index = self._session.reserve()
        self._entry = RECORDER.snapshot()
        self._window = RECORDER.begin(self._index)
        self._watch = order_check.Watch(self.settings, self._session, self.every_epoch)
        order_check.GUARD.enter(self._watch)
        self._worker_findings: list[Finding] = []
        self._monitor = _worker_monitor(self._session, self._worker_findings, self.settings)
        self._started: weakref.WeakSet[Any] = weakref.WeakSet()  # started workers in the block
        if self._monitor is not None:
            self._monitor.on_start = self._started.add
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        window, self._window = self._window, None
        assert window is not None and self._session is not None
        built: list[Any] = []

        def closed(loaders: list[Any]) -> None:
            built.extend(loaders)
            if self._monitor is not None:
                _keep_until_started(self._monitor, loaders, self._started)

        def concluded(done: session.Finished | None) -> None:
            # Sharded loaders built in the block stay watched until their first batch, unless
            # the block already found an error (the same harm is not reported twice).
            self.report = None if done is None else done.report
            reported = self.report is None or self.report.verdict == "error"
            order_check.GUARD.leave(self._watch, [] if reported else built)

        # The verdict is decided here; the report files are written after the block exits.
        # Worker findings are local to this rank: reported, never part of the shared verdict
        # (a confirmed duplicate stream raises from the loader's first batch instead).
        how = session.Closing(
            timeout=self.settings.timeout,
            strict=self.settings.strict,
            close=True,
            exception=describe_exception(exc_type, exc),
            interrupted=exc_type is not None and not issubclass(exc_type, Exception),
            left=exchange.leaving(exc)
            if exc is not None and not isinstance(exc, Exception)
            else None,
            background_write=True,
            acting=exc_type is None,
            on_closed=closed,
            on_concluded=concluded,
            local_findings=self._worker_findings,
            spare_user_exception=exc_type is not None,
        )
        self._session.finish(window, self._label, self._entry, how)
        return None


def _deferred_kind(func: Callable[..., Any]) -> str:
    """What kind of function runs its body after the call returns, or ``""``."""
    if inspect.isasyncgenfunction(func):
        return "the async generator function"
    if inspect.iscoroutinefunction(func):
        return "the coroutine function (async def)"
    if inspect.isgeneratorfunction(func):
        return "the generator function"
    return ""


def describe_exception(
    exc_type: type[BaseException] | None, exc: BaseException | None
) -> str | None:
    """``ValueError: message`` (cut to 300 characters) for the rank record, None without one."""
    if exc_type is None:
        return None
    text = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
    return text if len(text) <= 300 else text[:299] + "…"


def _worker_monitor(sess: session.Session, seen: list[Finding], settings: config.Settings) -> Any:
    """Watch DataLoader workers started inside the window (only if torch is loaded)."""
    if "torch" not in sys.modules:
        return None
    from rngaudit.workers.monitor import WorkerMonitor

    def sink(finding: Finding) -> None:
        seen.append(finding)
        sess.add_finding(finding)

    monitor = WorkerMonitor(sink, settings.mode, min(settings.timeout, 30.0))
    monitor.install()
    return monitor


def _keep_until_started(monitor: Any, built: list[Any], already: weakref.WeakSet[Any]) -> None:
    """Keep the worker check for the loaders with workers built in the block until each has
    started them (accelerate's default loader starts its workers after ``prepare()``); then
    uninstall it. Started iterators keep their first-batch check."""
    waiting: weakref.WeakSet[Any] = weakref.WeakSet()

    def done(loader: Any = None) -> None:
        if loader is not None:
            waiting.discard(loader)
        # the live ones: a loader's finalizer can run before the WeakSet drops it
        if not any(True for _ in waiting):
            monitor.on_start = None
            monitor.uninstall()

    for loader in built:
        with contextlib.suppress(Exception):
            if peek.integer(peek.attr(loader, "num_workers"), 0) > 0 and loader not in already:
                waiting.add(loader)
                weakref.finalize(loader, done)  # a loader dropped unstarted: stop waiting
    monitor.on_start = done
    done()


__all__ = ["Audit", "act", "audit"]
