"""Loaders built inside the window: registered with the recorder, their samplers marked."""

from __future__ import annotations

from typing import Any

from rngaudit import library_samplers
from rngaudit.capture.instrument import samplers as instrument_samplers
from rngaudit.capture.recorder import Recorder


def install(rec: Recorder) -> None:
    """Wrap the ``__init__`` of the known loader classes that are imported: each registers
    the loader it builds with the recorder."""
    for known in library_samplers.of_kind(library_samplers.LOADER):
        cls = library_samplers.loaded(known)
        if cls is None or "__init__" not in cls.__dict__:
            continue
        if rec.patches.replaced(cls, "__init__"):
            continue
        rec.patches.wrap(cls, "__init__", _register(rec))


def _register(rec: Recorder) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        result = wrapped(*args, **kw)
        if rec.enabled and instance is not None and all(instance is not x for x in rec.new_loaders):
            rec.new_loaders.append(instance)
            mark_chain(rec, instance)
        return result

    return wrapper


def mark_chain(rec: Recorder, loader: Any) -> None:
    """Mark the samplers of ``loader`` (a user's own among them) until the window closes."""
    mark_samplers(rec, library_samplers.loader_chain(loader))


def mark_samplers(rec: Recorder, samplers: list[Any]) -> None:
    """Mark the iteration code of ``samplers``' classes; unmarked when the window closes."""
    try:
        codes = instrument_samplers.mark_objects(samplers)
    except Exception:  # never break the loader over attribution
        return
    rec.patches.mark(codes)
