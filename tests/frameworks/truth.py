"""Measured truth: each rank logs the sample indices it trains on in epoch 0."""

from __future__ import annotations

import json
import os
from pathlib import Path


def log_indices(rank: int, indices: list[int]) -> None:
    """Append ``indices`` to ``$TRUTH_DIR/rank-<rank>.json`` (one list per rank)."""
    path = Path(os.environ["TRUTH_DIR"]) / f"rank-{rank}.json"
    old = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(old + [int(i) for i in indices]))
