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
        "union": int((total > 0).sum()),
        "per_rank": {r: int(s["distinct"]) for r, s in summaries.items()},
        "repeats": repeats,  # within one rank: sampling with replacement (or padding)
        "identical": len({str(s.get("bitmap")) for s in summaries.values()}) == 1,
    }
