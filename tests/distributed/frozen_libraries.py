"""The rank scripts' libraries left out of every later collection (one ``gc.freeze()``)."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterable
from contextlib import suppress


def freeze(libraries: Iterable[str]) -> None:
    """Import now what a rank script's set-ups import lazily (the first DDP or FSDP
    constructor's torch._dynamo, ~120k objects, and ``libraries`` where installed) and leave it
    all, with torch, out of every later collection: each set-up's ``gc.collect()`` then scans
    what the set-ups made, milliseconds, not ~0.15 s of CPU (measured: the collects were about
    half of a generated-configs launch's CPU time). Call it before any set-up runs: modules
    only, no object a set-up builds, so nothing rngaudit looks for on the heap (data-parallel
    modules, meshes) is hidden from ``gc.get_objects()``."""
    import torch._dynamo  # noqa: F401

    for name in libraries:
        with suppress(ImportError):
            importlib.import_module(name)
    gc.freeze()
