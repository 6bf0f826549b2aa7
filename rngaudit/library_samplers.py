"""The library classes rngaudit knows by name (one table); the sampler chain: walk, name."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rngaudit import peek

# What a known class is to the audit (a row's ``kind``).
SAMPLER = "sampler"  # a library sampler: a chain ending in one is not the user's
ITERATOR = "sampler iterator"  # a library sampler's own iterator: its draws are the sampler's
LOADER = "loader"  # a DataLoader class: its __init__ registers the loader built in a window
LOADER_ITERATOR = "loader iterator"  # a loader's iterator: its frames mark the iteration phase
WORKER_ITERATOR = "worker iterator"  # a loader's iterator whose __init__ starts the workers

# What a mark attributes a draw to (the recorder's roles: capture.recorder.ROLE_*).
BY_SAMPLER = "sampler"
BY_LOADER = "loader"
IN_ITERATION = "iteration"

# What a sharding class splits between ranks (a row's ``shards``).
ORDER = "order"  # the index order (a sampler)
STREAM = "stream"  # an iterable dataset's stream

CHAIN_SEPARATOR = " > "  # the sampler chain's name: class names, outermost first
MAX_CHAIN = 8  # samplers followed down a chain


@dataclass(frozen=True)
class Known:
    """One library class and its facts."""

    name: str  # the class's __name__, as the sampler chain names it
    module: str  # the module that defines it
    kind: str  # SAMPLER, ITERATOR, LOADER, LOADER_ITERATOR or WORKER_ITERATOR
    marks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (role, methods) whose frames attribute
    shuffles: bool = False  # its order is random by design (a repeat across epochs is suspicious)
    shards: str | None = None  # ORDER or STREAM: what it splits between ranks
    world: str | None = None  # the attribute saying how many ranks it splits between


_TORCH = "torch.utils.data.sampler"
_TORCH_DIST = "torch.utils.data.distributed"
_TORCH_LOADER = "torch.utils.data.dataloader"
_TD = "torchdata.stateful_dataloader.sampler"
_TD_LOADER = "torchdata.stateful_dataloader.stateful_dataloader"
_ACC = "accelerate.data_loader"
_ITER = ("__iter__", "__next__")
_TD_ITER = ("__init__", "__iter__", "__next__")
_ACC_ITER = ("__iter__", "_iter_with_split", "_iter_with_no_split")

TABLE: tuple[Known, ...] = (
    # torch
    Known("RandomSampler", _TORCH, SAMPLER, ((BY_SAMPLER, _ITER),), shuffles=True),
    Known("SubsetRandomSampler", _TORCH, SAMPLER, ((BY_SAMPLER, _ITER),), shuffles=True),
    Known("WeightedRandomSampler", _TORCH, SAMPLER, ((BY_SAMPLER, _ITER),), shuffles=True),
    Known("SequentialSampler", _TORCH, SAMPLER),  # draws nothing: not marked
    Known("BatchSampler", _TORCH, SAMPLER, ((BY_SAMPLER, _ITER),)),
    Known(
        "DistributedSampler",
        _TORCH_DIST,
        SAMPLER,
        ((BY_SAMPLER, ("__iter__",)),),
        shards=ORDER,
        world="num_replicas",
    ),
    Known(
        "DataLoader",
        _TORCH_LOADER,
        LOADER,
        ((BY_LOADER, ("_get_iterator",)), (IN_ITERATION, ("__iter__",))),
    ),
    Known("_BaseDataLoaderIter", _TORCH_LOADER, LOADER_ITERATOR, ((IN_ITERATION, ("__next__",)),)),
    Known("_MultiProcessingDataLoaderIter", _TORCH_LOADER, WORKER_ITERATOR),
    # torchdata
    Known("RandomSampler", _TD, SAMPLER, ((BY_SAMPLER, _TD_ITER),), shuffles=True),
    Known("_StatefulRandomSamplerIterator", _TD, ITERATOR, ((BY_SAMPLER, _TD_ITER),)),
    Known("BatchSampler", _TD, SAMPLER, ((BY_SAMPLER, _TD_ITER),)),
    Known("_BatchSamplerIterator", _TD, ITERATOR, ((BY_SAMPLER, _TD_ITER),)),
    # a DistributedSampler subclass: it shards as one
    Known("StatefulDistributedSampler", _TD, SAMPLER, ((BY_SAMPLER, _TD_ITER),)),
    Known(
        "StatefulDataLoader",
        _TD_LOADER,
        LOADER,
        ((BY_LOADER, ("_get_iterator", "state_dict")), (IN_ITERATION, ("__iter__",))),
    ),
    Known(
        "_StatefulBaseDataLoaderIter", _TD_LOADER, LOADER_ITERATOR, ((IN_ITERATION, ("__next__",)),)
    ),
    Known("_StatefulMultiProcessingDataLoaderIter", _TD_LOADER, WORKER_ITERATOR),
    # accelerate
    Known("SeedableRandomSampler", _ACC, SAMPLER, ((BY_SAMPLER, _ACC_ITER),), shuffles=True),
    Known(
        "BatchSamplerShard",
        _ACC,
        SAMPLER,
        ((BY_SAMPLER, _ACC_ITER),),
        shards=ORDER,
        world="num_processes",
    ),
    Known("SkipBatchSampler", _ACC, SAMPLER, ((BY_SAMPLER, _ACC_ITER),)),
    Known(
        "IterableDatasetShard",
        _ACC,
        SAMPLER,
        ((BY_SAMPLER, ("__iter__",)),),
        shards=STREAM,
        world="num_processes",
    ),
    Known("DataLoaderShard", _ACC, LOADER_ITERATOR, ((IN_ITERATION, ("__iter__",)),)),
    Known("DataLoaderDispatcher", _ACC, LOADER_ITERATOR, ((IN_ITERATION, ("__iter__",)),)),
)


def of_kind(kind: str) -> list[Known]:
    """The rows of one kind, in the table's order."""
    return [k for k in TABLE if k.kind == kind]


def modules() -> list[str]:
    """The modules that define a known class, each once, in the table's order."""
    return list(dict.fromkeys(k.module for k in TABLE))


def library_names() -> set[str]:
    """The names of the library samplers (a chain ending in one is not the user's)."""
    return {k.name for k in TABLE if k.kind == SAMPLER}


def shuffles(name: str) -> bool:
    """Whether a class of this name is a library sampler whose order is random by design."""
    return any(k.shuffles and k.name == name for k in TABLE)


def loaded(known: Known) -> type | None:
    """The class of a row, when its module is imported; None otherwise (nothing is imported)."""
    cls = getattr(sys.modules.get(known.module), known.name, None)
    return cls if isinstance(cls, type) else None


def row(name: str) -> Known:
    """The first row of this class name (the sharding classes' names are unique)."""
    return next(k for k in TABLE if k.name == name)


def is_a(obj: Any, name: str) -> bool:
    """Whether ``obj`` is an instance of the known class ``name`` (or of a subclass)."""
    cls = loaded(row(name))
    return cls is not None and isinstance(obj, cls)


def sharder(obj: Any, shards: str) -> Known | None:
    """The row of the known class sharding ``shards`` (ORDER or STREAM) that ``obj`` is an
    instance of, the first in the table's order; None when it is none of them."""
    for known in TABLE:
        if known.shards == shards:
            cls = loaded(known)
            if cls is not None and isinstance(obj, cls):
                return known
    return None


def chain(root: Any) -> list[Any]:
    """``root`` and the samplers inside it (``batch_sampler`` / ``sampler``), outermost first.

    No truth value is taken (a ``BatchSampler``'s is its ``len()``, which an unsized sampler
    raises) and nothing is iterated."""
    out: list[Any] = []
    node = root
    while node is not None and len(out) < MAX_CHAIN and all(node is not c for c in out):
        out.append(node)
        node = peek.first_attr(node, "batch_sampler", "sampler")
    return out


def loader_chain(loader: Any) -> list[Any]:
    """A DataLoader's batch sampler (or sampler) and the samplers inside it, outermost first."""
    return chain(peek.first_attr(loader, "batch_sampler", "sampler"))


def chain_name(nodes: Iterable[Any]) -> str:
    """The name of a sampler chain, ``nodes`` outermost first: ``BatchSampler > RandomSampler``."""
    return CHAIN_SEPARATOR.join(type(n).__name__ for n in nodes)


def chain_classes(chain: str) -> list[str]:
    """The class names of a chain's name, outermost first (the one parser of it)."""
    return [part.strip() for part in chain.split(CHAIN_SEPARATOR)]


def ends_in_library(chain: str) -> bool:
    """Whether the innermost sampler of a chain is a library's (not the user's own)."""
    return chain_classes(chain)[-1] in library_names()
