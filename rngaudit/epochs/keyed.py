"""Iterable streams keyed by a sample id the user declares: the key read, hashed, kept, compared.

A loader over an IterableDataset rngaudit does not recognise (a rank split of the user's own in
``__iter__``, shards of files, a ``get_worker_info`` split) has no index batches to observe, and
a content digest cannot tell per-rank augmentation from duplication. A per-sample key can:
:func:`sample_key` (or ``RNGAUDIT_SAMPLE_KEY``) names a field of each batch, the ids it holds are
hashed to 64 bits (ints by splitmix64, str/bytes by blake2b-8: never Python's salted ``hash``),
each rank keeps them per epoch (exactly up to :data:`CAP`, beyond that a coordinated threshold
sample: the ids whose hash lies under a threshold that halves as the kept set grows), and the
ranks' epochs are compared (every rank filters to the strictest threshold): ids taken by more than
one rank beyond one round of padding are a ``partition-overlap``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rngaudit import findings as fk
from rngaudit import verdict as rule
from rngaudit.findings import Finding

log = logging.getLogger("rngaudit")

CAP = 1 << 18  # distinct ids kept exactly per rank and epoch; beyond it a threshold sample
FULL = 1 << 64  # the threshold that keeps every hash
_MASK = FULL - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_DEPTH = 3  # nested lists / tuples of ids read this deep

REMEDY = (
    "Shard the stream so every sample id reaches one data-parallel rank per epoch: a permutation "
    "each rank takes perm[rank::world] of must be drawn from a generator seeded identically on "
    "every rank (torch.Generator().manual_seed(SEED + epoch)); shards of files must be assigned "
    "by rank from one list every rank agrees on; with DataLoader workers, split each rank's "
    "share again by torch.utils.data.get_worker_info()."
)


@dataclass(frozen=True)
class Spec:
    """A declared key: a field name / position, or a callable ``batch -> ids``."""

    key: Any  # str | int | Callable[[Any], Any]
    name: str  # as shown in messages: 'id', #0, by_id()
    ident: str  # the same on every rank: the field, or the callable's qualified name


def spec_of(key: Any) -> Spec | None:
    """The :class:`Spec` of ``key``, or None when it is not a str, an int or a callable."""
    if isinstance(key, bool):
        return None
    if isinstance(key, str):
        return Spec(key, repr(key), f"field:{key}")
    if isinstance(key, int):
        return Spec(key, f"#{key}", f"position:{key}")
    if callable(key):
        module = getattr(key, "__module__", None) or type(key).__module__
        qual = getattr(key, "__qualname__", None) or type(key).__qualname__
        return Spec(key, f"{qual}()", f"callable:{module}.{qual}")
    return None


# what sample_key registered: loaders (by their index sampler, the object their iterator holds)
# and datasets -> their key
LOADERS: weakref.WeakKeyDictionary[Any, Spec] = weakref.WeakKeyDictionary()
DATASETS: weakref.WeakKeyDictionary[Any, Spec] = weakref.WeakKeyDictionary()
# a keyed loader's place among the loaders of its identity keyed before it on this rank (the
# same on every rank that runs the same code, whichever ranks later iterate them)
ORDINALS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_COUNTS: dict[str, int] = {}


def identity(dataset: Any, spec: Spec, batch_size: Any) -> str:
    """What matches a keyed loader across ranks: the dataset's class, the key, the batch size
    (not the dataset's attributes: a self-sharding stream stores its rank)."""
    cls = type(dataset)
    size = batch_size if isinstance(batch_size, int) and batch_size > 0 else None
    return f"{cls.__module__}.{cls.__qualname__}|{spec.ident}|{size}"


def _is_loader(target: Any) -> bool:
    module = sys.modules.get("torch.utils.data")
    cls = getattr(module, "DataLoader", None)
    return isinstance(cls, type) and isinstance(target, cls)


def sample_key(target: Any, key: Any) -> Any:
    """Declare the per-sample key of ``target`` (a DataLoader, or a Dataset every loader over
    which is keyed): ``key`` is a field of each batch (a dict key, an attribute, a tuple/list
    position as an int or ``"0"``; ``"a.b"`` walks nested fields) or a callable ``batch -> ids``
    (ints, strs, bytes, or a tensor / array of ints). The ranks' epochs of an iterable-style
    loader are then compared by those ids: an id more than one rank took (beyond one round of
    padding) is a ``partition-overlap``. Returns ``target``; never raises (an unusable target or
    key is logged as a warning and ignored)."""
    spec = spec_of(key)
    if spec is None:
        log.warning("rngaudit: sample_key ignored: the key %r is not a str, an int or a callable",
                    type(key).__name__)  # fmt: skip
        return target
    try:
        if _is_loader(target):
            index = getattr(target, "_index_sampler", None)
            if index is None:
                raise TypeError("the loader has no index sampler")
            LOADERS[index] = spec
            ident = identity(
                getattr(target, "dataset", None), spec, getattr(index, "batch_size", None)
            )
            if index not in ORDINALS:
                ORDINALS[index] = _COUNTS.get(ident, 0)
                _COUNTS[ident] = ORDINALS[index] + 1
        else:
            DATASETS[target] = spec
    except Exception as exc:  # unhashable, not weak-referenceable, a property that raises
        log.warning(
            "rngaudit: sample_key ignored for a %s: %s", type(target).__name__, exc or type(exc)
        )
    return target


def registered(index: Any, dataset: Any) -> Spec | None:
    """The key declared for the loader holding ``index``, or for its ``dataset``."""
    for table, obj in ((LOADERS, index), (DATASETS, dataset)):
        try:
            spec = table.get(obj)
        except TypeError:  # unhashable: never registered
            spec = None
        if spec is not None:
            return spec
    return None


# -- reading the key ----------------------------------------------------------------------------
class Unreadable(Exception):
    """The key could not be read from a batch (internal: never leaves this module)."""


_MISSING = object()


def _step(value: Any, part: str | int) -> Any:
    """One field of ``value``: a mapping's key, a sequence's position, or an attribute."""
    if type(value) is dict and type(part) is str and part in value:  # the common batch
        return value[part]
    if isinstance(value, Mapping):
        try:
            if part in value:
                return value[part]
        except TypeError:  # an unhashable part: not a key
            pass
        if isinstance(part, str) and part.lstrip("-").isdigit() and int(part) in value:
            return value[int(part)]
        return _MISSING
    if isinstance(value, tuple | list) and not hasattr(value, "_fields"):
        position = part if isinstance(part, int) else None
        if isinstance(part, str) and part.lstrip("-").isdigit():
            position = int(part)
        if position is not None and -len(value) <= position < len(value):
            return value[position]
        return _MISSING
    if isinstance(part, int):
        if hasattr(value, "_fields") and -len(value) <= part < len(value):  # a namedtuple
            return value[part]
        return _MISSING
    return getattr(value, part, _MISSING)


def field(batch: Any, key: Any) -> Any:
    """The value of the key in ``batch`` (the callable's answer), or :data:`_MISSING`."""
    if callable(key) and not isinstance(key, str | int):
        return key(batch)
    value = _step(batch, key)
    if value is _MISSING and isinstance(key, str) and "." in key:
        value = batch
        for part in key.split("."):
            value = _step(value, part)
            if value is _MISSING:
                break
    return value


def read(batch: Any, key: Any) -> Any:
    """The ids of ``batch`` under ``key`` (a numpy array, its own copy: int64 for int ids, not
    hashed yet; uint64 for ids already hashed, see :func:`hashed`), or None when they cannot be
    read (a missing field, a key that raises, values that are not ids). Never raises."""
    try:
        return hashes(field(batch, key))
    except Exception:
        return None


def _splitmix(values: Any) -> Any:
    """splitmix64 of uint64 values (numpy wraps the products)."""
    import numpy as np

    with np.errstate(over="ignore"):
        x = values.astype(np.uint64) + np.uint64(_GAMMA)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
        return x ^ (x >> np.uint64(31))


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def hash_int(value: int) -> int:
    """The 64-bit hash of one int id (splitmix64; beyond 64 bits, blake2b of its digits)."""
    import numpy as np

    if -(1 << 63) <= value < (1 << 64):
        return int(_splitmix(np.array([value & _MASK], dtype=np.uint64))[0])
    return _digest(str(value).encode())


def hashed(ids: Any) -> Any:
    """:func:`read`'s ids as 64-bit hashes (uint64): int ids (int64) mixed by splitmix64."""
    import numpy as np

    if ids.dtype == np.uint64:
        return ids
    return _splitmix(ids.view(np.uint64))


def _array_ids(value: Any) -> Any:
    """A tensor or array of integers: its ids, flattened, copied (None: not integers)."""
    import numpy as np

    if type(value).__module__.split(".")[0] == "torch":
        if value.device.type != "cpu":
            value = value.cpu()
        if value.requires_grad:
            value = value.detach()
        value = value.numpy()  # a dtype numpy lacks (bfloat16) raises: unreadable
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        return None
    return array.reshape(-1).astype(np.int64)  # a copy: the batch may be reused in place


def hashes(value: Any, depth: int = 0) -> Any:
    """The ids in ``value`` (see :func:`read`), or None when they are not ids."""
    import numpy as np

    if value is _MISSING or value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return np.array([value], dtype=np.int64)
        return np.array([hash_int(value)], dtype=np.uint64)
    if isinstance(value, str):
        return np.array([_digest(value.encode("utf-8", "surrogatepass"))], dtype=np.uint64)
    if isinstance(value, bytes | bytearray | memoryview):
        return np.array([_digest(bytes(value))], dtype=np.uint64)
    if type(value).__module__.split(".")[0] in ("torch", "numpy") and hasattr(value, "dtype"):
        return _array_ids(value)
    if isinstance(value, list | tuple) and depth < _DEPTH:
        if all(type(v) is int and -(1 << 63) <= v < (1 << 63) for v in value):
            return np.array(value, dtype=np.int64)  # the common list of ints, at once
        parts = [hashes(v, depth + 1) for v in value]
        if any(p is None for p in parts):
            return None
        if all(p.dtype == np.int64 for p in parts):
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return np.concatenate([hashed(p) for p in parts])
    return None


# -- what one rank took in one epoch --------------------------------------------------------------
class Taken:
    """The hashed ids one rank took in one epoch: every one up to :data:`CAP` distinct, then
    those under a threshold that halves until at most ``CAP`` remain (coordinated: the same
    hash is kept on every rank at the same threshold)."""

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.threshold = FULL
        self.blocks: list[Any] = []
        self.pending = 0  # hashes in blocks since the last compaction
        self.taken = 0  # ids taken (with repeats)
        self.batches = 0
        self.known = True

    def add(self, ids: Any) -> None:
        """One batch's ids (:func:`read`): kept as they are, hashed in bulk when compacted."""
        self.taken += int(ids.size)
        self.batches += 1
        self.blocks.append(ids)
        self.pending += int(ids.size)
        if self.pending > 2 * self.cap:
            self._compact()

    def _compact(self) -> None:
        import numpy as np

        raw = [b for b in self.blocks if b.dtype == np.int64]
        done = [b for b in self.blocks if b.dtype != np.int64]
        if raw:
            done.append(hashed(np.concatenate(raw)))
        kept = np.unique(np.concatenate(done)) if done else np.zeros(0, np.uint64)
        if self.threshold < FULL:
            kept = kept[kept < np.uint64(self.threshold)]
        while kept.size > self.cap:
            self.threshold //= 2
            kept = kept[kept < np.uint64(self.threshold)]
        self.blocks, self.pending = [kept], int(kept.size)

    def kept(self) -> Any:
        """The sorted distinct kept hashes (uint64)."""
        self._compact()
        return self.blocks[0]

    def summary(self) -> dict[str, Any]:
        """What is published for the cross-rank comparison."""
        if not self.known:
            return {"keyed": True, "known": False}
        return {
            "keyed": True,
            "known": True,
            "threshold": str(self.threshold),
            "hashes": pack(self.kept()),
            "taken": self.taken,
            "batches": self.batches,
        }


def pack(sorted_hashes: Any) -> str:
    """Sorted uint64 hashes, delta-coded and compressed (text, for the store)."""
    import numpy as np

    from rngaudit.capture import sketch

    with np.errstate(over="ignore"):
        deltas = np.diff(sorted_hashes, prepend=np.uint64(0)).astype(np.uint64)
    return sketch.pack_ints(deltas.view(np.int64))


def unpack(text: Any) -> Any:
    import numpy as np

    from rngaudit.capture import sketch

    deltas = sketch.unpack_ints(text).view(np.uint64)
    with np.errstate(over="ignore"):
        return np.cumsum(deltas, dtype=np.uint64)


# -- the comparison -------------------------------------------------------------------------------
def overlap(summaries: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Across ranks (every one filtered to the strictest threshold): the ids more than one rank
    took, each rank's distinct ids, the union; scaled by the sampling rate where one was sampled,
    with the bound of each estimate. None when some rank's epoch is unknown."""
    import numpy as np

    from rngaudit.capture import sketch

    if not summaries or not all(s.get("known") for s in summaries.values()):
        return None
    threshold = min(int(s["threshold"]) for s in summaries.values())
    kept: dict[int, Any] = {}
    for rank, s in summaries.items():
        values = unpack(s["hashes"])
        kept[rank] = values[values < np.uint64(threshold)] if threshold < FULL else values
    together = np.concatenate(list(kept.values()))
    unique, ranks_per_id = np.unique(together, return_counts=True)
    p = threshold / float(FULL)

    def scaled(n: int) -> int:
        return n if p >= 1.0 else round(n / p)

    shared_kept = int((ranks_per_id > 1).sum())
    shared = scaled(shared_kept)
    return {
        "estimated": p < 1.0,
        "rate": p,
        "shared": shared,
        "shared_proven": shared_kept,
        "shared_bound": sketch.bound_at(shared, p) if p < 1.0 else 0.0,
        "union": scaled(int(unique.size)),
        "per_rank": {r: scaled(int(v.size)) for r, v in kept.items()},
        "taken": {r: int(s.get("taken", 0)) for r, s in summaries.items()},
        "identical": len({s["hashes"] for s in summaries.values()}) == 1 and p >= 1.0,
    }


def _count(n: int, seen: dict[str, Any], bound: float | None = None) -> str:
    if not seen["estimated"]:
        return f"{n:,}"
    spread = bound if bound is not None else _bound(n, seen["rate"])
    return f"about {n:,} (± {math.ceil(spread):,})"


def _bound(n: int, p: float) -> float:
    from rngaudit.capture import sketch

    return sketch.bound_at(n, p)


def verdict(
    summaries: dict[int, dict[str, Any]],
    loader: str,
    key: str,
    epoch: int,
    batch_size: int | None,
    data_parallel: bool,
    partial: list[int],
    first: bool = False,
) -> Finding | None:
    """The verdict on one keyed epoch from every rank's :meth:`Taken.summary`: an id taken by
    more than one rank, beyond one round of padding (``world x batch_size``: accelerate's
    ``IterableDatasetShard`` / ``even_batches`` repeat at most one round), is an error; ranks
    that took identical ids with no data-parallel module training (a tensor-parallel group, a
    replicated evaluation) a warning. A rank repeating ids within its own share is no finding.
    ``partial``: the ranks whose share was published when they left the epoch early;
    ``first``: the summaries are the ranks' first batches (no padding allowed: any shared id
    is duplication), compared before the first training step."""
    seen = overlap(summaries)
    if seen is None:
        return None
    world = len(summaries)
    taken = rule.Taken(seen, world, "prefix" if first else "epoch", by_key=True)
    key_round = 0 if first else world * max(1, batch_size or 1)
    decided = rule.decide(taken, rule.Facts(key_round=key_round, data_parallel=data_parallel))
    if decided is None:
        return None
    severity = decided.severity
    took = ", ".join(
        f"rank {r} took {_count(n, seen)}" for r, n in sorted(seen["per_rank"].items())
    )
    where = f"epoch {epoch} of {loader}"
    if first:
        where = f"the first batches of epoch {epoch} of {loader}"
    lines = [
        f"In {where}: {_count(seen['shared'], seen, seen['shared_bound'])} samples (by key "
        f"{key}) went to more than one rank; {took}, {_count(seen['union'], seen)} distinct in "
        "all. The ranks' shares of the stream overlap: this epoch trained those samples more "
        "than once (observed from the ids in the batches each rank's loader returned)."
    ]
    if seen["estimated"]:
        lines.append(
            f"The counts are estimates from a hash sample of {seen['rate']:.3g} of the ids; "
            f"{seen['shared_proven']:,} sampled ids were proven taken by more than one rank."
        )
    if first:
        lines.append(
            "Compared before the first training step of the epoch, at the data-parallel "
            "module's first training forward on it: the rest of the epoch is not known yet."
        )
    if partial:
        who = ", ".join(str(r) for r in partial)
        lines.append(f"Rank(s) {who} left the epoch early: their share so far was compared.")
    if severity == "warning":
        lines.append(
            "Every rank took the same ids and no data-parallel module (DistributedDataParallel "
            "/ FSDP) was found: a tensor-parallel group or a replicated evaluation is by design."
        )
    return Finding(
        kind=fk.PARTITION_OVERLAP,
        severity=severity,
        message="\n".join(lines),
        ranks=sorted(summaries),
        remedy=REMEDY,
        details={
            "loader": loader,
            "epoch": epoch,
            "check": "keyed-partition",
            "key": key,
            "shared": seen["shared"],
            "union": seen["union"],
            "estimated": seen["estimated"],
            "per_rank": {str(r): n for r, n in seen["per_rank"].items()},
            "taken": {str(r): n for r, n in seen["taken"].items()},
        },
    )
