"""Ranks in one process: a real world-1 gloo group, or ranks of a larger world on one real store.

The epoch checks read their rank from ``exchange.distributed()`` and their store from
``store.default()``: ``Ranks`` answers both (the rank it plays now, one real ``HashStore``
for all), so one process plays each rank in turn and the test writes nothing but what a rank
of the code under test writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol


class Ranks:
    """``world`` ranks on one real store; ``rank`` is the one playing now."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, world: int) -> None:
        self.store: Any = dist.HashStore()  # type: ignore[attr-defined]
        self.world = world
        self.rank = 0
        monkeypatch.setattr(exchange, "distributed", lambda: (self.rank, self.world))
        monkeypatch.setattr(protocol, "default", lambda: self.store)

    @contextlib.contextmanager
    def playing(self, rank: int) -> Iterator[None]:
        """Run as ``rank`` inside, as rank 0 again after."""
        self.rank = rank
        try:
            yield
        finally:
            self.rank = 0

    def has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def get(self, key: str) -> dict[str, Any]:
        return exchange.decode(bytes(self.store.get(key)))


@contextlib.contextmanager
def world_of_one(tmp_path: Path) -> Iterator[None]:
    """A real gloo process group of one rank (a FileStore under ``tmp_path``), destroyed after."""
    store = dist.FileStore(str(tmp_path / "gloo-store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
