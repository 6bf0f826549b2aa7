"""The data-parallel modules (DDP, FSDP) of this process: noted as built, their groups' ranks."""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import weakref
from typing import Any

log = logging.getLogger("rngaudit")

_FOUND: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_GROUPS: dict[int, list[int]] = {}  # id(module) -> its group's ranks
_SEARCHED = [False]  # the heap was searched (once per process)
# FSDP2's fully_shard swaps a module's class (no __init__ runs): noted where it returns
FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
DATA_PARALLEL_CLASSES = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel"),
    ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel"),
    ("torch.distributed.fsdp", "FSDPModule"),
)


def note_module(module: Any) -> None:
    """A data-parallel module just built (the guard's wrapper on its ``__init__``)."""
    with contextlib.suppress(Exception):
        _FOUND[id(module)] = module
        _GROUPS[id(module)] = _group_ranks(module)


def installed(torch_loaded: bool) -> None:
    """The guard installed its wrappers (data-parallel modules built from now on are noted):
    the heap is searched once more when needed, for modules built before, unless torch was
    not even imported (none can exist)."""
    _SEARCHED[0] = not torch_loaded


def modules() -> list[Any]:
    """The data-parallel modules noted so far that are still alive."""
    return list(_FOUND.values())


def group_of(module: Any) -> list[int]:
    """The ranks of ``module``'s data-parallel group (as noted, else read now)."""
    ranks = _GROUPS.get(id(module))
    if ranks is None:
        ranks = _group_ranks(module)
    return list(ranks)


def _group_ranks(module: Any) -> list[int]:
    dist = sys.modules["torch.distributed"]
    try:
        return sorted(int(r) for r in dist.get_process_group_ranks(module.process_group))
    except Exception:  # the default group, or one this version cannot name
        return list(range(int(dist.get_world_size())))


def data_parallel_groups(scan: bool) -> list[list[int]] | None:
    """The ranks of each data-parallel group in this process: the process groups of the
    ``DistributedDataParallel`` / FSDP modules that exist (the whole world for the default
    group); None when there is none (no data-parallel signal). Modules are noted as they are
    built while the guard is installed; those built before are found by one search of the
    heap per installation of the guard (``scan``: at the first observed epoch's end)."""
    alive = [_GROUPS[k] for k in list(_FOUND.keys()) if k in _GROUPS]
    if alive:
        return [list(g) for g in dict.fromkeys(tuple(g) for g in alive)]
    if not scan or _SEARCHED[0]:
        return None
    _SEARCHED[0] = True
    classes = []
    for module, name in DATA_PARALLEL_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            classes.append(cls)
    if not classes:
        return None
    kinds = tuple(classes)
    groups: list[list[int]] = []
    try:
        for obj in gc.get_objects():
            # by the type, never the object's ``__class__`` (a property on some objects: user
            # code; torch's deprecated ``reduce_op`` warned from it)
            if issubclass(type(obj), kinds):
                note_module(obj)
                ranks = _group_ranks(obj)
                if ranks not in groups:
                    groups.append(ranks)
    except Exception:
        log.debug("rngaudit: could not look for data-parallel modules", exc_info=True)
    return groups or None
