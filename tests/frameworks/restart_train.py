"""``torchrun --max-restarts=1``, 2 ranks, plain torch.distributed: ``SNAPSHOTS``.

Attempt 0 trains epoch 0 (a ``DistributedSampler``, seed 0, shuffled), each rank writes its own
snapshot (the epoch to resume at) to ``$SNAP_DIR``, then rank 1 fails: torchrun restarts both.
Attempt 1 resumes each rank from its snapshot (``set_epoch``) and trains that epoch.
SNAPSHOTS ``same``: both snapshots say epoch 1 (correct); ``skew``: rank 0's says epoch 2 (it
snapshotted one epoch later), so the ranks resume at different epochs and shard two different
permutations. Each rank logs what it trains on in the resumed epoch (``truth.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32


def main() -> None:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(100)
    data = TensorDataset(torch.arange(N))
    sampler: DistributedSampler[int] = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    snapshot = Path(os.environ["SNAP_DIR"]) / f"rank-{rank}.json"
    if attempt == 0:
        sampler.set_epoch(0)
        for _ in loader:
            pass
        resume_at = 2 if sys.argv[1] == "skew" and rank == 0 else 1
        snapshot.write_text(json.dumps({"epoch": resume_at}))
        dist.barrier()  # both snapshots are on disk
        if rank == 1:
            print("rank 1 fails", flush=True)
            os._exit(1)
        dist.barrier()  # rank 0 waits here until torchrun stops it
    epoch = int(json.loads(snapshot.read_text())["epoch"])
    sampler.set_epoch(epoch)
    log_indices(rank, [i for (b,) in loader for i in b.tolist()])
    dist.barrier()
    dist.destroy_process_group()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
