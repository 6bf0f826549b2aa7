"""Workers forked inside an audit window must not inherit its torch interception or patches.

(Each worker's first batch is observed by the worker-stream check's own bounded instrumentation,
undone when that batch is fetched: the later batches show what the workers inherited.)"""

from __future__ import annotations

import json
import random
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import rngaudit
from rngaudit.capture.instrument.torch_ops import intercepting


class Probe(Dataset[torch.Tensor]):
    def __init__(self, original_random: object) -> None:
        self.original_random = original_random

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        clean = not intercepting() and random.random is self.original_random
        return torch.tensor([float(clean)])


if __name__ == "__main__":
    loader = DataLoader(
        Probe(random.random), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    with rngaudit.audit(report_dir=sys.argv[1], mode="report"):
        it = iter(loader)  # workers fork inside the window
    values = [v for batch in it for v in batch.flatten().tolist()]
    print(json.dumps(values))
