"""Ray Train ``TorchTrainer`` on 2 CPU workers (gloo), ``prepare_data_loader``: ``SPLIT``.

SPLIT ``same``: every worker splits the data with ``random_split(generator=seed 0)``
(correct); ``rank``: each worker seeds the split with its rank (each trains on its own subset).
``RNGAUDIT`` reaches the workers through ``runtime_env`` (Ray's workers do not inherit the
driver's environment).
"""

from __future__ import annotations

import os
import sys

import ray
import torch
from ray import train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader
from torch.utils.data import DataLoader, TensorDataset, random_split

HERE = os.path.dirname(os.path.abspath(__file__))
N = 32
SPLIT = sys.argv[1]


def train_loop(config: dict[str, str]) -> None:
    sys.path.insert(0, HERE)
    from truth import log_indices

    rank = train.get_context().get_world_rank()
    torch.manual_seed(100)
    seed = rank if config["split"] == "rank" else 0
    data, _ = random_split(TensorDataset(torch.arange(2 * N)), [N, N],
                           generator=torch.Generator().manual_seed(seed))  # fmt: skip
    loader = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True))
    log_indices(rank, [i for b in loader for i in b[0].tolist()])


if __name__ == "__main__":
    keep = ("RNGAUDIT", "RNGAUDIT_REPORT_DIR", "RNGAUDIT_TIMEOUT", "TRUTH_DIR", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env})
    trainer = TorchTrainer(
        train_loop, train_loop_config={"split": SPLIT},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    )  # fmt: skip
    trainer.fit()
    print("finished")
