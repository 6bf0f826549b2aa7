"""In a DataLoader worker: which call sites draw from which generator states (first batch)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rngaudit.capture import callsite, naming
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import GenInfo, Recorder
from rngaudit.schema import CREATE, DRAW
from rngaudit.workers import walk, worker_files
from rngaudit.workers.worker_files import DRAW_PREFIX

log = logging.getLogger("rngaudit")

FETCH_MODULE = "torch.utils.data._utils.fetch"
FETCHERS = ("_MapDatasetFetcher.fetch", "_IterableDatasetFetcher.fetch")

# Bounds of one worker's observation: draw calls looked at, distinct (generator, op, call
# site) keys, state fingerprints kept per key, generators created in the window followed.
MAX_DRAWS = 20_000
MAX_KEYS = 512
FPS_PER_KEY = 16
MAX_CREATED = 256


class DrawRecorder(Recorder):
    """A private recorder for one worker's first batch: the instrumentation of
    ``rngaudit.capture.instrument`` calls :meth:`record`, which keeps the state fingerprint before
    each draw (bounded), per generator, op and call site, instead of counting events."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline
        self.calls = 0
        # (generator name, op, call site, user call site) -> [count, fingerprints]
        self.draws: dict[tuple[str, str, Any, Any], list[Any]] = {}
        self.created: list[tuple[str, str | None, Any]] = []  # (name, fingerprint, site)
        self.truncated = False

    def record(
        self,
        generator: GenInfo | Callable[[callsite.Stack], GenInfo | None],
        op: str,
        kind: str,
        frame: Any,
        skip_stdlib_callers: bool = False,
        found: list[Any] | None = None,  # (the torch handler passes it to RECORDER only)
    ) -> None:
        self.calls += 1
        if self.calls > MAX_DRAWS or time.monotonic() > self.deadline:
            self.enabled = False  # bounded: the rest of the batch runs unobserved
            self.truncated = True
            return None
        if kind not in (DRAW, CREATE):
            return None
        if skip_stdlib_callers and callsite.stdlib_caller(frame):
            return None
        stack = callsite.walk(frame)
        resolved = generator if generator.__class__ is tuple else generator(stack)  # type: ignore[operator]
        if resolved is None:
            return None
        name, fp = resolved
        if kind == CREATE:
            if len(self.created) < MAX_CREATED:
                self.created.append((name, _read(fp), stack.user_site or stack.call_site))
            return None
        key = (name, op, stack.call_site, stack.user_site)
        entry = self.draws.get(key)
        if entry is None:
            if len(self.draws) >= MAX_KEYS:
                self.truncated = True
                return None
            entry = self.draws[key] = [0, []]
        entry[0] += 1
        if len(entry[1]) < FPS_PER_KEY:
            entry[1].append(_read(fp))
        return None


def _read(fp: Callable[[], str | None]) -> str | None:
    try:
        return fp()
    except Exception:  # a state that cannot be read is unknown, never an error
        return None


def _site(site: Any) -> dict[str, Any] | None:
    return None if site is None else dict(site.to_dict())


_NUMPY_KINDS = (walk.NUMPY_GENERATOR, walk.NUMPY_RANDOMSTATE)
NUMPY_DRAW = "numpy (state change)"  # the op of a numpy draw seen by its state change
MAX_FOLLOWED = 64  # numpy generators whose state is compared at user-code calls and returns


class StateWatch:
    """numpy's generator methods cannot be intercepted (C types): their draws are seen as
    state changes. While installed (``sys.setprofile``, this thread, first batch only), at
    each call and return of a user-code function the followed generators' states are read;
    a change is a draw (or a reseed) made by the code that ran since, named by that frame's
    call site, with the states before and after it."""

    def __init__(self, rec: DrawRecorder) -> None:
        self.rec = rec
        self.followed: dict[Any, list[Any]] = {}  # ident -> [object, name, last fingerprint]
        self.created_seen = 0
        self.installed = False

    def follow(self, obj: Any, name: str, fp: str | None) -> None:
        if walk.generator_kind(obj) not in _NUMPY_KINDS or len(self.followed) >= MAX_FOLLOWED:
            return
        self.followed.setdefault(_ident(obj), [obj, name, fp if fp is not None else _of(obj)])

    def install(self) -> None:
        if sys.getprofile() is None:  # a profiler of the user's own: leave it alone
            sys.setprofile(self._profile)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed and sys.getprofile() == self._profile:
            sys.setprofile(None)
        self.installed = False

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" and event != "return":
            return
        rec = self.rec
        if not rec.enabled or rec.busy():
            return
        if callsite.classify(frame.f_code.co_filename) != callsite.USER:
            return
        with rec.paused():
            try:
                self._check(frame if event == "return" else frame.f_back)
            except Exception:  # never break the worker over the auditor
                log.debug("rngaudit: state watch failed", exc_info=True)

    def _check(self, frame: Any) -> None:
        rec = self.rec
        if len(rec.created) > self.created_seen:
            objects = dict(rec.names.items())
            for name, fp, _ in rec.created[self.created_seen :]:
                obj = objects.get(name)
                if obj is not None:
                    self.follow(obj, name, fp)
            self.created_seen = len(rec.created)
        changed = []
        for entry in self.followed.values():
            now = _of(entry[0])
            if now != entry[2]:
                # the transition is the evidence: a reseed changes the state too, but only
                # a draw from a duplicated stream goes from the same state to the same state
                changed.append((entry[1], f"{entry[2]}>{now}"))
                entry[2] = now
        if not changed or frame is None:
            return
        stack = callsite.walk(frame)
        for name, before in changed:
            key = (name, NUMPY_DRAW, stack.call_site, stack.user_site)
            counted = rec.draws.get(key)
            if counted is None:
                if len(rec.draws) >= MAX_KEYS:
                    return
                counted = rec.draws[key] = [0, []]
            counted[0] += 1
            if len(counted[1]) < FPS_PER_KEY:
                counted[1].append(before)


class FirstBatch:
    """One worker's observation: opened before the user's ``worker_init_fn``, closed when the
    worker's first fetch (its first batch: dataset, iterator and ``collate_fn``) returns or
    raises; then the draw report is written and every patch is undone."""

    def __init__(self, report_dir: str, worker_id: int, timeout: float) -> None:
        self.report_dir = report_dir
        self.worker_id = worker_id
        self.rec = DrawRecorder(time.monotonic() + timeout)
        self.watch = StateWatch(self.rec)
        self.fetch_patches = PatchSet()
        self.before: dict[Any, tuple[Any, str, str, str | None]] = {}
        self.done = False
        self.started = time.monotonic()

    def start(self) -> None:
        """Install the instrumentation (this process only) and wrap the fetchers."""
        from rngaudit.capture.instrument import Instrumentation

        rec = self.rec
        rec.enabled = True
        try:
            Instrumentation(rec).install()
            import importlib

            fetch = importlib.import_module(FETCH_MODULE)
            for target in FETCHERS:
                self.fetch_patches.wrap_path(fetch, target, self._fetch_wrapper)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.watch.uninstall()
        self.rec.enabled = False
        self.rec.uninstrument()
        self.fetch_patches.undo()

    def _fetch_wrapper(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        if self.done or instance is None:
            return wrapped(*args, **kw)
        with self.rec.paused():
            self._snapshot_before(instance)
        self.watch.install()
        try:
            return wrapped(*args, **kw)
        finally:
            self.finish(instance)

    def _roots(self, fetcher: Any) -> list[tuple[str, object]]:
        d = walk.instance_dict(fetcher) or {}
        roots = [("dataset", d.get("dataset")), ("collate_fn", d.get("collate_fn"))]
        if "dataset_iter" in d:
            roots.append(("iter(dataset)", d["dataset_iter"]))
        return roots

    def _walk(self, fetcher: Any) -> list[walk.GeneratorRef]:
        roots = self._roots(fetcher)
        first_path, first = roots[0]
        return walk.find_generators(first, first_path, more_roots=roots[1:])

    def _snapshot_before(self, fetcher: Any) -> None:
        try:
            for ref in self._walk(fetcher):
                fp = _of(ref.obj)
                self.before[_ident(ref.obj)] = (ref.obj, ref.path, ref.kind, fp)
                self.watch.follow(ref.obj, f"walk:{ref.path}", fp)
        except Exception:
            log.debug("rngaudit: worker walk failed", exc_info=True)

    def finish(self, fetcher: Any) -> None:
        """Close the observation and write the draw report; never raises."""
        if self.done:
            return
        self.done = True
        rec = self.rec
        self.watch.uninstall()
        with rec.paused():
            try:
                self.watch._check(None)  # the draws made since the last call or return
            except Exception:
                log.debug("rngaudit: state watch failed", exc_info=True)
        rec.enabled = False
        try:
            report = self._report(fetcher)
        except Exception as exc:  # never break the worker over the auditor
            report = {"worker_id": self.worker_id, "status": "probe-error", "error": repr(exc)}
        try:
            self.stop()
        except Exception:
            log.debug("rngaudit: could not undo the worker's instrumentation", exc_info=True)
        worker_files.write_report(self.report_dir, self.worker_id, report, DRAW_PREFIX)
        rec.names.clear()

    def _report(self, fetcher: Any) -> dict[str, Any]:
        rec = self.rec
        with rec.paused():
            after = {_ident(r.obj): r for r in self._walk(fetcher)}
            objects = dict(rec.names.items())  # generator name -> object
            path_of = {i: r.path for i, r in after.items()}
            for i, (_, path, _, _) in self.before.items():
                path_of.setdefault(i, path)
            draws = []
            for (name, op, site, user_site), (count, fps) in rec.draws.items():
                obj = objects.get(name) or self._walked(name)
                holder = path_of.get(_ident(obj)) if obj is not None else None
                if holder is None and not naming.is_explicit(name):
                    holder = name  # a global generator is named by its own name
                kind = walk.generator_kind(obj) if obj is not None else None
                draws.append(
                    {
                        "generator": name,
                        "type": kind or naming.family(name),
                        "holder": holder,
                        "op": op,
                        "site": _site(site),
                        "user_site": _site(user_site),
                        "count": count,
                        "fingerprints": fps,
                    }
                )
            states = self._states(after, objects, path_of)
        return {
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "status": "ok",
            "draws": draws,
            "states": states,
            "calls": rec.calls,
            "truncated": rec.truncated,
            "seconds": round(time.monotonic() - self.started, 6),
        }

    def _walked(self, name: str) -> Any:
        for entry in self.watch.followed.values():
            if entry[1] == name:
                return entry[0]
        return None

    def _states(
        self,
        after: dict[Any, walk.GeneratorRef],
        objects: dict[str, Any],
        path_of: dict[Any, str],
    ) -> list[dict[str, Any]]:
        """Each followed generator's state before and after the first batch: the object walk's
        (before the first fetch and after it) and those created in the window."""
        created: dict[Any, tuple[Any, str | None, Any]] = {}
        for name, fp, site in self.rec.created:
            obj = objects.get(name)
            if obj is not None and _ident(obj) not in created:
                created[_ident(obj)] = (obj, fp, site)
        followed: dict[Any, Any] = {i: r.obj for i, r in after.items()}
        followed.update((i, entry[0]) for i, entry in self.before.items())
        followed.update((i, entry[0]) for i, entry in created.items())
        states = []
        for ident, obj in followed.items():
            kind = walk.generator_kind(obj)
            if kind is None:
                continue
            site = None
            if ident in created:
                before, site = created[ident][1], created[ident][2]
            elif ident in self.before:
                before = self.before[ident][3]
            else:
                before = None  # appeared during the batch, by a constructor not observed
            states.append(
                {
                    "path": path_of.get(ident),
                    "type": kind,
                    "created_at": _site(site),
                    "before": before,
                    "after": _of(obj),
                }
            )
        return states


def _ident(obj: Any) -> Any:
    """An object's identity within this process: a ``torch.Generator`` by its C++ generator
    (torch hands kernels a new Python object for the same generator), others by ``id``."""
    cdata = (
        getattr(obj, "_cdata", None) if walk.generator_kind(obj) == walk.TORCH_GENERATOR else None
    )
    return ("torch", cdata) if isinstance(cdata, int) else id(obj)


def _of(obj: Any) -> str | None:
    from rngaudit.capture.fingerprint import of

    return of(obj)
