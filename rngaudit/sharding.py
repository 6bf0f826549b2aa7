"""What a loader shards: its shard sampler, the order feeding it, and its dataset's index mapping.

Everything here reads attributes; nothing iterates a sampler, calls ``__getitem__`` or draws.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any

from rngaudit.records import SamplerDraw

_MAX_CHAIN = 8
_MAX_DATASET_DEPTH = 8
PREFIX_BATCHES = 64  # batches of the pre-shard order digested per epoch

# Samplers whose order is random by design (a repeated order across epochs is suspicious).
SHUFFLING = (
    "RandomSampler",
    "SeedableRandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
)


def _class_name(obj: Any) -> str:
    return type(obj).__name__


def is_distributed_sampler(obj: Any) -> bool:
    dist_mod = sys.modules.get("torch.utils.data.distributed")
    cls = getattr(dist_mod, "DistributedSampler", None)
    return cls is not None and isinstance(obj, cls)


def _is_batch_sampler_shard(obj: Any) -> bool:
    acc = sys.modules.get("accelerate.data_loader")
    cls = getattr(acc, "BatchSamplerShard", None)
    return cls is not None and isinstance(obj, cls)


def _is_iterable_shard(obj: Any) -> bool:
    acc = sys.modules.get("accelerate.data_loader")
    cls = getattr(acc, "IterableDatasetShard", None)
    return cls is not None and isinstance(obj, cls)


def chain(root: Any) -> list[Any]:
    """``root`` and the samplers inside it (``batch_sampler`` / ``sampler``), outermost first."""
    out: list[Any] = []
    node = root
    while node is not None and len(out) < _MAX_CHAIN and all(node is not c for c in out):
        out.append(node)
        node = getattr(node, "batch_sampler", None) or getattr(node, "sampler", None)
    return out


def shard_of(nodes: list[Any]) -> Any:
    """The sampler that splits the order between ranks, or None."""
    for node in nodes:
        if _is_batch_sampler_shard(node):
            if int(getattr(node, "num_processes", 1) or 1) > 1:
                return node
        elif is_distributed_sampler(node) and int(getattr(node, "num_replicas", 1) or 1) > 1:
            return node
    return None


def chain_name(nodes: list[Any]) -> str:
    return " > ".join(_class_name(n) for n in nodes)


def is_shuffling(nodes: list[Any]) -> bool:
    """Whether the order is random by design (so an epoch repeating the last is suspicious)."""
    for node in nodes:
        if is_distributed_sampler(node):
            return bool(getattr(node, "shuffle", False))
        if _class_name(node) in SHUFFLING:
            return True
    return False


def loader_chain(loader: Any) -> list[Any]:
    """A DataLoader's batch sampler (or sampler) and the samplers inside it, outermost first."""
    return chain(getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None))


def loader_is_sharded(loader: Any) -> bool:
    """A DataLoader whose order is split between ranks (or whose dataset is a shard)."""
    if shard_of(loader_chain(loader)) is not None:
        return True
    return _is_iterable_shard(getattr(loader, "dataset", None))


# --------------------------------------------------------------------------- the dataset


_index_digests: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], str]] = (
    weakref.WeakKeyDictionary()
)


def _digest_indices(indices: Any) -> str:
    """crc32 of an index sequence (list, range, tensor, ndarray), read without drawing."""
    if isinstance(indices, range):
        return f"range({indices.start},{indices.stop},{indices.step})"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(indices, torch.Tensor):
        data = indices.detach().cpu().contiguous().numpy().tobytes()
        return f"{zlib.crc32(data):08x}"
    try:
        import array

        data = array.array("q", (int(i) for i in indices)).tobytes()
    except (TypeError, ValueError, OverflowError):
        data = repr(list(indices)).encode()
    return f"{zlib.crc32(data):08x}"


def _indices_digest(subset: Any) -> str:
    """The digest of a Subset's indices, cached while the same index object of the same size."""
    indices = subset.indices
    try:
        key = (len(indices), id(indices))
    except TypeError:
        return _digest_indices(indices)
    cached = _index_digests.get(subset)
    if cached is not None and cached[0] == key:
        return cached[1]
    digest = _digest_indices(indices)
    with contextlib.suppress(TypeError):
        _index_digests[subset] = (key, digest)
    return digest


def describe_dataset(dataset: Any, depth: int = 0) -> str:
    """A string naming the dataset's structure and index mapping (equal iff the mapping is)."""
    if dataset is None:
        return "None"
    if depth > _MAX_DATASET_DEPTH:
        return "..."
    name = _class_name(dataset)
    try:
        size = str(len(dataset))
    except Exception:
        size = "?"
    inner = getattr(dataset, "dataset", None)
    if hasattr(dataset, "indices") and inner is not None:  # torch Subset and look-alikes
        return (
            f"{name}(len={size}, indices={_indices_digest(dataset)}, "
            f"of={describe_dataset(inner, depth + 1)})"
        )
    datasets = getattr(dataset, "datasets", None)
    if isinstance(datasets, list | tuple):  # ConcatDataset / ChainDataset
        parts = ", ".join(describe_dataset(d, depth + 1) for d in datasets[:64])
        return f"{name}(len={size}, [{parts}])"
    fingerprint = getattr(dataset, "_fingerprint", None)  # Hugging Face datasets.Dataset
    if isinstance(fingerprint, str):
        return f"{name}(len={size}, fingerprint={fingerprint})"
    if _is_iterable_shard(dataset) and inner is not None:
        return f"{name}(of={describe_dataset(inner, depth + 1)})"
    return f"{name}(len={size})"


# --------------------------------------------------------------------------- the order


@dataclass
class OrderTape:
    """The pre-shard order of one epoch, as far as it was pulled (batches digested)."""

    batches: list[str] = field(default_factory=list)
    draws: list[SamplerDraw] = field(default_factory=list)  # sampler draws that made it

    def add(self, batch: Any) -> None:
        if len(self.batches) < PREFIX_BATCHES:
            try:
                data = repr([int(i) for i in batch]).encode()
            except (TypeError, ValueError):
                data = repr(batch).encode()
            self.batches.append(f"{zlib.crc32(data):08x}")


def distributed_sampler_state(sampler: Any) -> dict[str, Any]:
    """What fixes a DistributedSampler's global order (its rank excepted)."""
    try:
        size = len(sampler.dataset)
    except Exception:
        size = None
    return {
        "class": _class_name(sampler),
        "seed": getattr(sampler, "seed", None),
        "epoch": getattr(sampler, "epoch", None),
        "shuffle": getattr(sampler, "shuffle", None),
        "drop_last": getattr(sampler, "drop_last", None),
        "num_replicas": getattr(sampler, "num_replicas", None),
        "total_size": getattr(sampler, "total_size", None),
        "dataset_len": size,
        "resume_at": getattr(sampler, "next_yielded", None),
    }
