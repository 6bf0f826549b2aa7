"""Stable, readable names for the generators an audit sees."""

from __future__ import annotations

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
