"""Stable, readable names for the generators and the DataLoaders an audit sees."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from rngaudit import forksafe

TORCH_DEFAULT = "torch.default_generator"
PYTHON_GLOBAL = "random (global)"
NUMPY_GLOBAL = "numpy.random (global)"
NUMBER_MARK = "#"  # explicit generators: "<family>#<n>", numbered per process in order of sight
# Generators named one by one per family and window; every further one of the family shares
# one name, "<family>#>256", so its events aggregate per call site (see event_log.Event.digest).
NAMED_PER_FAMILY = 256
BEYOND_MARK = NUMBER_MARK + ">"


def family(name: str) -> str:
    """The family of a generator name: ``torch.Generator#2 (sampler)`` -> ``torch.Generator``."""
    return name.split(NUMBER_MARK, 1)[0]


def is_explicit(name: str) -> bool:
    """An explicit generator (numbered per process), not a global one."""
    return NUMBER_MARK in name


def is_aggregate(name: str) -> bool:
    """The shared name of the generators of a family beyond :data:`NAMED_PER_FAMILY`."""
    return BEYOND_MARK in name


def cuda_default(index: int) -> str:
    return f"torch.cuda.default_generators[{index}]"


class GeneratorNames:
    """Numbers explicit generators in order of first sight, keeping them alive meanwhile.

    Holding a reference stops a freed generator's address from being reused by a new one
    while the audit runs; ``clear()`` (at the window's end) lets them go. At most ``limit``
    per family are named and held: every further one is named ``<family>#>limit``, not held.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._lock = forksafe.lock()
        self._names: dict[tuple[str, int], str] = {}
        self._keep: list[Any] = []
        self._counters: dict[str, int] = {}
        self.limit = limit

    def name(self, family: str, key: int, obj: Any, hint: str | None = None) -> str:
        """The name of generator ``obj`` (identified by ``key``) in ``family``."""
        ident = (family, key)
        found = self._names.get(ident)
        if found is not None:
            return found
        with self._lock:
            found = self._names.get(ident)
            if found is None:
                if self.limit is not None and self._counters.get(family, 0) >= self.limit:
                    return f"{family}{BEYOND_MARK}{self.limit}"
                number = self._counters.get(family, 0) + 1
                self._counters[family] = number
                found = f"{family}{NUMBER_MARK}{number}" + (f" ({hint})" if hint else "")
                self._names[ident] = found
                self._keep.append(obj)
            return found

    def items(self) -> list[tuple[str, Any]]:
        """(name, object) for every named generator."""
        with self._lock:
            by_key = dict(zip(self._names.values(), self._keep, strict=True))
        return list(by_key.items())

    def clear(self) -> None:
        with self._lock:
            self._names.clear()
            self._keep.clear()
            self._counters.clear()


class LoaderNames:
    """The one label of each DataLoader in a process: ``<class>#<n>``, numbered per class in
    order of first sight and never renumbered, so a window's record and every later order,
    partition and observed check name a loader the same way (the window's end does not clear
    it). The loaders are held weakly: a freed loader's label is never given to another.

    A loader is found again from what its iterator holds (its index sampler, its shard):
    :meth:`find` asks the loaders named so far, then ``candidates``.
    """

    def __init__(self) -> None:
        self._lock = forksafe.lock()
        # id -> (reference, label), in the order named
        self._by_id: dict[int, tuple[Callable[[], Any], str]] = {}
        self._counters: dict[str, int] = {}

    def name(self, loader: Any) -> str:
        """The label of ``loader``, given now if it has none."""
        label = self._get(loader)
        if label is not None:
            return label
        with self._lock:
            label = self._get(loader)
            if label is None:
                family = type(loader).__name__
                number = self._counters.get(family, 0) + 1
                self._counters[family] = number
                label = f"{family}{NUMBER_MARK}{number}"
                self._remember(loader, label)
            return label

    def loaders(self) -> list[Any]:
        """The named objects still alive, in the order they were named."""
        entries = tuple(self._by_id.values())  # one C-level copy: a collection may run after
        return [obj for obj in (ref() for ref, _ in entries) if obj is not None]

    def find(
        self, part: Any, holds: Callable[[Any, Any], bool], candidates: list[Any]
    ) -> str | None:
        """The label of the loader that ``holds(loader, part)``, one named already or one of
        ``candidates``; None when none does. The candidates (the loaders built in the open
        window) are all named first, in their order: a loader's number never depends on which
        loader a rank happened to iterate first."""
        for loader in candidates:
            self.name(loader)
        for loader in self.loaders():
            try:
                if loader is not part and holds(loader, part):
                    return self.name(loader)
            except Exception:  # a user's object answered oddly: not this loader
                continue
        return None

    def _get(self, obj: Any) -> str | None:
        entry = self._by_id.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def _remember(self, obj: Any, label: str) -> None:
        key = id(obj)

        def gone(ref: Any) -> None:  # no lock: it may run in a collection inside one
            if self._by_id.get(key, (None,))[0] is ref:
                del self._by_id[key]

        ref: Callable[[], Any]
        try:
            ref = weakref.ref(obj, gone)
        except TypeError:  # no weak reference: held, so its id is never reused
            ref = _Held(obj)
        self._by_id.pop(key, None)  # a dead entry's place: the order named
        self._by_id[key] = (ref, label)


class _Held:
    """A strong reference with a weak reference's call."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


LOADERS = LoaderNames()
