"""Read ahead without a draw: the epoch a suspended index iterator holds.

A sampler that builds its epoch as a list and hands it out (``yield from perm.tolist()``, torch's
``RandomSampler``; ``iter(list)``; ``iter(range(n))``; ``yield from tensor``, a tuple iterator)
holds the whole epoch in a builtin iterator once its first index batch was drawn. That
iterator's ``__reduce__`` hands the sequence over without advancing it; it is the epoch only
when its consumed prefix is exactly the first index batch and its length is the sampler's.
Everything here is total: an unknown shape answers None.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from rngaudit import peek

MAX_TENSOR_ITEMS = 1 << 16  # 0-d tensors converted one by one (a tensor's tuple iterator)
_BUILTIN: tuple[type, ...] = (type(iter([])), type(iter(())), type(iter(range(0))))


def delegate(it: Any) -> Any:
    """The builtin sequence iterator ``it`` is, or the one a suspended generator delegates to."""
    if type(it) in _BUILTIN:
        return it
    if isinstance(it, types.GeneratorType):
        inner = it.gi_yieldfrom
        return inner if type(inner) in _BUILTIN else None
    return None


def sequence(it: Any) -> tuple[Any, int] | None:
    """What a builtin sequence iterator walks and how far it went (no ``next``)."""
    reduced = it.__reduce__()
    if len(reduced) != 3 or not reduced[1]:
        return None  # exhausted: (iter, ([],))
    seq, index = reduced[1][0], reduced[2]
    if not isinstance(seq, list | tuple | range) or not isinstance(index, int):
        return None
    return seq, index


_SPACED = 64  # entries of a list checked to be integers before numpy converts it


def ints(seq: Any) -> Any:
    """``seq`` as a 1-d int64 array when every entry is an integer index, else None."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if isinstance(seq, range):
        return np.arange(seq.start, seq.stop, seq.step, dtype=np.int64)
    torch = sys.modules.get("torch")
    if seq and torch is not None and isinstance(seq[0], torch.Tensor):
        if len(seq) > MAX_TENSOR_ITEMS:
            return None
        out = []
        for v in seq:
            if type(v) is not torch.Tensor or v.dim() != 0 or v.is_floating_point():
                return None
            out.append(int(v))
        return np.asarray(out, dtype=np.int64)
    if not isinstance(seq, list | tuple) or not _spaced_ints(seq, np):
        return None  # numpy would probe each entry (``__array__``, ``__len__``): user code
    arr = np.asarray(seq)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        return None
    return arr.astype(np.int64, copy=False)


def _spaced_ints(seq: Any, np: Any) -> bool:
    """Whether ``_SPACED`` evenly spaced entries of ``seq`` (the first and last among them) are
    plain integers: the epoch lists samplers return hold one type throughout."""
    n = len(seq)
    if n == 0:
        return True
    step = max(1, n // _SPACED)
    picks = [*range(0, n, step), n - 1]
    return all(type(seq[i]) is int or isinstance(seq[i], np.integer) for i in picks)


def epoch_indices(source: Any, first: Any, index_sampler: Any) -> Any:
    """Every index the epoch will hand out (the loader's index space, in order), read from the
    epoch's index iterator ``source`` just after its first index batch ``first`` was drawn:
    the sequence the sampler's iterator walks (found as ``source`` itself, the generator it
    delegates to, or ``BatchSampler.__iter__``'s ``sampler_iter``), checked against ``first``
    and against the sampler's and batch sampler's lengths; None when anything differs or
    cannot be read (a sampler that draws lazily, a batch sampler of another kind)."""
    try:
        batched = isinstance(first, list)
        inner = source
        sampler = index_sampler
        if batched:
            frame = source.gi_frame if isinstance(source, types.GeneratorType) else None
            inner = frame.f_locals.get("sampler_iter") if frame is not None else None
            sampler = peek.attr(index_sampler, "sampler")
        it = delegate(inner)
        found = sequence(it) if it is not None else None
        if found is None:
            return None
        seq, index = found
        if peek.size(sampler) != len(seq):
            return None
        head = list(first) if batched else [first]
        if index != len(head) or ints(seq[:index]) is None:
            return None
        if [int(v) for v in ints(seq[:index]).tolist()] != [int(v) for v in head]:
            return None
        values = ints(seq)
        if values is None:
            return None
        if batched:
            size = peek.attr(index_sampler, "batch_size")
            drop = peek.flag(peek.attr(index_sampler, "drop_last"))
            if not isinstance(size, int) or size <= 0 or drop is None or len(head) != size:
                return None
            batches = len(values) // size if drop else -(-len(values) // size)
            if peek.size(index_sampler) != batches:
                return None
            values = values[: batches * size]
        return values
    except Exception:  # an iterator of another shape: unknown, never an error
        return None
