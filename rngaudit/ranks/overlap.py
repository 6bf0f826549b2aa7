"""The ranks' overlap: from each rank's summary of the root samples it took, which several took."""

from __future__ import annotations

import base64
from typing import Any

from rngaudit.capture import sketch


def measure(summaries: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Across ranks: how many root samples more than one rank took, and how many none did
    (of those any rank's dataset holds); None when a rank's epoch could not be observed."""
    import numpy as np

    if len(summaries) < 2 or not all(s.get("known") for s in summaries.values()):
        return None
    sizes = {int(s["root_size"]) for s in summaries.values()}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    if any("sketch" in s for s in summaries.values()):
        if not all("sketch" in s for s in summaries.values()):
            return None
        return sketch.overlap(summaries, size)
    total = np.zeros(size, dtype=np.int32)
    for s in summaries.values():
        bits = np.frombuffer(base64.b64decode(s["bitmap"]), dtype=np.uint8)
        total += np.unpackbits(bits)[:size].astype(np.int32)
    repeats = {r: int(s["taken"]) - int(s["distinct"]) for r, s in summaries.items()}
    return {
        "root_size": size,
        "shared": int((total > 1).sum()),  # taken by more than one rank
        "most": int(total.max()) if size else 0,  # the most ranks that took one sample
        "union": int((total > 0).sum()),
        "per_rank": {r: int(s["distinct"]) for r, s in summaries.items()},
        "repeats": repeats,  # within one rank: sampling with replacement (or padding)
        "identical": len({str(s.get("bitmap")) for s in summaries.values()}) == 1,
    }


def cut_from(summaries: dict[int, dict[str, Any]]) -> int | None:
    """Where every rank reads a dataset of its own (no two ranks read one outermost index
    mapping: per-rank Subsets) cut from one dataset of one root: that dataset's size (the
    level every rank's mapping shares, or the root); None otherwise (a rank's mapping unknown,
    none, or shared with another rank's). Compared from each summary's ``levels``
    (:func:`~rngaudit.epochs.partition.levels`)."""
    levels: list[list[Any]] = []
    for s in summaries.values():
        lv = s.get("levels")
        if not isinstance(lv, list) or not lv:
            return None
        levels.append(lv)
    if len(levels) < 2:
        return None
    if len({str(lv[0]) for lv in levels}) < len(levels):
        return None
    sizes = {s.get("root_size") for s in summaries.values()}
    size = sizes.pop() if len(sizes) == 1 else None
    if not isinstance(size, int):
        return None
    depth = min(len(lv) for lv in levels)
    for k in range(1, depth):  # the innermost levels every rank shares: the dataset they cut
        if len({str(lv[-k]) for lv in levels}) > 1:
            break
        size = int(levels[0][-k][0])
    return size
