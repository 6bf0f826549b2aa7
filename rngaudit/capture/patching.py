"""The undo ledger: wraps, code marks, undo steps and import hooks, undone last first."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, ModuleType
from typing import Any

import wrapt

from rngaudit import forksafe
from rngaudit.capture.callsite import MARKED_CODES

log = logging.getLogger("rngaudit")

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
MISSING: Any = object()  # ``Entry.original`` when the owner had no attribute of its own

# Entry kinds.
ATTR = "attr"  # owner.name replaced; original is what owner.__dict__ held (or MISSING)
MARKS = "marks"  # code objects marked in callsite.MARKED_CODES (in ``codes``)
HOOK = "hook"  # a post-import route: ``name`` is the module, ``original`` the callback
UNDO = "undo"  # an undo callback (``original``), opaque to the ledger


@dataclass(frozen=True, eq=False)
class Entry:
    """One change the ledger can undo."""

    kind: str
    owner: Any = None
    name: str = ""
    original: Any = MISSING
    codes: tuple[CodeType, ...] = field(default=())


class Plan:
    """Wraps made once per process and re-applied at each window by :meth:`PatchSet.apply`:
    the wrapt objects and their ledger entries are kept between windows (swapping them in
    and out is what a window pays). One whose owner no longer holds what it wrapped (replaced
    since, by the user or another library) is made again around what the owner holds now."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard  # the object the wrappers were made for (the plan is made again
        # when the caller's is another)
        self.items: list[list[Any]] = []  # [entry, wrapper object, what it wraps, wrapper]

    def wrap(self, owner: Any, name: str, wrapper: Wrapper) -> None:
        """Plan to replace ``owner.name`` as :meth:`PatchSet.wrap` does."""
        self.items.append(_made(owner, name, wrapper))


class PatchSet:
    """Changes made together and undone together, last first (one ledger per owner of changes)."""

    def __init__(self) -> None:
        self._applied: list[Entry] = []
        self._plans: dict[str, Plan] = {}  # kept between windows (see apply)

    # -- what can be recorded --------------------------------------------------------------
    def wrap(self, owner: Any, name: str, wrapper: Wrapper) -> None:
        """Replace ``owner.name`` with a wrapt wrapper around its current value."""
        own = _own(owner, name)
        # On a class, wrap what its __dict__ holds (keeps staticmethod/classmethod intact).
        target = own if isinstance(owner, type) and own is not MISSING else getattr(owner, name)
        self._replace(owner, name, own, wrapt.FunctionWrapper(target, wrapper))

    def apply(self, key: str, build: Callable[[Plan], None], guard: Any = None) -> None:
        """Make the wraps of the plan kept under ``key`` (``build(plan)`` plans them the first
        time, and again when ``guard`` is not the object it was built for); each is recorded
        and undone like a :meth:`wrap`."""
        plan = self._plans.get(key)
        if plan is None or plan.guard is not guard:
            plan = Plan(guard)
            build(plan)
            self._plans[key] = plan
        applied = self._applied
        for item in plan.items:
            entry = item[0]
            owner, name = entry.owner, entry.name
            own = _own(owner, name)
            inherited = own is MISSING and getattr(owner, name) is not item[2]
            if own is not entry.original or inherited:  # replaced since: wrap what is there now
                item[:] = _made(owner, name, item[3])
                entry = item[0]
            setattr(owner, name, item[1])
            applied.append(entry)

    def wrap_path(self, module: Any, path: str, wrapper: Wrapper) -> Any:
        """Wrap the attribute at dotted ``path`` in ``module`` (wrapt's ``resolve_path``
        lookup: on a class, what the class or its bases hold); returns the patched owner."""
        parent, attribute, original = wrapt.resolve_path(module, path)
        wrapped = wrapt.FunctionWrapper(original, wrapper)
        self._replace(parent, attribute, _own(parent, attribute), wrapped)
        return parent

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace ``owner.name`` with ``value``."""
        self._replace(owner, name, _own(owner, name), value)

    def mark(self, codes: Iterable[CodeType]) -> None:
        """Remember code objects marked in ``callsite.MARKED_CODES``: unmarked on undo."""
        codes = tuple(codes)
        if codes:
            self._applied.append(Entry(MARKS, codes=codes))

    def add_undo(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the ledger is undone (in its place, last first)."""
        self._applied.append(Entry(UNDO, original=undo))

    def when_imported(self, module: str, callback: Callable[[ModuleType], None]) -> None:
        """Call ``callback(module)`` now if ``module`` is imported, else when it is, for as
        long as this entry is in the ledger (one process-wide router, see :func:`_route`)."""
        with _router_lock:
            if module not in _registered:
                _registered.add(module)
                wrapt.register_post_import_hook(_route(module), module)
            _routes.setdefault(module, []).append(callback)
            self._applied.append(Entry(HOOK, name=module, original=callback))
        loaded = sys.modules.get(module)
        if loaded is not None:
            callback(loaded)

    # -- reading and undoing ---------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """What is recorded now, oldest first."""
        return list(self._applied)

    def replaced(self, owner: Any, name: str | None = None) -> bool:
        """Whether this ledger replaced ``owner.name`` (any attribute of ``owner`` when ``name``
        is None): "already wrapped by us", whatever another library wrapped around it."""
        return any(
            e.kind == ATTR and e.owner is owner and (name is None or e.name == name)
            for e in self._applied
        )

    def undo(self) -> None:
        """Undo everything, last first; a failing step is logged and the rest still undone.
        Safe to call twice."""
        errors: list[BaseException] = []
        while self._applied:
            entry = self._applied.pop()
            try:
                _undo(entry)
            except Exception as exc:  # keep undoing the rest
                errors.append(exc)
        if errors:
            log.warning("rngaudit: %d undo step(s) failed: %r", len(errors), errors[0])

    def __len__(self) -> int:
        return len(self._applied)

    def _replace(self, owner: Any, name: str, own: Any, value: Any) -> None:
        setattr(owner, name, value)
        self._applied.append(Entry(ATTR, owner, name, own))


def _made(owner: Any, name: str, wrapper: Wrapper) -> list[Any]:
    own = _own(owner, name)
    target = own if isinstance(owner, type) and own is not MISSING else getattr(owner, name)
    return [Entry(ATTR, owner, name, own), wrapt.FunctionWrapper(target, wrapper), target, wrapper]


def _own(owner: Any, name: str) -> Any:
    return owner.__dict__.get(name, MISSING) if hasattr(owner, "__dict__") else MISSING


def _undo(entry: Entry) -> None:
    if entry.kind == ATTR:
        if entry.original is MISSING:
            with contextlib.suppress(AttributeError):
                delattr(entry.owner, entry.name)
        else:
            setattr(entry.owner, entry.name, entry.original)
    elif entry.kind == MARKS:
        for code in entry.codes:
            MARKED_CODES.pop(code, None)
    elif entry.kind == HOOK:
        with _router_lock:
            routes = _routes.get(entry.name, [])
            for i, callback in enumerate(routes):
                if callback is entry.original:
                    del routes[i]
                    break
    else:
        entry.original()


# The one post-import router: a wrapt hook per module name, registered once per process,
# calls the callbacks of the ledgers whose hook entry is not undone yet.
_router_lock = forksafe.lock()
_routes: dict[str, list[Callable[[ModuleType], None]]] = {}
_registered: set[str] = set()


def routes(module: str) -> list[Callable[[ModuleType], None]]:
    """The callbacks routed for ``module`` now."""
    with _router_lock:
        return list(_routes.get(module, ()))


def _route(name: str) -> Callable[[ModuleType], None]:
    def hook(module: ModuleType) -> None:
        for callback in routes(name):
            try:
                callback(module)
            except Exception:  # never break the user's import over the auditor
                log.warning("rngaudit: import hook for %s failed", name, exc_info=True)

    return hook
