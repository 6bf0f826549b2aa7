"""What a rank actually took in an epoch: the root sample indices of the index batches it drew.

The main process draws every index batch of a map-style loader (``_next_index``, also with
workers), so what a rank is handed is observed whatever sampler, batch sampler or shard made it.
Indices are mapped to the root dataset through ``Subset``-like ``indices`` and wrapper
``dataset`` attributes and summarised as a bitmap of the samples taken (exact, for datasets up
to ``MAX_ROOT`` samples; above, a fixed-size hash sample of them, :mod:`~rngaudit.capture.sketch`)
and how many were taken (repeats within the rank: taken - distinct).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import struct
import sys
import weakref
from typing import Any

from rngaudit import peek
from rngaudit.capture import rank_record, sketch
from rngaudit.capture.fingerprint import digest_bytes

MAX_ROOT = 1 << 21  # root samples compared exactly (a 256 KiB bitmap per rank and epoch)
MAX_SKETCH_ROOT = 1 << 40  # root samples observed at all (above MAX_ROOT: by a sketch)
FOLD = 256  # index batches kept before they are folded into the bitmap
_MAX_DEPTH = 8


def _levels(dataset: Any, nodes: list[Any] | None = None) -> tuple[list[Any], int] | None:
    """The ``indices`` objects from the loader's index space to the root dataset's, outermost
    first, and the root's size, read without converting anything (``nodes`` gets the object
    holding each); None when a level cannot be read safely."""
    levels: list[Any] = []
    node = dataset
    for _ in range(_MAX_DEPTH):
        inner = peek.attr(node, "dataset")
        indices = peek.attr(node, "indices")
        if inner is None:
            break
        if indices is not None:
            if not isinstance(indices, list | tuple | range) and not _is_array(indices):
                return None
            levels.append(indices)
            if nodes is not None:
                nodes.append(node)
        node = inner
    size = peek.size(node)
    return None if size is None else (levels, size)


def root_of(dataset: Any) -> Any:
    """The dataset at the bottom of ``dataset``'s ``dataset`` attributes (itself when none)."""
    node = dataset
    for _ in range(_MAX_DEPTH):
        inner = peek.attr(node, "dataset")
        if inner is None:
            break
        node = inner
    return node


_IDENTITY_ATTRS = 32  # instance attributes of a root dataset read for its identity
_IDENTITY_ITEMS = 64  # entries of a list attribute, evenly spaced
_IDENTITY_VALUES = 4096  # values of an array attribute, evenly spaced
_IDENTITY_ARRAYS = 8  # arrays in a list attribute digested by value (a TensorDataset's tensors)


def root_identity(root: Any) -> str:
    """What tells one rank's root dataset from another's, read without ``__getitem__``: its
    class, size and its instance attributes (scalars and strings by value, lists by length
    and evenly spaced entries, arrays by shape, dtype and evenly spaced values, also in a short
    list such as a ``TensorDataset``'s ``tensors``, anything else by its class). Ranks reading
    their own files differ here (a path, the loaded data)."""
    import zlib

    parts = [type(root).__qualname__, str(peek.size(root))]
    try:
        names = sorted(k for k in vars(root) if isinstance(k, str))[:_IDENTITY_ATTRS]
    except Exception:  # no __dict__ (slots, a C type): its class and size only
        names = []
    for name in names:
        try:
            value = vars(root)[name]
            parts.append(f"{name}={_value_digest(value, zlib.crc32)}")
        except Exception:  # an attribute that cannot be read: its name only
            parts.append(f"{name}=?")
    return f"{zlib.crc32(repr(parts).encode()):08x}"


def _value_digest(value: Any, crc: Any) -> str:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        text = repr(value)
        return text if len(text) <= 64 else f"{crc(text.encode()):08x}"
    if isinstance(value, list | tuple):
        n = len(value)
        step = max(1, n // _IDENTITY_ITEMS)
        picked = [value[i] for i in range(0, n, step)][:_IDENTITY_ITEMS]
        scalars = [
            repr(v)
            if isinstance(v, bool | int | float | str | bytes)
            else _value_digest(v, crc)
            if _is_array(v) and n <= _IDENTITY_ARRAYS
            else type(v).__name__
            for v in picked
        ]
        return f"{type(value).__name__}[{n}]:{crc(repr(scalars).encode()):08x}"
    if _is_array(value):
        np = sys.modules["numpy"]
        flat = value.reshape(-1)
        step = max(1, int(flat.shape[0]) // _IDENTITY_VALUES)
        sample = flat[::step][:_IDENTITY_VALUES]
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(sample, torch.Tensor):
            sample = sample.detach().cpu().contiguous().numpy()
        data = np.ascontiguousarray(sample).tobytes()
        return f"{tuple(value.shape)}{value.dtype}:{crc(data):08x}"
    return type(value).__name__


def root_mapping(dataset: Any, limit: int = MAX_SKETCH_ROOT) -> tuple[list[Any], int] | None:
    """The index arrays from the loader's index space to the root dataset's, outermost first,
    and the root's size; None when a level cannot be read safely or the root holds more than
    ``limit`` samples (checked before any index list is converted). Over a root of more than
    ``MAX_ROOT`` samples (a sketch's), a long list is converted once and reused while it is
    the same list of the same length with the same entries at ``_SAMPLED`` evenly spaced
    places (read afresh each time: a reshuffle in place moves them)."""
    np = sys.modules.get("numpy")
    nodes: list[Any] = []
    found = _levels(dataset, nodes)
    if np is None or found is None or found[1] > limit:
        return None
    try:
        cache = found[1] > MAX_ROOT  # a sketch's roots; a bitmap's mapping is read exactly
        maps = [_converted(node, level, cache) for node, level in zip(nodes, found[0], strict=True)]
    except Exception:
        return None
    return maps, found[1]


_LONG = 1 << 16  # index lists longer than this are converted once (cached by their holder)
_SAMPLED = 4096
_CONVERTED: weakref.WeakKeyDictionary[Any, tuple[int, int, bytes, Any]] = (
    weakref.WeakKeyDictionary()
)


def _converted(node: Any, level: Any, cache: bool) -> Any:
    """``level`` (``node``'s ``indices``) as a flat int64 array (``cache``: a long list
    converted once, see :func:`root_mapping`)."""
    import numpy as np

    if not cache or not isinstance(level, list) or len(level) <= _LONG:
        return np.asarray(level, dtype=np.int64).reshape(-1)
    n = len(level)
    step = n / _SAMPLED
    probe = np.asarray([level[int(k * step)] for k in range(_SAMPLED)], dtype=np.int64).tobytes()
    cached = None
    with contextlib.suppress(TypeError):  # a holder not weakly referenceable: converted anew
        cached = _CONVERTED.get(node)
    if cached is not None and cached[:3] == (id(level), n, probe):
        return cached[3]
    array = np.asarray(level, dtype=np.int64).reshape(-1)
    with contextlib.suppress(TypeError):
        _CONVERTED[node] = (id(level), n, probe, array)
    return array


def levels(maps: list[Any]) -> list[list[Any]]:
    """Each level of a mapping to the root (:func:`root_mapping`), outermost first, as [its
    length, a digest of its indices]: what tells the ranks' datasets apart (a per-rank Subset,
    :func:`~rngaudit.ranks.overlap.cut_from`) with no sample read."""
    return [[int(arr.size), digest_bytes(arr.tobytes())] for arr in maps]


MAX_DATASET_ROOT = 1 << 17  # root samples of a dataset sent in a window's record (16 KiB)


def holds_split(dataset: Any) -> bool:
    """Whether ``dataset`` is a ``Subset``-like split or shard of a root dataset."""
    found = _levels(dataset)
    return found is not None and bool(found[0])


def dataset_samples(dataset: Any) -> dict[str, Any] | None:
    """The root samples a dataset holds, as a summary :func:`~rngaudit.ranks.overlap.measure`
    compares, when it holds a ``Subset``-like level (a per-rank split or shard of a root
    dataset up to ``MAX_DATASET_ROOT`` samples); None otherwise. Read without ``__getitem__``
    or a draw."""
    mapping = root_mapping(dataset, MAX_DATASET_ROOT)
    if mapping is None or not mapping[0]:
        return None
    maps, size = mapping
    try:
        tape = Tape(maps[1:], size)
        tape.add(maps[0].tolist())  # the outermost level's entries are indices of the next
        return dict(tape.summary(), levels=levels(maps))
    except Exception:
        return None


rank_record.read_samples_with(dataset_samples)  # each loader's record carries its samples


_SEQUENCES = frozenset({list, tuple, range})


def _flat_indices(batches: list[Any], np: Any) -> Any:
    """The index batches' entries as one int64 array, or None when a batch is not a list,
    tuple or range of integers, an integer, or a 1-d integer array or tensor (nothing else is
    iterated: a batch the fetcher consumed, a generator, is not read again). Python ints are
    packed by ``struct`` (about half of ``np.fromiter``'s cost an index); a float or an int
    outside int64 fails the packing: unknown."""
    flat: list[Any] = []
    extend, append = flat.extend, flat.append
    try:
        kinds = set(map(type, batches))
        if kinds <= _SEQUENCES:  # the usual batch: no check per batch
            for batch in batches:
                extend(batch)
            return np.frombuffer(struct.pack(f"{len(flat)}q", *flat), dtype=np.int64)
        if kinds == {int}:  # batching off
            return np.frombuffer(struct.pack(f"{len(batches)}q", *batches), dtype=np.int64)
        for batch in batches:
            kind = type(batch)
            if kind is list or kind is tuple or kind is range:
                extend(batch)
            elif kind is int or isinstance(batch, np.integer):
                append(batch)  # batching off: one index per draw
            elif _is_array(batch) and batch.ndim == 1 and _integer_dtype(batch):
                extend(batch.tolist())
            else:
                return None
        return np.frombuffer(struct.pack(f"{len(flat)}q", *flat), dtype=np.int64)
    except Exception:
        return None


def _integer_dtype(array: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return (
            not array.is_floating_point() and not array.is_complex() and array.dtype != torch.bool
        )
    return str(array.dtype.kind) in "iu"


def _is_array(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    return (np is not None and isinstance(obj, np.ndarray)) or (
        torch is not None and isinstance(obj, torch.Tensor)
    )


class Tape:
    """One rank's index batches of one epoch of one loader, folded into a bitmap of samples."""

    def __init__(self, maps: list[Any], root_size: int, context: object = None) -> None:
        import numpy as np

        self.maps = maps
        self.root_size = root_size
        # what the epoch checks observe here (epochs.registry.ShardedEpoch or ObservedEpoch)
        self.context = context
        # repeats: taken - distinct; above MAX_ROOT samples a sketch instead of a bitmap
        big = root_size > MAX_ROOT
        self.seen: Any = None if big else np.zeros(root_size, dtype=bool)
        self.sample = sketch.Sample(root_size) if big else None
        self.pending: list[Any] = []
        self.taken = 0
        self.batches = 0  # index batches drawn (counted when folded)
        self.known = True
        self.closed = False
        self.teed = False  # its batches come in segments (take), not one by one (add)
        self.left: Any = None  # an observed epoch's early.Left: read if the rank leaves it early

    @functools.cached_property
    def levels(self) -> list[list[Any]]:
        """Its index mapping's levels (:func:`levels`), computed once for the epoch (its first
        training step and its end both publish them)."""
        return levels(self.maps)

    def abandon(self) -> None:
        """Observe no more, compare nothing: another check already decided this epoch."""
        self.known = False
        self.closed = True
        self.pending = []

    def add(self, batch: Any) -> None:
        """An index batch (a list of ints, or one int when batching is off)."""
        if not self.known:
            return
        self.pending.append(batch)
        if len(self.pending) >= FOLD:
            self._fold()

    def take(self, batches: list[Any]) -> None:
        """A segment of index batches, folded now."""
        if self.known:
            self.pending.extend(batches)
            self._fold()

    def take_indices(self, indices: Any, batches: int) -> None:
        """A whole epoch at once: ``indices`` (a 1-d int64 array) in ``batches`` index batches."""
        if self.known:
            self._fold()
            self._mark(indices, batches)

    def _fold(self) -> None:
        import numpy as np

        batches, self.pending = self.pending, []
        if not batches:
            return
        idx = _flat_indices(batches, np)
        if idx is None:  # not integer indices of this dataset: unknown, never an error
            self.known = False
            return
        self._mark(idx, len(batches))

    def _mark(self, idx: Any, batches: int) -> None:
        import numpy as np

        self.batches += batches
        try:
            for arr in self.maps:
                idx = arr[idx]
            # one pass for both bounds: a negative index is above any size as uint64
            if idx.size and int(idx.view(np.uint64).max()) >= self.root_size:
                raise IndexError("index outside the root dataset")
            if self.sample is not None:
                self.sample.add(idx)
            else:
                self.seen[idx] = True
            self.taken += int(idx.size)
        except Exception:  # not integer indices of this dataset: unknown, never an error
            self.known = False

    def summary(self) -> dict[str, Any]:
        """What the rank took: its bitmap of root samples, how many it took, repeats within it."""
        import numpy as np

        self._fold()
        self.closed = True
        if not self.known:
            return {"known": False}
        if self.sample is not None:
            kept = self.sample.summary()
            return {
                "known": True,
                "root_size": self.root_size,
                "taken": self.taken,
                "batches": self.batches,
                "sketch": kept,
            }
        seen = self.seen
        return {
            "known": True,
            "root_size": self.root_size,
            "taken": self.taken,
            "batches": self.batches,
            "distinct": int(seen.sum()),
            "bitmap": base64.b64encode(np.packbits(seen).tobytes()).decode("ascii"),
        }
