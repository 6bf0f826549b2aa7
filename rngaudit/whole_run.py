"""The whole-run audit behind ``RNGAUDIT``: one window from start-up to the first iteration."""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from rngaudit import config, launcher, library_samplers, peek
from rngaudit.audit_report import AuditReport
from rngaudit.capture.callsite import here
from rngaudit.capture.instrument import torch_ops as instrument_torch
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER, Window
from rngaudit.epochs import order_check, partition, sharding
from rngaudit.errors import ConfigError
from rngaudit.ranks import exchange, group_end, session
from rngaudit.ranks import store as protocol

log = logging.getLogger("rngaudit")

EXIT_TIMEOUT = 10.0  # at interpreter exit, ranks wait less for each other
# The window's last checkpoint pairs across ranks whatever ended it on each rank.
END_LABELS = ("first DataLoader iteration", "destroy_process_group()", "process exit")

# (module, class, method, label) wrapped so ranks compare when prepare() returns.
PREPARE_HOOKS = (
    ("accelerate.accelerator", "Accelerator", "prepare", "Accelerator.prepare"),
    ("accelerate.data_loader", None, "prepare_data_loader", "prepare_data_loader"),
)
# The loops a forked DataLoader worker runs: such a child stays passive (it inherited the
# parent's pid, so every hook ignores it); any other child multiprocessing forks starts its own
# audit (a rank of notebook_launcher or start_processes(start_method="fork")).
LOADER_WORKER_LOOPS = (
    ("torch.utils.data._utils.worker", "_worker_loop"),
    ("torchdata.stateful_dataloader.worker", "_worker_loop"),
)
# Checkpoint restores: a finding made after one names it (Session.resumes).
RESUME_HOOKS = (
    ("accelerate.accelerator", "Accelerator", "load_state", "Accelerator.load_state"),
    (
        "torchdata.stateful_dataloader.stateful_dataloader",
        "StatefulDataLoader",
        "load_state_dict",
        "StatefulDataLoader.load_state_dict",
    ),
)
# Where iteration begins: the window closes there.
ITERATION_HOOKS = (
    ("torch.utils.data.dataloader", "DataLoader", "__iter__"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader", "__iter__"),
)


class WholeRun:
    """Records from start-up; concludes an audit at the end of every ``prepare()`` and when
    the first DataLoader iteration begins, then detaches from the hot paths.

    The process counts as a rank (and writes a rank file) once it joined a process group or
    reached a checkpoint (prepared or iterated a loader); a process that did neither (a
    launcher, pip, a helper) writes nothing at exit. A DataLoader worker detaches at start.
    """

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.session = session.for_dir(settings.report_dir, settings.mode)
        self.patches = PatchSet()  # the window's wraps and import hooks
        self.monitor_hooks = PatchSet()
        self.fork_hooks = PatchSet()  # the after-fork registration: for the life of the process
        self.resume_hooks = PatchSet()  # load_state() wraps: they outlive the window
        self._resuming = False
        self.window_open = False
        self.index = 0
        self.window: Window | None = None  # the recording window (its current segment)
        self.entry: dict[str, str | None] = {}
        self.reports: list[AuditReport] = []
        self._in_prepare = False
        self.monitor: Any = None
        try:
            self.epochs = config.env_epochs()
        except ConfigError as exc:  # an environment problem never stops the run
            sys.stderr.write(f"rngaudit: {exc}; checking every epoch\n")
            self.epochs = "all"
        # sequential loaders iterated once: held weakly (an id could name a later loader built
        # at the same address on one rank only, ending the window there alone)
        self._sequential: weakref.WeakSet[Any] = weakref.WeakSet()
        self.is_rank = False  # joined a process group, or prepared / iterated a loader
        self.worker = False  # a DataLoader worker: passive for good

    # -- lifecycle -----------------------------------------------------------------------
    def arm(self) -> None:
        instrument_torch.prepare()  # one-time kernel registration when torch is loaded already
        self._open()
        # The worker check outlives the window: its hook is not in the window's ledger.
        self.monitor_hooks.when_imported("torch.utils.data.dataloader", self._install_monitor)
        if self.epochs != "off":
            watch = order_check.Watch(
                self.settings, self.session, self.epochs == "all", self._before_raise
            )
            order_check.GUARD.watch_all(watch)
        self.fork_hooks.when_imported("multiprocessing.util", self._watch_forks)
        for module, cls, method, label in RESUME_HOOKS:
            self.resume_hooks.when_imported(module, self._resume_hook(cls, method, label))

    def _open(self) -> None:
        """Open the recording window and hook the checkpoints that conclude its segments."""
        self.index = self.session.reserve()
        self.entry = RECORDER.snapshot()
        # A framework callback's audit (Lightning, HF Trainer) may open inside this window
        # and close after it.
        self.window = RECORDER.begin(self.index, overlapping=True)
        self.window_open = True
        for module, cls, method, label in PREPARE_HOOKS:
            self.patches.when_imported(module, self._hook(cls, method, self._prepare(label)))
        for module, cls, method in ITERATION_HOOKS:
            self.patches.when_imported(module, self._hook(cls, method, self._iteration))
        # Called by every rank at the end of a run: ranks compare there if the window is open
        # (the group's end, step "window"; forgotten when the window's ledger is undone).
        group_end.before_destroy(group_end.WINDOW, self._destroy)
        self.patches.add_undo(lambda: group_end.forget_destroy(group_end.WINDOW))

    def _resume_hook(self, cls: str, method: str, label: str) -> Callable[[Any], None]:
        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            if self._resuming or self.worker:  # load_state() restoring its loaders: one resume
                return wrapped(*args, **kw)
            self._resuming = True
            try:
                result = wrapped(*args, **kw)
            finally:
                self._resuming = False
            try:
                stack = here(1)
                where = stack.user_site or stack.call_site
                resume = f"{label}() at {where.short()}" if where else f"{label}()"
                if resume not in self.session.resumes:
                    self.session.resumes.append(resume)
            except Exception:
                log.debug("rngaudit: could not name a resume", exc_info=True)
            return result

        def hook(module: Any) -> None:
            if not launcher.forked_since(self.pid):
                self.resume_hooks.wrap_path(module, f"{cls}.{method}", wrapper)

        return hook

    def _watch_forks(self, util: Any) -> None:
        """Children that multiprocessing forks call :meth:`forked` before their target runs
        (``util._run_after_forkers``: inherited by their own children too)."""
        if not launcher.forked_since(self.pid):
            util.register_after_fork(self, WholeRun.forked)

    def forked(self) -> None:
        """In a child multiprocessing forked (its ``Process`` is current, its target not run
        yet): a DataLoader worker stays passive; any other child is a new rank candidate and
        starts its own whole-run audit, as a process started with ``RNGAUDIT`` set does. Its
        exit runs multiprocessing's finalizers, not ``atexit``: the exit check is one of them.
        Never raises."""
        if self.worker or not launcher.forked_since(self.pid):
            return
        try:
            import multiprocessing
            from multiprocessing import util

            if _runs_loader_worker(multiprocessing.current_process()):
                return
            self.pid = os.getpid()
            self.patches.undo()  # the parent's wraps, as this child inherited them
            self.session.forked()
            self.reports, self.is_rank, self._in_prepare = [], False, False
            self._sequential = weakref.WeakSet()
            self._open()
            util.Finalize(None, self.at_exit, exitpriority=100)
        except Exception as exc:  # never break the child over the auditor
            self.window_open = False
            sys.stderr.write(f"rngaudit: a forked process runs unaudited ({exc!r})\n")

    def become_worker(self) -> None:
        """This process is a DataLoader worker (spawned): record nothing, write nothing."""
        if self.worker:
            return
        self.worker = True
        self.window_open = False
        RECORDER.end_all()
        self.window = None
        self.patches.undo()
        self.monitor_hooks.undo()
        self.resume_hooks.undo()
        if self.monitor is not None:
            self.monitor.uninstall()

    def _hook(self, cls: str | None, method: str, wrapper: Any) -> Callable[[Any], None]:
        def hook(module: Any) -> None:
            if not launcher.forked_since(self.pid):  # routed while the window's ledger holds it
                self.patches.wrap_path(module, f"{cls}.{method}" if cls else method, wrapper)

        return hook

    def _install_monitor(self, module: Any) -> None:
        if launcher.forked_since(self.pid) or self.monitor is not None or self.worker:
            return
        from rngaudit.workers.monitor import WorkerMonitor

        self.monitor = WorkerMonitor(
            self.session.add_finding, self.settings.mode, min(self.settings.timeout, 30.0)
        )
        self.monitor.install()

    # -- checkpoints ---------------------------------------------------------------------
    def _prepare(self, label: str) -> Any:
        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            if not self.window_open or self._in_prepare or RECORDER.busy():
                return wrapped(*args, **kw)
            self._in_prepare = True
            try:
                result = wrapped(*args, **kw)
            finally:
                self._in_prepare = False
            stack = here(1)
            where = stack.user_site or stack.call_site
            self.checkpoint(f"{label}() at {where.short()}" if where else f"{label}()")
            return result

        return wrapper

    def _iteration(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        if (
            self.window_open
            and not RECORDER.busy()
            and not launcher.forked_since(self.pid)
            and self._ends_window(instance)
        ):
            self.close_window("first DataLoader iteration")
        return wrapped(*args, **kw)

    def _ends_window(self, loader: Any) -> bool:
        """The training loader's first iteration ends the window: in a distributed run, a
        sharded loader that shuffles (or a sequential one's second epoch); evaluation, sanity
        check and unsharded loaders are recorded, not an end. Alone, any loader ends it."""
        if exchange.distributed() is None and launcher.world_size() <= 1:
            return True
        if not sharding.loader_is_sharded(loader):
            # a shuffled loader over a split or shard of its own (``Subset(ds, order[rank::
            # world])``): the partition is in its dataset, compared when the window closes
            nodes = library_samplers.loader_chain(loader)
            return sharding.is_shuffling(nodes) and partition.holds_split(
                peek.attr(loader, "dataset")
            )
        if sharding.is_shuffling(library_samplers.loader_chain(loader)):
            return True
        try:
            if loader in self._sequential:
                return True
            self._sequential.add(loader)
        except Exception:  # no weak reference, or a __hash__ / __eq__ of its own that raises:
            pass  # each of its epochs is taken for its first (never an error of the auditor's)
        return False

    def _before_raise(self, label: str) -> None:
        """An epoch's check is about to raise on every rank: conclude the open window first
        (every rank's record, with its events, in the report) and keep recording. (The check
        runs with the recorder paused: no busy test here.)"""
        if self.window_open and not launcher.forked_since(self.pid):
            self.checkpoint(
                f"before raising at {label}",
                timeout=min(self.settings.timeout, EXIT_TIMEOUT),
                raising=False,
            )

    def _destroy(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        """Before the process group goes, compare what is still open (all ranks call this)."""
        if (
            self.window_open
            and not launcher.forked_since(self.pid)
            and exchange.process_group() is not None
        ):
            self._final("destroy_process_group()")
        return wrapped(*args, **kw)

    def checkpoint(self, label: str, timeout: float | None = None, raising: bool = True) -> None:
        """Conclude the audit segment recorded so far, start the next one, act on it.

        Reaching a checkpoint (prepare() or iteration) makes this process a rank.
        """
        self.is_rank = True
        self._checkpoint(label, timeout, raising)

    def _checkpoint(self, label: str, timeout: float | None, raising: bool) -> None:
        assert self.window is not None
        how = session.Closing(
            timeout=timeout or self.settings.timeout,
            strict=self.settings.strict,
            close=False,
            identity="end of the audit window" if label in END_LABELS else None,
            acting=raising,
            on_concluded=self._concluded,
        )
        self.session.finish(self.window, label, self.entry, how)

    def _concluded(self, done: session.Finished | None) -> None:
        """The segment is concluded (before acting on it): the next one begins."""
        if done is not None and done.window is not None:
            self.reports.append(done.report)
            self.window = done.window
            self.index = done.window.index
            self.entry = done.exit_states

    def close_window(self, label: str) -> None:
        """Compare once more, then detach from every hot path (the worker check stays)."""
        self.window_open = False
        try:
            self.checkpoint(label)
        finally:
            self._detach()

    def _detach(self) -> None:
        """Close the recording window and remove the prepare()/iteration wrappers."""
        window, self.window = self.window, None
        if window is not None:
            RECORDER.end(window)
        self.patches.undo()

    def at_exit(self) -> None:
        """Leave a report also for ranks that never prepared nor iterated (but joined a
        process group); a process that is not a rank leaves nothing."""
        if launcher.forked_since(self.pid) or self.worker:
            return
        if self.window_open:
            if exchange.process_group() is not None:
                self.is_rank = True
            if self.is_rank:
                self._final("process exit")
            else:
                self.window_open = False
                self._detach()
        self.session.at_exit()
        protocol.settle()  # a store wait of the exit exchange still live aborts finalization

    def _final(self, label: str) -> None:
        """The last checkpoint: it never raises (the run is ending); a verdict goes to stderr."""
        self.window_open = False
        try:
            self._checkpoint(label, timeout=min(self.settings.timeout, EXIT_TIMEOUT), raising=False)
            report = self.reports[-1]
            if report.verdict != "ok":
                sys.stderr.write(
                    f"rngaudit: {report.verdict} at {label}; see "
                    f"{self.session.report_dir}/report.json\n"
                )
        except Exception as exc:
            kept = self.session.write_known()
            sys.stderr.write(
                f"rngaudit: could not conclude the audit at {label}: {cause(exc)}; "
                + (
                    f"{self.session.report_dir} holds what was filed before it\n"
                    if kept
                    else "writing what was filed failed too\n"
                )
            )
        finally:
            self._detach()


def cause(exc: BaseException) -> str:
    """One line naming a failure: its type, the package it was raised in, its first sentence."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = ""
    if frame is not None:
        path = frame.tb_frame.f_code.co_filename.replace(os.sep, "/")
        for package in ("rngaudit", "torch", "accelerate", "torchdata"):
            if f"/{package}/" in path:
                where = f" in {package}"
                break
    try:
        text = str(exc).strip()
    except Exception:  # an exception whose str() raises: named by its type alone
        text = ""
    text = text.splitlines()[0].split(". ")[0][:160] if text else ""
    return f"{type(exc).__name__}{where}" + (f" ({text})" if text else "")


def _runs_loader_worker(process: Any) -> bool:
    """Whether ``process`` (a multiprocessing ``Process``) runs a DataLoader worker loop."""
    target = getattr(process, "_target", None)
    target = getattr(target, "__wrapped__", target)  # startup's wrap of a spawned worker's loop
    where = (getattr(target, "__module__", None), getattr(target, "__qualname__", None))
    return where in LOADER_WORKER_LOOPS
