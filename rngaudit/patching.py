"""Reversible patches: wrap an attribute with wrapt, remember the original, undo in reverse."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import wrapt

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
_MISSING = object()


class PatchSet:
    """Patches applied together and undone together, last first."""

    def __init__(self) -> None:
        self._applied: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, wrapper: Wrapper) -> None:
        """Replace ``owner.name`` with a wrapt wrapper around its current value."""
        own = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        # On a class, wrap what its __dict__ holds (keeps staticmethod/classmethod intact).
        target = own if isinstance(owner, type) and own is not _MISSING else getattr(owner, name)
        setattr(owner, name, wrapt.FunctionWrapper(target, wrapper))  # type: ignore[arg-type]
        self._applied.append((owner, name, own))

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Replace ``owner.name`` with ``value``."""
        own = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        setattr(owner, name, value)
        self._applied.append((owner, name, own))

    def undo(self) -> None:
        """Put every original back, in reverse order. Safe to call twice."""
        while self._applied:
            owner, name, own = self._applied.pop()
            if own is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, own)

    def __len__(self) -> int:
        return len(self._applied)
