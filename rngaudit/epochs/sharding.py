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

from rngaudit import library_samplers, peek, verdict
from rngaudit.capture.fingerprint import digest_bytes
from rngaudit.schema import SamplerDraw

_MAX_CHAIN = 8
_MAX_DATASET_DEPTH = 8
PREFIX_BATCHES = 64  # batches of the pre-shard order digested per epoch


def _class_name(obj: Any) -> str:
    return type(obj).__name__


RANK_NAMES = ("rank", "_rank", "process_index")
WORLD_NAMES = (
    "num_replicas", "_num_replicas", "world", "world_size", "_world_size", "num_processes",
)  # fmt: skip


def shards_itself(nodes: list[Any], rank: int, world: int) -> bool:
    """Whether a sampler of the chain holds ``rank`` and ``world`` (this rank's, the run's) as
    ints: a sampler of the program's own that splits the order between the ranks, as a
    DistributedSampler does. Read without a call."""
    for node in nodes:
        held = (peek.first_attr(node, *RANK_NAMES), peek.first_attr(node, *WORLD_NAMES))
        if all(type(v) is int for v in held) and held == (rank, world):
            return True
    return False


def is_distributed_sampler(obj: Any) -> bool:
    return library_samplers.is_a(obj, "DistributedSampler")


def has_own_iter(obj: Any) -> bool:
    """Whether ``obj`` is a DistributedSampler whose class has an ``__iter__`` of its own (a
    subclass's order, which its seed and epoch do not fix)."""
    cls = library_samplers.loaded(library_samplers.row("DistributedSampler"))
    kind = type(obj)  # never obj.__class__ (a property on some objects: user code)
    if not isinstance(cls, type) or not issubclass(kind, cls):
        return False
    return getattr(kind, "__iter__", None) is not getattr(cls, "__iter__", None)


def _is_batch_sampler_shard(obj: Any) -> bool:
    return library_samplers.is_a(obj, "BatchSamplerShard")


def _is_iterable_shard(obj: Any) -> bool:
    return library_samplers.is_a(obj, "IterableDatasetShard")


def allowance(shard: Any) -> verdict.Sharding:
    """What a correct ``shard`` may hand a second time (the facts :func:`verdict.allowed_as`
    needs): accelerate's BatchSamplerShard with ``even_batches`` (and no ``drop_last``)
    re-hands the epoch's first samples to complete its last round, at most ``num_processes x
    batch_size`` of the samples its inner sampler holds (a Subset's, not its root's); any other
    sharder nothing beyond the rule's own allowance (a DistributedSampler pads ``world - 1``)."""
    if is_distributed_sampler(shard):
        total = peek.attr(shard, "total_size")
        size = peek.size(peek.attr(shard, "dataset"))
        if type(total) is int and size is not None:
            return verdict.Sharding(pads=max(0, total - size))
        return verdict.UNKNOWN
    if not _is_batch_sampler_shard(shard):
        return verdict.UNKNOWN
    if peek.flag(peek.attr(shard, "even_batches")) is not True:
        return verdict.UNKNOWN
    if peek.flag(peek.attr(shard, "drop_last")) is not False:
        return verdict.UNKNOWN
    world = peek.integer(peek.attr(shard, "num_processes"), 1)
    batch = peek.integer(peek.attr(shard, "batch_size"), 0)
    if world < 2 or batch < 1:
        return verdict.UNKNOWN
    covers = peek.size(peek.attr(peek.attr(shard, "batch_sampler"), "sampler"))
    return verdict.Sharding(rounds=world * batch, covers=covers or 0)


def shard_of(nodes: list[Any]) -> Any:
    """The sampler that splits the order between ranks, or None."""
    for node in nodes:
        known = library_samplers.sharder(node, library_samplers.ORDER)
        if known is not None and peek.integer(peek.attr(node, known.world or ""), 1) > 1:
            return node
    return None


def is_shuffling(nodes: list[Any]) -> bool:
    """Whether the order is random by design (so an epoch repeating the last is suspicious)."""
    for node in nodes:
        if is_distributed_sampler(node):
            return bool(peek.flag(peek.attr(node, "shuffle")))
        if library_samplers.shuffles(_class_name(node)):
            return True
    return False


def stream_shard(dataset: Any) -> Any:
    """The iterable dataset that splits one stream between ranks, or None: accelerate's
    ``IterableDatasetShard`` over more than one process, or a Hugging Face ``IterableDataset``
    after ``split_dataset_by_node`` (its ``_distributed`` says the world size)."""
    if _is_iterable_shard(dataset):
        return dataset if peek.integer(peek.attr(dataset, "num_processes"), 1) > 1 else None
    distributed = peek.attr(dataset, "_distributed")
    if distributed is not None and peek.integer(peek.attr(distributed, "world_size"), 1) > 1:
        return dataset
    return None


def describe_stream(dataset: Any) -> str:
    """What fixes an iterable dataset's stream before it is split, read without iterating: the
    classes of its pipeline, the state fingerprints of the generators in it, its epoch and
    shard count (Hugging Face), or the wrapped dataset (accelerate)."""
    from rngaudit.capture import fingerprint

    if _is_iterable_shard(dataset):
        inner = peek.attr(dataset, "dataset")
        epoch = peek.attr(dataset, "epoch")
        return f"{_class_name(dataset)}(epoch={epoch}, of={describe_stream(inner)})"
    parts = [_class_name(dataset)]
    epoch = peek.attr(dataset, "_epoch")
    if epoch is not None:
        parts.append(f"epoch={peek.integer(epoch, -1)}")
    node = peek.attr(dataset, "_ex_iterable")
    shards = peek.integer(peek.attr(node, "num_shards"), 0)
    # Split by examples (every world-th example of one shuffled stream): the shuffle must be
    # the same on every rank. Split by shards: the shuffle seed orders the shard list before
    # each rank takes its own (stream_shares), then only reorders within them.
    by_examples = _split_by_examples(dataset)
    parts.append(f"shards={shards}, split={'examples' if by_examples else 'shards'}")
    for _ in range(_MAX_CHAIN):
        if node is None:
            break
        generator = peek.attr(node, "generator") if by_examples else None
        state = ""
        if generator is not None:
            try:
                state = f"[{fingerprint.of(generator)}]"
            except Exception:
                state = "[?]"
        parts.append(_class_name(node) + state)
        node = peek.attr(node, "ex_iterable")
    return "stream:" + " > ".join(parts)


def _split_by_examples(dataset: Any) -> bool:
    """Whether a Hugging Face stream after ``split_dataset_by_node`` is split by examples
    (datasets' rule: unless the strategy is "shards", or "auto" with the shard count a multiple
    of the world size)."""
    distributed = peek.attr(dataset, "_distributed")
    if distributed is None:
        return False
    shards = peek.integer(peek.attr(peek.attr(dataset, "_ex_iterable"), "num_shards"), 0)
    world = peek.integer(peek.attr(distributed, "world_size"), 1)
    strategy = peek.attr(distributed, "strategy")
    return not (strategy == "shards" or (strategy == "auto" and world > 0 and shards % world == 0))


def _source_id(source: Any) -> str | None:
    """What one shard's source is, read without opening it: a file path (or other plain
    value) as it is, a Hugging Face dataset by its fingerprint; None for any other shape."""
    if isinstance(source, str | int | float | bool):
        return repr(source)
    fingerprint = peek.attr(source, "_fingerprint")
    if isinstance(fingerprint, str):
        return f"{fingerprint}:{peek.size(source)}"
    return None


def stream_shares(dataset: Any) -> list[str] | None:
    """The shards this rank will read of a Hugging Face stream split by shards, at its epoch
    0: a digest of each shard's sources (its entries of the shard lists the stream's source
    holds, in their order after ``shuffle()``), every world-th shard from the rank's, as
    datasets assigns them. The shuffle seed orders that list before the shards are assigned,
    so ranks shuffled differently may read the same shards (or not: their shares say). None
    when split by examples, at a later epoch (reshuffled as it is iterated), or for any
    pipeline shape not read here (several sources): unknown, never compared."""
    distributed = peek.attr(dataset, "_distributed")
    if distributed is None or _split_by_examples(dataset):
        return None
    if peek.integer(peek.attr(dataset, "_epoch"), -1) != 0:
        return None
    top = peek.attr(dataset, "_ex_iterable")
    shards = peek.integer(peek.attr(top, "num_shards"), 0)
    rank = peek.integer(peek.attr(distributed, "rank"), -1)
    world = peek.integer(peek.attr(distributed, "world_size"), 1)
    if shards <= 0 or not 0 <= rank < world:
        return None
    node = top
    for _ in range(_MAX_CHAIN):
        if peek.attr(node, "ex_iterables") is not None:  # several sources: not read here
            return None
        inner = peek.attr(node, "ex_iterable")
        if inner is None:
            break
        node = inner
    kwargs = peek.attr(node, "kwargs")
    if not isinstance(kwargs, dict):
        return None
    lists = [v for _, v in sorted(kwargs.items(), key=lambda kv: str(kv[0])) if type(v) is list]
    if not lists or any(len(v) != shards for v in lists):
        return None
    share: list[str] = []
    for i in range(rank, shards, world):
        ids = [_source_id(v[i]) for v in lists]
        if any(x is None for x in ids):
            return None
        share.append(digest_bytes(repr(ids).encode()))
    return share


def loader_is_sharded(loader: Any) -> bool:
    """A DataLoader whose order is split between ranks (or whose dataset is a shard)."""
    if shard_of(library_samplers.loader_chain(loader)) is not None:
        return True
    dataset = peek.attr(loader, "dataset")
    return _is_iterable_shard(dataset) or stream_shard(dataset) is not None


def digest_element(element: Any, depth: int = 0) -> int:
    """crc32 of one element of a stream (tensors by their bytes, containers item by item)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and isinstance(element, torch.Tensor):
            return zlib.crc32(element.detach().cpu().contiguous().numpy().tobytes())
        if depth < 4 and isinstance(element, dict):
            data = repr([(repr(k), digest_element(v, depth + 1)) for k, v in element.items()])
            return zlib.crc32(data.encode())
        if depth < 4 and isinstance(element, list | tuple):
            return zlib.crc32(repr([digest_element(v, depth + 1) for v in element]).encode())
        return zlib.crc32(repr(element).encode())
    except Exception:  # an element that cannot be read: its type only
        return zlib.crc32(type(element).__name__.encode())


# --------------------------------------------------------------------------- the dataset


_index_digests: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], str]] = (
    weakref.WeakKeyDictionary()
)


def _digest_indices(indices: Any) -> str:
    """crc32 of an index sequence (list, tuple, range, tensor, ndarray), read without drawing;
    any other shape (an iterator, a lazy mapping) is named, never iterated."""
    if isinstance(indices, range):
        return f"range({indices.start},{indices.stop},{indices.step})"
    try:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(indices, torch.Tensor):
            data = indices.detach().cpu().contiguous().numpy().tobytes()
            return digest_bytes(data)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(indices, numpy.ndarray):
            return digest_bytes(numpy.ascontiguousarray(indices).tobytes())
        if isinstance(indices, list | tuple):
            import array

            try:
                data = array.array("q", (int(i) for i in indices)).tobytes()
            except (TypeError, ValueError, OverflowError):
                data = repr(indices).encode()
            return digest_bytes(data)
    except Exception:  # a tensor subclass or element that cannot be read: unknown
        pass
    return f"unknown:{type(indices).__name__}"


_FULL_DIGEST = 1 << 16  # index lists up to this long are digested whole, longer ones sampled
_SAMPLED = 4096


def _indices_digest(subset: Any) -> str:
    """The digest of a Subset's indices, read afresh at every check (they may be reshuffled in
    place between epochs): whole up to ``_FULL_DIGEST`` entries, else the length and
    ``_SAMPLED`` evenly spaced entries (a reshuffle or a different split changes almost all)."""
    indices = peek.attr(subset, "indices")
    n = peek.size(indices)
    if n is None or n <= _FULL_DIGEST or not isinstance(indices, list | tuple):
        return _digest_indices(indices)
    step = n / _SAMPLED
    sample = [indices[int(k * step)] for k in range(_SAMPLED)]
    return f"{n}:{_digest_indices(sample)}"


def describe_dataset(dataset: Any, depth: int = 0) -> str:
    """A string naming the dataset's structure and index mapping (equal iff the mapping is)."""
    if dataset is None:
        return "None"
    if depth > _MAX_DATASET_DEPTH:
        return "..."
    name = _class_name(dataset)
    n = peek.size(dataset)
    size = "?" if n is None else str(n)
    inner = peek.attr(dataset, "dataset")
    if peek.attr(dataset, "indices") is not None and inner is not None:  # Subset and look-alikes
        return (
            f"{name}(len={size}, indices={_indices_digest(dataset)}, "
            f"of={describe_dataset(inner, depth + 1)})"
        )
    datasets = peek.attr(dataset, "datasets")
    if isinstance(datasets, list | tuple):  # ConcatDataset / ChainDataset
        parts = ", ".join(describe_dataset(d, depth + 1) for d in datasets[:64])
        return f"{name}(len={size}, [{parts}])"
    if isinstance(peek.attr(dataset, "_fingerprint"), str):  # Hugging Face datasets.Dataset
        # which rows, in which order: its indices mapping (select, shuffle, filter, splits);
        # the fingerprint also covers content (a .map() augmentation): see describe_content
        return f"{name}(len={size}, indices={_hf_indices_digest(dataset)})"
    if _is_iterable_shard(dataset) and inner is not None:
        return f"{name}(of={describe_dataset(inner, depth + 1)})"
    if inner is not None:  # a wrapper holding the dataset it indexes (a user's own class)
        return f"{name}(len={size}, of={describe_dataset(inner, depth + 1)})"
    return f"{name}(len={size})"


def _hf_indices_digest(dataset: Any) -> str:
    """crc32 of a Hugging Face dataset's indices mapping (``None``: the rows as stored)."""
    table = peek.attr(dataset, "_indices")
    if table is None:
        return "none"
    cached = _index_digests.get(dataset)
    if cached is not None and cached[0] == (peek.size(table) or 0, id(table)):
        return cached[1]
    try:
        digest = _digest_indices(table.column(0).to_numpy())
    except Exception:  # a layout this version does not have: unknown, never an error
        return f"unknown:{type(table).__name__}"
    with contextlib.suppress(TypeError):
        _index_digests[dataset] = ((peek.size(table) or 0, id(table)), digest)
    return digest


def describe_content(dataset: Any, depth: int = 0) -> str:
    """What the rows hold, where a library says so: the Hugging Face fingerprints in the
    dataset's tree ("" when none). Ranks may differ here by design (a per-rank ``.map()``
    augmentation) while sharding the same samples."""
    if dataset is None or depth > _MAX_DATASET_DEPTH:
        return ""
    fingerprint = peek.attr(dataset, "_fingerprint")
    if isinstance(fingerprint, str):
        return fingerprint
    inner = peek.attr(dataset, "dataset")
    parts = [describe_content(inner, depth + 1)] if inner is not None else []
    datasets = peek.attr(dataset, "datasets")
    if isinstance(datasets, list | tuple):
        parts += [describe_content(d, depth + 1) for d in datasets[:64]]
    return ",".join(p for p in parts if p)


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
            except Exception:  # not a batch of int-like indices: its repr, else its type
                try:
                    data = repr(batch).encode()
                except Exception:
                    data = type(batch).__name__.encode()
            self.batches.append(digest_bytes(data))


def distributed_sampler_state(sampler: Any) -> dict[str, Any]:
    """What fixes a DistributedSampler's global order (its rank excepted)."""

    def read(name: str) -> Any:
        value = peek.attr(sampler, name)
        return value if value is None or isinstance(value, bool | int | float | str) else None

    return {
        "class": _class_name(sampler),
        "seed": read("seed"),
        "epoch": read("epoch"),
        "shuffle": read("shuffle"),
        "drop_last": read("drop_last"),
        "num_replicas": read("num_replicas"),
        "total_size": read("total_size"),
        "dataset_len": peek.size(peek.attr(sampler, "dataset")),
        "resume_at": read("next_yielded"),
    }
