"""The public ``audit()`` context manager (placeholder while the engine is written)."""

from __future__ import annotations

from typing import Any


class Audit:
    """Placeholder."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __enter__(self) -> Audit:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def audit(**kwargs: Any) -> Audit:
    return Audit(**kwargs)
