"""Known samplers and loaders: mark their code so draws made inside them are attributed."""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any

from rngaudit.capture.callsite import MARKED_CODES
from rngaudit.capture.recorder import ROLE_ITERATION, ROLE_LOADER, ROLE_SAMPLER

# module -> (role, class names, method names)
KNOWN: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {
    "torch.utils.data.sampler": [
        (
            ROLE_SAMPLER,
            ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler"),
            ("__iter__", "__next__"),
        )
    ],
    "torch.utils.data.distributed": [(ROLE_SAMPLER, ("DistributedSampler",), ("__iter__",))],
    "torch.utils.data.dataloader": [
        (ROLE_LOADER, ("DataLoader",), ("_get_iterator",)),
        (ROLE_ITERATION, ("DataLoader",), ("__iter__",)),
        (ROLE_ITERATION, ("_BaseDataLoaderIter",), ("__next__",)),
    ],
    "torchdata.stateful_dataloader.sampler": [
        (
            ROLE_SAMPLER,
            (
                "RandomSampler",
                "_StatefulRandomSamplerIterator",
                "BatchSampler",
                "_BatchSamplerIterator",
                "StatefulDistributedSampler",
            ),
            ("__init__", "__iter__", "__next__"),
        )
    ],
    "torchdata.stateful_dataloader.stateful_dataloader": [
        (ROLE_LOADER, ("StatefulDataLoader",), ("_get_iterator", "state_dict")),
        (ROLE_ITERATION, ("StatefulDataLoader",), ("__iter__",)),
        (ROLE_ITERATION, ("_StatefulBaseDataLoaderIter",), ("__next__",)),
    ],
    "accelerate.data_loader": [
        (
            ROLE_SAMPLER,
            ("SeedableRandomSampler", "BatchSamplerShard", "SkipBatchSampler"),
            ("__iter__", "_iter_with_split", "_iter_with_no_split"),
        ),
        (ROLE_SAMPLER, ("IterableDatasetShard",), ("__iter__",)),
        (ROLE_ITERATION, ("DataLoaderShard", "DataLoaderDispatcher"), ("__iter__",)),
    ],
}


def _code(cls: Any, method: str) -> CodeType | None:
    func = cls.__dict__.get(method)
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    return code if isinstance(code, CodeType) else None


def mark_module(module_name: str) -> list[CodeType]:
    """Mark the known classes of an imported module; returns the codes marked."""
    module = sys.modules.get(module_name)
    if module is None:
        return []
    marked: list[CodeType] = []
    for role, classes, methods in KNOWN.get(module_name, []):
        for cls_name in classes:
            cls = getattr(module, cls_name, None)
            if cls is None:
                continue
            for method in methods:
                code = _code(cls, method)
                if code is not None and code not in MARKED_CODES:
                    MARKED_CODES[code] = role
                    marked.append(code)
    return marked


def mark_objects(samplers: list[Any]) -> list[CodeType]:
    """Mark the iteration code of the classes of ``samplers`` (a user's own samplers too)."""
    marked: list[CodeType] = []
    for sampler in samplers:
        for klass in type(sampler).__mro__:
            if klass is object:
                break
            for method in ("__iter__", "__next__"):
                code = _code(klass, method)
                if code is not None and code not in MARKED_CODES:
                    MARKED_CODES[code] = ROLE_SAMPLER
                    marked.append(code)
    return marked
