"""The recorder: turns intercepted calls into events, with call sites, phases and samplers."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from threading import current_thread
from typing import Any

from rngaudit import forksafe, library_samplers, schema
from rngaudit.capture import callsite, fingerprint, naming
from rngaudit.capture.event_log import ITERATION, PRE_ITERATION, Event, EventLog, SamplerInfo
from rngaudit.capture.fingerprint import TorchFingerprint
from rngaudit.capture.naming import BEYOND_MARK
from rngaudit.capture.patching import PatchSet
from rngaudit.errors import RNGAuditError

log = logging.getLogger("rngaudit")

# Roles of marked code objects (see callsite.MARKED_CODES).
ROLE_SAMPLER = "sampler"
ROLE_LOADER = "loader"
ROLE_ITERATION = "iteration"

GenInfo = tuple[str, Callable[[], "str | None"]]


@dataclass(frozen=True, eq=False)
class Window:
    """An open recording window: the token :meth:`Recorder.begin` returns."""

    index: int  # the audit index its events are labelled with
    start: int  # the sequence number from which its events count
    thread: int  # the ident of the thread that opened it
    overlapping: bool = False  # may end before windows opened after it (see Recorder.begin)


class Recorder:
    """Process-wide recorder. Instrumentation calls :meth:`call`; audits open windows."""

    def __init__(self) -> None:
        self.log = EventLog()
        self.names = naming.GeneratorNames(naming.NAMED_PER_FAMILY)
        self.patches = PatchSet()
        self.enabled = False
        self.audit_index = 0
        self.iteration_started = False
        self._local = threading.local()
        self._depth = 0
        self._outer_indices: list[int] = []
        self.new_loaders: list[Any] = []  # DataLoaders built while a window is open
        self._window_lock = forksafe.lock()
        self._fork_handler = False
        self._thread_windows: dict[int, list[Window]] = {}  # thread ident -> its open windows
        self.torch: Any = None  # the TorchInstrumentation while installed (per-thread modes)
        # Installs the instrumentation for an outermost window (rngaudit.capture.instrument
        # registers it: the recorder does not import the instrumentation).
        self.installer: Callable[[Recorder], None] | None = None

    # -- windows ---------------------------------------------------------------------------
    def begin(self, audit_index: int | None = None, *, overlapping: bool = False) -> Window:
        """Open a recording window (nested windows share the instrumentation); returns its
        token, for :meth:`events_since`, :meth:`new_segment` and :meth:`end`.

        Its events are labelled ``audit_index`` (default: the enclosing window's).
        ``overlapping``: the window may end while windows opened after it are still open (the
        whole-run audit's, which a framework callback's audit can outlive).
        """
        with self._window_lock:
            if self._depth == 0:
                if self.installer is None:
                    raise RNGAuditError("no instrumentation registered (import rngaudit first)")
                if not self._fork_handler:
                    os.register_at_fork(after_in_child=self.disable_in_child)
                    self._fork_handler = True
                self.enabled = True
                try:
                    self.installer(self)
                except BaseException:
                    self.uninstrument()
                    raise
            elif self.torch is not None:
                self.torch.push_here()  # a window on another thread: its own mode
            index = self.audit_index if audit_index is None else audit_index
            window = Window(index, self.log.next_seq(), threading.get_ident(), overlapping)
            self._thread_windows.setdefault(window.thread, []).append(window)
            self._depth += 1
            self._outer_indices.append(self.audit_index)
            self.audit_index = index
            return window

    def events_since(self, window: Window) -> list[schema.Event]:
        """The window's events (so far) as report dicts, labelled with its audit index."""
        out = []
        for event in self.log.since(window.start):
            data = event.to_dict()
            data["audit"] = window.index
            out.append(data)
        return out

    def new_segment(self, window: Window, audit_index: int) -> Window:
        """Keep ``window`` open but count from now, as audit ``audit_index`` (the whole-run
        audit's next segment); returns the token that replaces ``window``."""
        with self._window_lock:
            stack = self._stack_of(window)
            segment = Window(audit_index, self.log.next_seq(), window.thread, window.overlapping)
            stack[stack.index(window)] = segment
            self.audit_index = audit_index
            return segment

    def built_loaders(self) -> list[Any]:
        """The DataLoaders built since the window (segment) began."""
        with self._window_lock:
            return list(self.new_loaders)

    def forget_loaders(self) -> list[Any]:
        """The DataLoaders built since the window (segment) began; forgotten from now."""
        with self._window_lock:
            built, self.new_loaders = self.new_loaders, []
            return built

    def end(self, window: Window) -> dict[str, str | None]:
        """Close ``window``, which must be the innermost open on the thread that opened it,
        unless it was opened ``overlapping`` (:class:`RNGAuditError` otherwise, and nothing
        changes); returns generator states at its end. The outermost window's end undoes
        every patch and pops the dispatch mode.
        """
        with self._window_lock:
            self._stack_of(window)
            return self._end(window.thread, window)

    def end_all(self) -> None:
        """Close every window still open (a process that turns out to be a DataLoader worker)."""
        with self._window_lock:
            while self._depth:
                self._end(threading.get_ident())

    def _stack_of(self, window: Window) -> list[Window]:
        stack = self._thread_windows.get(window.thread) or []
        innermost = bool(stack) and stack[-1] is window
        if not innermost and not (window.overlapping and any(w is window for w in stack)):
            raise RNGAuditError(
                "rngaudit: a recording window was closed out of order (it is not the innermost "
                "window open on its thread, or it is closed already)"
            )
        return stack

    def _end(self, opener: int, window: Window | None = None) -> dict[str, str | None]:
        try:
            states = self.snapshot()
        except Exception:
            states = {}
        self._depth = max(0, self._depth - 1)
        self.audit_index = self._outer_indices.pop() if self._outer_indices else 0
        stack = self._thread_windows.get(opener)
        if stack:
            stack.pop(stack.index(window) if window is not None else -1)
        if not stack:
            self._thread_windows.pop(opener, None)
            if self._depth > 0 and self.torch is not None:
                self.torch.pop_here()  # this thread's last window: undo its own push
        if self._depth == 0:
            self._thread_windows.clear()
            self.uninstrument()
            self.names.clear()
            self.new_loaders.clear()
            self.log = EventLog()
        return states

    @property
    def depth(self) -> int:
        return self._depth

    # -- lifecycle -----------------------------------------------------------------------
    def uninstrument(self) -> None:
        """Undo every patch, mark and hook and pop every mode, last first (the ledger
        ``patches``). Safe on error paths."""
        self.enabled = False
        self.patches.undo()

    def disable_in_child(self) -> None:
        """After fork: a child (DataLoader worker) must not record, nor pay for the
        instrumentation it inherited: pop the dispatch mode, undo every patch."""
        self.enabled = False
        self._depth = 0
        self._outer_indices.clear()
        self._thread_windows.clear()
        # (its locks, _window_lock among them, are re-initialised by rngaudit.forksafe)
        # A child that opens its own window (a forked rank) counts its draws afresh: an event
        # the parent recorded at the same place must not absorb them.
        self.log = EventLog()
        self.new_loaders = []
        try:
            if self.torch is not None:
                self.torch.forget_other_threads()
            self.uninstrument()
        except Exception:  # never break a worker over the auditor
            log.debug("rngaudit: could not uninstrument a forked child", exc_info=True)

    # -- recording -------------------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is recorded inside (the auditor's own work on this thread)."""
        local = self._local
        was = getattr(local, "busy", False)
        local.busy = True
        try:
            yield
        finally:
            local.busy = was

    def busy(self) -> bool:
        return bool(getattr(self._local, "busy", False))

    def call(
        self,
        wrapped: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        generator: Callable[[callsite.Stack], GenInfo | None],
        op: str,
        kind: str,
        skip_stdlib_callers: bool = False,
    ) -> Any:
        """Record one intercepted call, then make it, unchanged.

        ``generator(stack)`` names the generator and returns its fingerprint function; it runs
        before the call so the fingerprint is of the state the call draws from.
        """
        # The flag paused() sets, set inline: the context manager would cost ~1 us a draw.
        local = self._local
        if not self.enabled or getattr(local, "busy", False):
            return wrapped(*args, **kwargs)
        local.busy = True
        try:
            try:
                self.record(generator, op, kind, sys._getframe(1), skip_stdlib_callers)
            except Exception:  # the auditor must never break what it audits
                log.debug("rngaudit: recording failed", exc_info=True)
            return wrapped(*args, **kwargs)
        finally:
            local.busy = False

    def record(
        self,
        generator: GenInfo | Callable[[callsite.Stack], GenInfo | None],
        op: str,
        kind: str,
        frame: Any,
        skip_stdlib_callers: bool = False,
        found: list[Event] | None = None,
    ) -> Event | None:
        """Count one draw at ``frame``; returns the event when it is the first of its key.

        ``generator`` is the (name, fingerprint function) pair, or a function of the stack
        that returns it (None: nothing is recorded). The repeat path takes no lock.
        ``found``, if given, gets the event counted (new or not) appended.
        """
        if skip_stdlib_callers and callsite.stdlib_caller(frame):
            return None  # (before the walk: such draws come from deep stacks)
        stack = callsite.walk(frame)
        resolved = generator if generator.__class__ is tuple else generator(stack)  # type: ignore[operator]
        if resolved is None:
            return None
        gen_name, fp = resolved
        phase = ITERATION if self.iteration_started else PRE_ITERATION
        sampler = None
        marked = stack.marked
        if marked:  # only draws made inside known samplers/loaders have marked frames
            sampler = self._sampler_info(marked)
            if any(role == ROLE_ITERATION for role, _ in marked):
                phase = ITERATION
        # The thread is in the key, so only this thread ever bumps this event: the repeat path
        # needs no lock (a dict lookup is atomic). The Thread object (not its ident, which a
        # later thread may reuse) is cached per thread.
        local = self._local
        try:
            thread = local.thread
        except AttributeError:
            thread = local.thread = current_thread()
        key = (
            self.audit_index,
            gen_name,
            op,
            kind,
            stack.call_site,
            stack.user_site,
            sampler.chain if sampler else None,
            phase,
            thread,
        )
        log = self.log
        existing = log.get(key)
        if existing is not None:
            existing.count += 1
            if existing.digest is not None:  # generators beyond the named: fold each state in
                existing.fold(_safe(fp))
            if found is not None:
                found.append(existing)
            return None
        aggregate = BEYOND_MARK in gen_name
        state = None
        if fp.__class__ is TorchFingerprint and not aggregate and log.deferred_left > 0:
            # read now (the state before the draw), hashed when the event is read
            try:
                state = fp.read()
                log.deferred_left -= 1
            except Exception:
                state = None
            fingerprint_text = None
        else:
            fingerprint_text = _safe(fp)
        event = Event(
            log.next_seq(),
            self.audit_index,
            gen_name,
            op,
            kind,
            stack.call_site,
            stack.chain,
            stack.user_site,
            fingerprint_text,
            thread.name,
            _PID[0],
            phase,
            sampler,
        )
        if state is not None:
            event.state = state
        if aggregate:
            event.start_aggregate()
        stored = log.add(key, event)
        if found is not None:
            found.append(stored)
        return event

    def _sampler_info(self, marked: tuple[tuple[str, Any], ...]) -> SamplerInfo | None:
        samplers: list[Any] = []
        loader: Any = None
        for role, obj in marked:
            if role == ROLE_SAMPLER and obj is not None and all(obj is not s for s in samplers):
                samplers.append(obj)
            elif role == ROLE_LOADER and loader is None:
                loader = obj
        if not samplers:
            return None
        chain = library_samplers.chain_name(reversed(samplers))
        loader_name = None
        if loader is not None:
            loader_name = naming.LOADERS.name(loader)
        return SamplerInfo(chain=chain, loader=loader_name)

    # -- state snapshots -------------------------------------------------------------------
    def initial_seeds(self) -> dict[str, int]:
        """The seeds the global generators were last seeded with (read, never drawn)."""
        seeds: dict[str, int] = {}
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "initial_seed"):
            seeds[naming.TORCH_DEFAULT] = int(torch.initial_seed())
        return seeds

    def snapshot(self) -> dict[str, str | None]:
        """Fingerprints of the global generators (and named explicit ones), right now."""
        states: dict[str, str | None] = {}
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "default_generator"):
            states[naming.TORCH_DEFAULT] = fingerprint.torch_generator(torch.default_generator)
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_available() and cuda.is_initialized():
                for index, gen in enumerate(cuda.default_generators):
                    states[naming.cuda_default(index)] = fingerprint.torch_generator(gen)
        rnd = sys.modules.get("random")
        if rnd is not None:
            states[naming.PYTHON_GLOBAL] = fingerprint.python_random(rnd._inst)
        mtrand = sys.modules.get("numpy.random.mtrand")
        if mtrand is not None:
            states[naming.NUMPY_GLOBAL] = fingerprint.numpy_random_state(mtrand._rand)
        for name, obj in self.names.items():
            states[name] = fingerprint.of(obj)
        return states


RECORDER = Recorder()
_PID = [os.getpid()]  # this process's id (os.getpid() is a system call: 0.3 µs a draw)


def _new_pid() -> None:
    _PID[0] = os.getpid()


os.register_at_fork(after_in_child=_new_pid)


def _safe(fp: Callable[[], str | None]) -> str | None:
    try:
        return fp()
    except Exception:  # a state that cannot be read yet (half-built object)
        return None
