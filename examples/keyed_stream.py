"""An IterableDataset that shards itself, compared across ranks by the sample key it declares.

    torchrun --nproc_per_node=2 examples/keyed_stream.py bug   # per-rank seeds: an error
    torchrun --nproc_per_node=2 examples/keyed_stream.py fix   # one shared seed: clean

(or leave the ``sample_key`` line out and run ``RNGAUDIT=1 RNGAUDIT_SAMPLE_KEY=id torchrun ...``).
Each rank takes ``perm[rank::world]`` of a permutation drawn in ``__iter__``; seeded per rank
(the bug) the ranks' shares overlap, and at the epoch's end every rank raises
``partition-overlap`` with the counts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

import rngaudit


class SelfSharding(IterableDataset[dict[str, Any]]):
    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rank, world = dist.get_rank(), dist.get_world_size()
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed))
        for i in perm[rank::world].tolist():
            yield {"id": i, "x": torch.randn(4)}


def main() -> int:
    dist.init_process_group("gloo")
    bug = sys.argv[1:] == ["bug"]
    seed = 10 + dist.get_rank() if bug else 10  # the bug: a seed per rank
    with rngaudit.audit(mode="raise"):
        loader = rngaudit.sample_key(DataLoader(SelfSharding(96, seed), batch_size=8), "id")
    try:
        for batch in loader:
            dist.all_reduce(batch["x"].sum())  # a training step's collective
        print(f"rank {dist.get_rank()}: the ranks' shares partition the stream")
    except rngaudit.RNGDivergenceError as exc:
        print(f"rank {dist.get_rank()}: {str(exc).splitlines()[2]}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
