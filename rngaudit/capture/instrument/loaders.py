"""Loaders built inside the window: registered with the recorder, their samplers marked."""

from __future__ import annotations

import sys
from typing import Any

from rngaudit.capture.instrument import samplers as instrument_samplers
from rngaudit.capture.recorder import Recorder
from rngaudit.epochs import sharding

# (module, class) whose __init__ registers the new loader with the recorder.
LOADER_CLASSES = (
    ("torch.utils.data.dataloader", "DataLoader"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader"),
)


def install(rec: Recorder) -> None:
    """Wrap the ``__init__`` of the loader classes that are imported."""
    for module_name, cls_name in LOADER_CLASSES:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
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
    mark_samplers(rec, sharding.loader_chain(loader))


def mark_samplers(rec: Recorder, samplers: list[Any]) -> None:
    """Mark the iteration code of ``samplers``' classes; unmarked when the window closes."""
    try:
        codes = instrument_samplers.mark_objects(samplers)
    except Exception:  # never break the loader over attribution
        return
    rec.patches.mark(codes)
