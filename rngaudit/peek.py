"""Total reads of a user's objects: an attribute, a size, a count; never raising, never iterating.

A sampler, dataset, loader or collate function can be any shape: a property that raises, a
``__len__`` that raises (``BatchSampler`` over an infinite sampler), a ``__bool__`` that calls
``len()``, a ``__getattr__`` that returns anything. Everything here answers ``None`` for what
cannot be read safely; nothing takes a truth value, iterates or draws.
"""

from __future__ import annotations

import contextlib
from typing import Any


def attr(obj: Any, name: str) -> Any:
    """``obj.name``, or None when it is missing or reading it raises anything."""
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:  # a property or __getattr__ that raises: unknown, never an error
        return None


def first_attr(obj: Any, *names: str) -> Any:
    """The first of ``obj``'s attributes ``names`` that is not None (no truth value is taken)."""
    for name in names:
        value = attr(obj, name)
        if value is not None:
            return value
    return None


def size(obj: Any) -> int | None:
    """``len(obj)`` where the type defines ``__len__`` and it answers a non-negative int."""
    if obj is None or not hasattr(type(obj), "__len__"):
        return None
    try:
        n = len(obj)
    except Exception:  # unsized (an infinite sampler), or a __len__ that raises
        return None
    return n if isinstance(n, int) and n >= 0 else None


def integer(value: Any, default: int) -> int:
    """``value`` as an int (an int-like attribute read from a user's object), else ``default``."""
    if value is None or isinstance(value, bool | int):
        return default if value is None else int(value)
    with contextlib.suppress(Exception):
        return int(value)
    return default


def flag(value: Any) -> bool | None:
    """``value`` when it is a real bool (or numpy's), else None: no user ``__bool__`` is called."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):  # numpy's bool
        return bool(value)
    return None
