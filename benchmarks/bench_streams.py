"""Dropout from one seed on every data-parallel rank, against a seed per rank: DDP, world 2.

The measurement behind "Streams that must differ" in docs/with-tensor-parallelism.md. One
torchrun launch (2 processes, gloo on CPU) trains, for each of ``--seeds`` seeds and each
way of seeding, a 16-256-1 network with ``Dropout(0.5)`` under DDP: 256 training samples of
a fixed regression task, shards of 16 a rank a step (disjoint), 300 SGD steps. ``same``:
``torch.manual_seed(seed)`` on every rank (accelerate's ``set_seed(seed)``, Lightning's
``seed_everything``); ``per_rank``: a seed per rank (``set_seed(seed, device_specific=True)``).
Rank 0 checks (all-gather) whether the generator states at the first step are identical
across the ranks, and prints one JSON object: each way's test MSE over the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def child(seeds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1234)  # the task: the same on every rank
    x = torch.randn(4096, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g)) + 0.3 * torch.randn(4096, 1, generator=g)
    train_x, train_y, test_x, test_y = x[:256], y[:256], x[2048:], y[2048:]

    def trial(seed: int, per_rank: bool) -> tuple[float, bool]:
        torch.manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Dropout(0.5),
            torch.nn.Linear(256, 1),
        )  # fmt: skip
        model = DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(seed + 1000 * (rank + 1) if per_rank else seed)  # dropout's stream
        identical = False
        for step in range(steps):
            if step == 0:
                state = torch.get_rng_state()
                states = [torch.zeros_like(state) for _ in range(world)]
                dist.all_gather(states, state)
                identical = all(torch.equal(states[0], s) for s in states)
            idx = torch.arange(step * 16, step * 16 + 16) % 128 + 128 * rank
            loss = torch.nn.functional.mse_loss(model(train_x[idx]), train_y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad()
        net.eval()
        with torch.no_grad():
            return torch.nn.functional.mse_loss(net(test_x), test_y).item(), identical

    out: dict[str, Any] = {}
    for way in ("same", "per_rank"):
        runs = [trial(s, way == "per_rank") for s in range(seeds)]
        mse = [m for m, _ in runs]
        out[way] = {
            "identical_states": all(i for _, i in runs),
            "test_mse_mean": statistics.mean(mse),
            "test_mse_sd": statistics.stdev(mse),
            "test_mse": [round(m, 4) for m in mse],
        }
    if rank == 0:
        print(json.dumps(out, indent=1))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.seeds, args.steps)
        return
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(HERE), "--child", "--seeds", str(args.seeds), "--steps", str(args.steps),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env={"OMP_NUM_THREADS": "1", **os.environ})


if __name__ == "__main__":
    main()
