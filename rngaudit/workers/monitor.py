"""Detect dataset-owned generators copied unchanged into every DataLoader worker."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from rngaudit import forksafe, library_samplers
from rngaudit.capture.patching import PatchSet
from rngaudit.config import MODES
from rngaudit.errors import ConfigError, RNGAuditWarning, WorkerDuplicateStreamError
from rngaudit.findings import (
    PERSISTENT_WORKER_STREAM,
    WORKER_DUPLICATE_STREAM,
    Finding,
    severity_rank,
)
from rngaudit.ranks import exchange, policy
from rngaudit.workers import evidence
from rngaudit.workers.probe import WorkerProbe
from rngaudit.workers.walk import GeneratorRef, find_generators
from rngaudit.workers.worker_files import DRAW_PREFIX, read_reports

TORCHDATA_DATALOADER = library_samplers.row("StatefulDataLoader").module

_CHECK_ATTR = "_rngaudit_worker_check"
_MARKER_ATTR = "_rngaudit_first_batch_check"

REMEDY = (
    "Do not build the generator in the parent process. Either (1) set it to None in "
    "__init__ and build it lazily inside the worker on first use, seeded from "
    "torch.initial_seed() (already distinct per worker and per epoch), e.g. "
    "np.random.default_rng(torch.initial_seed() % 2**32); or (2) reseed or rebuild it in "
    "worker_init_fn from torch.utils.data.get_worker_info().seed (a module-level function "
    "under spawn); or (3) derive it from the sample index in __getitem__, e.g. "
    "np.random.default_rng([seed, epoch, index]), which makes each sample's randomness "
    "independent of the number of workers."
)
PERSISTENT_REMEDY = (
    "Build the generator inside each worker (lazily from torch.initial_seed(), or in "
    "worker_init_fn) so that its stream no longer depends on persistent_workers; if it "
    "must live on the dataset, fold the epoch number into its seed."
)


def _new_report_dir() -> str:
    """A private directory for worker reports, named without drawing from any Python RNG."""
    base = tempfile.gettempdir()
    while True:
        path = os.path.join(base, f"rngaudit-workers-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


# The patches are shared by all installed monitors: applied when the first one installs,
# removed when the last one uninstalls (in any order), so the originals always come back.
# The most recently installed monitor handles each new iterator.
_state_lock = forksafe.lock()
_active: list[WorkerMonitor] = []
PATCHES = PatchSet()  # this module's ledger (wraps and the torchdata import hook)


def _dispatch_init(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    with _state_lock:
        monitor = _active[-1] if _active else None
    if monitor is None or instance is None:
        return wrapped(*args, **kwargs)
    return monitor._wrap_init(wrapped, instance, args, kwargs)


def _patch(module: object, target: str) -> None:
    class_name = target.split(".")[0]
    parent = getattr(module, class_name, None)
    if parent is not None and not PATCHES.replaced(parent):
        PATCHES.wrap_path(module, target, _dispatch_init)


def targets() -> list[tuple[str, str]]:
    """(module, ``Class.__init__``) of the known iterator classes that start the workers."""
    return [
        (k.module, f"{k.name}.__init__")
        for k in library_samplers.of_kind(library_samplers.WORKER_ITERATOR)
    ]


def _on_import(target: str, module: object) -> None:
    with _state_lock:
        _patch(module, target)


def _apply_patches() -> None:
    import torch.utils.data.dataloader  # noqa: F401  (patched now, the others when imported)

    for module, target in targets():
        PATCHES.when_imported(module, functools.partial(_on_import, target))


def _remove_patches() -> None:
    PATCHES.undo()


# Per iterator class, a subclass whose __next__ runs the first-batch check once and then
# turns the iterator back into its own class: no cost at all after the first batch.
_subclass_lock = forksafe.lock()
_checking_subclasses: dict[type, type] = {}


def _checking_class(cls: type) -> type | None:
    """The checking subclass in ``cls``'s MRO: ``cls`` itself, or a class another wrapper
    (the order check's plain subclass) built on top of it while the check was armed."""
    return next((c for c in cls.__mro__ if c.__dict__.get(_MARKER_ATTR, False)), None)


def _disarm(iterator: Any) -> _IteratorCheck | None:
    """Take the check off the iterator and give it back its own class (when nothing was built
    on top of the checking subclass; else its ``__next__`` passes through from now on)."""
    check: _IteratorCheck | None = vars(iterator).pop(_CHECK_ATTR, None)
    cls = type(iterator)
    if cls.__dict__.get(_MARKER_ATTR, False):
        iterator.__class__ = cls.__base__
    return check


def _own_next(iterator: Any) -> Any:
    """The iterator's ``__next__`` below the checking subclass (no check)."""
    sub = _checking_class(type(iterator))
    if sub is None:  # its own class again
        return next(iterator)
    base: Any = sub.__base__
    return base.__next__(iterator)


def _first_batch_next(self: Any) -> Any:
    check: _IteratorCheck | None = vars(self).get(_CHECK_ATTR)
    if check is not None and check.deferred:
        return _deferred_next(self, check)
    check = _disarm(self)
    try:
        batch = _own_next(self)
    except StopIteration:
        if check is not None:
            check.run(self)
        raise
    except BaseException:
        if check is not None:
            check.close()
        raise
    if check is not None:
        check.run(self)
    return batch


def _deferred_next(self: Any, check: _IteratorCheck) -> Any:
    """An out-of-order iterator's ``__next__`` while its check waits: the order of its batches
    is the order in which its workers finish them, so the check never waits; it looks once per
    batch whether every worker given work has reported, and runs when they have (or when the
    monitor's timeout has passed since the first batch, or at the epoch's end)."""
    try:
        batch = _own_next(self)
    except StopIteration:
        _disarm(self)
        check.run(self, wait=False)
        raise
    except BaseException:
        _disarm(self)
        check.close()
        raise
    if check.ready(self):
        _disarm(self)
        check.run(self, wait=False)
    return batch


def _checking_subclass(cls: type) -> type:
    with _subclass_lock:
        sub = _checking_subclasses.get(cls)
        if sub is None:
            namespace = {
                "__next__": _first_batch_next,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                _MARKER_ATTR: True,
            }
            sub = type(cls.__name__, (cls,), namespace)
            _checking_subclasses[cls] = sub
        return sub


def _arm(iterator: Any, check: _IteratorCheck) -> None:
    vars(iterator)[_CHECK_ATTR] = check
    iterator.__class__ = _checking_subclass(type(iterator))
    check.attach_finalizer(iterator)


def _dataset_label(dataset: object) -> str:
    cls = type(dataset)
    return f"{cls.__module__}.{cls.__qualname__}"


def _format_ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


def _duplicate_message(dup: evidence.Duplicate) -> str:
    ids = dup.worker_ids
    groups_text = "; ".join(f"workers {_format_ids(g)}" for g in dup.groups)
    what = dup.holder or "a generator"
    once = (
        "; a generator reset to a constant before every sample looks the same until its second "
        "draw: unconfirmed"
    )
    if dup.evidence == evidence.DRAWS:
        where = " and ".join(dup.call_sites)
        reached = f" (reached from {', '.join(dup.user_sites)})" if dup.user_sites else ""
        seen = f"drew from the same state at {where}{reached} in {groups_text}"
        if not dup.confirmed:
            seen += f" (fewer than two of them drew there twice in their first batch{once})"
    elif dup.advanced:
        made = f", created at {dup.created_at}," if dup.created_at else ""
        seen = (
            f"{made} advanced from the same state to the same state over the first batch "
            f"in {groups_text} (its draws themselves were not seen{once})"
        )
    else:
        seen = (
            f"appeared during the first batch in the same state in {groups_text} (built by a "
            f"constructor rngaudit does not observe; its draws were not seen: unconfirmed)"
        )
    reporting, distinct = len(dup.reporting), dup.distinct
    return (
        f"DataLoader workers {_format_ids(ids)} share one random stream: {what} ({dup.type}) "
        f"{seen.lstrip(', ')}. Every worker's copy starts from (or is rebuilt to) the same state "
        f"(PyTorch reseeds only the global torch, random and numpy generators per worker), so "
        f"{reporting} workers draw {distinct} distinct stream{'s' if distinct != 1 else ''}: "
        f"{distinct}/{reporting} of the intended augmentation diversity."
    )


def analyse(
    static: Sequence[GeneratorRef],
    reports: dict[int, dict[str, Any]],
    num_workers: int,
    persistent: bool,
    dataset: str = "",
    rank: int = 0,
    draws: dict[int, dict[str, Any]] | None = None,
    waited_in_vain: Sequence[int] | None = None,
) -> list[Finding]:
    """Decide from the workers' first-batch draws; the pure core of the first-batch check.

    ``static`` are the generators the walk found in the parent's loader, ``reports`` the
    workers' init reports (their generators' state right after ``worker_init_fn``) and
    ``draws`` their draw reports (:mod:`rngaudit.workers.draws`), by worker id. A call site
    that drew from the same state in two workers, or a generator that advanced identically
    in two workers, is a confirmed duplicate (error). Equal state without the draws is never
    an error: a generator the walk found is an unconfirmed warning only when fewer than two
    workers' draws were observed because workers did not report in time
    (``waited_in_vain``; None: not known).
    """
    observed = sorted(
        w for w, r in (draws or {}).items() if isinstance(r, dict) and r.get("status") == "ok"
    )
    types_of: dict[str, tuple[str, str]] = {}
    ok_workers = sorted(w for w, r in reports.items() if r.get("status") == "ok")
    for worker_id in ok_workers:
        for gen in reports[worker_id].get("generators", []):
            path = str(gen["path"])
            types_of.setdefault(path, (str(gen["type"]), str(gen.get("class", gen["type"]))))
    for ref in static:
        types_of.setdefault(ref.path, (ref.kind, ref.cls))

    findings: list[Finding] = []
    persistent_paths: list[tuple[str, str, str]] = []
    named: set[str] = set()
    for dup in evidence.duplicates(draws or {}):
        named.add(dup.key)
        details: dict[str, Any] = {
            "path": dup.key,
            "type": dup.type,
            "class": types_of.get(dup.key, (dup.type, dup.type))[1],
            "dataset": dataset,
            "num_workers": num_workers,
            "persistent_workers": persistent,
            "worker_ids": dup.worker_ids,
            "groups": dup.groups,
            "reporting_workers": dup.reporting,
            "distinct_streams": dup.distinct,
            "diversity": dup.distinct / len(dup.reporting),
            "confirmed": dup.confirmed,
            "evidence": dup.evidence,
            "holder": dup.holder,
            "call_sites": dup.call_sites,
            "user_sites": dup.user_sites,
            "created_at": dup.created_at,
        }
        severity = "error" if dup.confirmed else "warning"
        findings.append(_stream_finding(severity, _duplicate_message(dup), rank, dup.type, details))
        persistent_paths.append((dup.key, dup.type, "warning"))

    timed_out = waited_in_vain is None or bool(waited_in_vain)
    drawing = evidence.drawn(draws or {})
    for path, (kind, cls) in types_of.items():
        if path in named:
            continue
        if len(observed) < 2 and timed_out and num_workers >= 2:
            expected = list(range(num_workers))
            message = (
                f"{path} ({kind}) is held by the DataLoader's dataset or collate_fn and is "
                f"copied unchanged into every worker ({_format_ids(expected)}): unless each "
                f"worker reseeds it, {num_workers} workers draw 1 distinct stream "
                f"(1/{num_workers} of the intended diversity). Unconfirmed: {len(observed)} "
                f"of {num_workers} workers reported their first batch's draws in time."
            )
            details = {
                "path": path,
                "type": kind,
                "class": cls,
                "dataset": dataset,
                "num_workers": num_workers,
                "persistent_workers": persistent,
                "worker_ids": expected,
                "reporting_workers": observed,
                "distinct_streams": None,
                "diversity": 1 / num_workers,
                "confirmed": False,
            }
            findings.append(_stream_finding("warning", message, rank, kind, details))
            persistent_paths.append((path, kind, "warning"))
        elif drawing.get(path, 0) >= 2:  # drawn from in the workers, differently in each
            persistent_paths.append((path, kind, "info"))

    if persistent:
        for path, kind, severity in persistent_paths:
            if severity == "warning":
                message = (
                    f"persistent_workers=True: {path} ({kind}) is shared by the workers, so "
                    f"each worker's copy continues its stream across epochs, whereas without "
                    f"persistent workers every epoch restarts from the parent's copy: the "
                    f"augmentation stream depends on a performance flag."
                )
            else:
                message = (
                    f"persistent_workers=True: {path} ({kind}) differs per worker; the "
                    f"workers are started once, so its stream continues across epochs "
                    f"instead of being reseeded each epoch."
                )
            details = {
                "path": path,
                "type": kind,
                "dataset": dataset,
                "num_workers": num_workers,
                "persistent_workers": True,
            }
            findings.append(
                _stream_finding(
                    severity,
                    message,
                    rank,
                    kind,
                    details,
                    PERSISTENT_WORKER_STREAM,
                    PERSISTENT_REMEDY,
                )
            )
    return findings


def _stream_finding(
    severity: str,
    message: str,
    rank: int,
    kind: str,
    details: dict[str, Any],
    finding_kind: str = WORKER_DUPLICATE_STREAM,
    remedy: str = REMEDY,
) -> Finding:
    """A finding on a worker stream: ``worker-duplicate-stream`` (confirmed: error;
    unconfirmed: warning) or ``persistent-worker-stream``; ``kind`` is the generator's type."""
    return Finding(
        kind=finding_kind,
        severity=severity,
        message=message,
        ranks=[rank],
        generator=kind,
        remedy=remedy,
        details=details,
    )


class _IteratorCheck:
    """State of one iterator's first-batch check: where the reports land, what to compare."""

    def __init__(
        self,
        monitor: WorkerMonitor,
        static: list[GeneratorRef],
        num_workers: int,
        persistent: bool,
        dataset: str,
    ) -> None:
        self.monitor = monitor
        # Keep paths and types only: holding the parent's generators is not needed.
        self.static = [GeneratorRef(r.path, r.kind, r.cls, None) for r in static]
        self.num_workers = num_workers
        self.persistent = persistent
        self.dataset = dataset
        self._loader: weakref.ref[Any] | None = None
        # An iterator with in_order=False yields batches as its workers finish them: waiting
        # for the workers' reports at its first batch would change that order.
        self.deferred = False
        self.first_batch_at: float | None = None
        self.report_dir = _new_report_dir()
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(
            self, shutil.rmtree, self.report_dir, True
        )

    @property
    def loader(self) -> Any:
        return None if self._loader is None else self._loader()

    @loader.setter
    def loader(self, loader: Any) -> None:
        try:
            self._loader = weakref.ref(loader)
        except TypeError:
            self._loader = None

    def attach_finalizer(self, iterator: object) -> None:
        """Remove the report directory when the iterator goes, if the check never ran."""
        self._finalizer.detach()
        self._finalizer = weakref.finalize(iterator, shutil.rmtree, self.report_dir, True)

    def close(self) -> None:
        self._finalizer()

    def _pending(self, iterator: object, inits: dict[int, dict[str, Any]]) -> set[int]:
        """The live workers given work whose first batch's draws have not been reported."""
        workers = getattr(iterator, "_workers", None)
        draws = read_reports(self.report_dir, DRAW_PREFIX)
        pending = _given_work(iterator, self.num_workers) - draws.keys()
        pending = {w for w in pending if inits.get(w, {}).get("status") != "init-error"}
        if workers is not None:
            pending = {w for w in pending if w < len(workers) and _alive(workers[w])}
        return pending

    def ready(self, iterator: object) -> bool:
        """Whether a deferred check can run now, without waiting: nothing pending, or the
        monitor's timeout passed since the first batch."""
        now = time.monotonic()
        if self.first_batch_at is None:
            self.first_batch_at = now
        if now - self.first_batch_at >= self.monitor.timeout:
            return True
        try:
            return not self._pending(iterator, read_reports(self.report_dir))
        except Exception:
            return True

    def wait_for_reports(
        self, iterator: object, wait: bool = True
    ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], list[int]]:
        """The init and draw reports, and the workers waited for in vain: every live worker
        that was given work reports its first batch's draws, or the monitor's timeout ends
        the wait (``wait=False``: read once). A worker with no work (fewer batches than
        workers), a dead one and one whose ``worker_init_fn`` raised are not waited for."""
        deadline = time.monotonic() + (self.monitor.timeout if wait else 0.0)
        delay = 0.002
        while True:
            pending = self._pending(iterator, read_reports(self.report_dir))
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        draws = read_reports(self.report_dir, DRAW_PREFIX)
        return read_reports(self.report_dir), draws, sorted(pending - draws.keys())

    def run(self, iterator: object, wait: bool = True) -> None:
        """The first-batch check: wait for the reports, compare, emit; may raise."""
        self.monitor.mark_checked(self.loader)
        try:
            inits, draws, in_vain = self.wait_for_reports(iterator, wait)
            findings = analyse(
                self.static,
                inits,
                self.num_workers,
                self.persistent,
                dataset=self.dataset,
                rank=exchange.current_rank(),
                draws=draws,
                waited_in_vain=in_vain,
            )
        except Exception as exc:  # the check must never break training
            warnings.warn(
                f"rngaudit: DataLoader worker check failed: {exc!r}", RNGAuditWarning, stacklevel=3
            )
            return
        finally:
            self.close()
        self.monitor._publish(findings)


def _start_method(loader: Any) -> str | None:
    """How the loader's workers start (``fork``, ``spawn``, ``forkserver``), read without
    fixing the process's default start method; None when unknown."""
    import multiprocessing

    context = getattr(loader, "multiprocessing_context", None)
    if context is None:
        default = multiprocessing.get_start_method(allow_none=True)
        return default if default is not None else multiprocessing.get_all_start_methods()[0]
    method = getattr(context, "_name", None)  # a concrete context names its method
    return method if isinstance(method, str) else None


def _ready_for_forked_workers() -> None:
    """What each worker's observation needs, done once in this process so that forked workers
    inherit it: the modules imported (25 ms per worker when each imported them, measured) and
    the torch kernels registered (45 ms per worker when each registered its own, rewriting the
    dispatch tables it shares copy-on-write with the parent). Idempotent."""
    import rngaudit.capture.fingerprint
    import rngaudit.capture.instrument
    import rngaudit.workers.draws  # noqa: F401
    from rngaudit.capture.instrument import torch_ops

    torch_ops.keyed_kernels()


def _alive(worker: Any) -> bool:
    try:
        return bool(worker.is_alive())
    except Exception:
        return False


def _given_work(iterator: object, num_workers: int) -> set[int]:
    """The workers the iterator has sent an index to and not yet been answered by (read from
    its task table, never iterated on the user's behalf); every worker when unknown."""
    tasks = vars(iterator).get("_task_info") if hasattr(iterator, "__dict__") else None
    if not isinstance(tasks, dict):
        return set(range(num_workers))
    given: set[int] = set()
    for info in list(tasks.values()):
        if isinstance(info, tuple) and info and isinstance(info[0], int):
            given.add(info[0])
    return given


class WorkerMonitor:
    """Watches DataLoader iterators start their workers and checks the workers' generators.

    ``sink`` receives every finding. ``mode``: ``raise`` raises
    :class:`~rngaudit.errors.WorkerDuplicateStreamError` from the first ``__next__`` of an
    iterator whose workers share a stream (other findings are warned), ``warn`` warns,
    ``report`` only calls the sink. ``timeout`` bounds the first-batch wait for worker reports.
    """

    def __init__(
        self, sink: Callable[[Finding], None], mode: str = "raise", timeout: float = 30.0
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"WorkerMonitor mode must be one of {MODES}, not {mode!r}")
        if not timeout >= 0:
            raise ConfigError(f"WorkerMonitor timeout must be >= 0 seconds, not {timeout!r}")
        self.sink = sink
        self.mode = mode
        self.timeout = float(timeout)
        self._lock = forksafe.lock()
        self._emitted: dict[tuple[str, str, str], Finding] = {}
        self._checked: dict[int, weakref.ref[Any]] = {}  # id -> loaders whose check ran
        self.on_start: Callable[[Any], None] | None = None  # called with each loader starting

    @property
    def installed(self) -> bool:
        with _state_lock:
            return self in _active

    @property
    def findings(self) -> list[Finding]:
        """Findings so far, one per (kind, dataset class, path); confirmed replaces unconfirmed."""
        with self._lock:
            return list(self._emitted.values())

    def install(self) -> None:
        """Patch the iterator classes that start workers; idempotent."""
        with _state_lock:
            if self in _active:
                return
            _active.append(self)
            if len(_active) == 1:
                try:
                    _apply_patches()
                except BaseException:
                    _active.remove(self)
                    _remove_patches()
                    raise

    def uninstall(self) -> None:
        """Put the original iterator methods back once no monitor is installed.

        Iterators whose workers were started while installed keep their first-batch check.
        """
        with _state_lock:
            if self in _active:
                _active.remove(self)
            if not _active:
                _remove_patches()

    def _wrap_init(
        self,
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        loader: Any = args[0] if args else kwargs.get("loader")
        if self.on_start is not None:
            with contextlib.suppress(Exception):  # never break the user's loader
                self.on_start(loader)
        check = self._prepare(loader)
        if check is None:
            return wrapped(*args, **kwargs)
        user_fn = loader.worker_init_fn
        try:
            loader.worker_init_fn = WorkerProbe(user_fn, check.report_dir, self.timeout)
        except Exception:  # a loader that refuses the swap is run unaudited
            check.close()
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException:
            check.close()
            raise
        finally:
            loader.worker_init_fn = user_fn
        check.deferred = vars(instance).get("_in_order", True) is False
        _arm(instance, check)
        return result

    def _prepare(self, loader: Any) -> _IteratorCheck | None:
        """A check for a loader with workers, once per loader (its first iterator: later
        epochs' workers run unobserved); the static walk names the generators it holds."""
        try:
            num_workers = int(loader.num_workers)
            if num_workers <= 0 or isinstance(loader.worker_init_fn, WorkerProbe):
                return None
            if self.was_checked(loader):
                return None
            dataset = loader.dataset
            if _start_method(loader) == "fork":
                _ready_for_forked_workers()
            roots = [("collate_fn", getattr(loader, "collate_fn", None))]
            static = find_generators(dataset, more_roots=roots)
            check = _IteratorCheck(
                self,
                static,
                num_workers,
                bool(getattr(loader, "persistent_workers", False)),
                _dataset_label(dataset),
            )
            check.loader = loader
            return check
        except Exception as exc:  # never break the user's loader
            warnings.warn(
                f"rngaudit: cannot watch the DataLoader's workers: {exc!r}",
                RNGAuditWarning,
                stacklevel=4,
            )
            return None

    def was_checked(self, loader: Any) -> bool:
        with self._lock:
            ref = self._checked.get(id(loader))
            return ref is not None and ref() is loader

    def mark_checked(self, loader: Any) -> None:
        """The loader's workers were observed: its later iterators run unobserved."""
        if loader is None:
            return
        try:
            ref = weakref.ref(loader)
        except TypeError:  # not weakly referable: checked again each time
            return
        with self._lock:
            for key in [k for k, r in self._checked.items() if r() is None]:
                del self._checked[key]
            self._checked[id(loader)] = ref

    def _publish(self, findings: list[Finding]) -> None:
        """Sink and warn new or escalated findings; in raise mode, raise confirmed ones."""
        errors: list[Finding] = []
        for finding in findings:
            if policy.fails(finding, self.mode):
                errors.append(finding)
            key = finding.key()
            with self._lock:
                previous = self._emitted.get(key)
                if previous is not None and (
                    severity_rank(previous.severity) >= severity_rank(finding.severity)
                ):
                    continue
                self._emitted[key] = finding
            self.sink(finding)
            if not policy.warns(finding, self.mode) or policy.fails(finding, self.mode):
                continue  # not worth a warning, or raised below instead
            warnings.warn(finding.message, RNGAuditWarning, stacklevel=4)
        if errors:
            raise WorkerDuplicateStreamError("\n".join(f.message for f in errors) + "\n" + REMEDY)
