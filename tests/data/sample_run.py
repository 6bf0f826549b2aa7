"""The 2-rank run the sample reports come from (torchrun it; tests/data/make_samples.py does)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import InitProcessGroupKwargs, set_seed
from torch.utils.data import DataLoader, TensorDataset

import rngaudit

ITEMS, BATCH, WORKERS = 16, 2, 2
TIMEOUT_S = 60.0  # seconds a rank waits for the other at the exchange


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("case", choices=["divergent", "clean"])
    parser.add_argument("report_dir")
    args = parser.parse_args()
    acc = Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True),
        kwargs_handlers=[
            InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=60))
        ],
    )
    set_seed(42)  # every rank alike
    with rngaudit.audit(mode="warn", report_dir=args.report_dir, timeout=TIMEOUT_S):
        if args.case == "divergent" and acc.process_index == 0:
            torch.rand(1)  # one extra draw on rank 0 only (a rank-0-only evaluation, say)
        train_loader = DataLoader(
            TensorDataset(torch.arange(ITEMS)),
            batch_size=BATCH,
            shuffle=True,
            num_workers=WORKERS,
        )
        loader = acc.prepare(train_loader)
    for _ in loader:  # epoch 0: the first batch is checked too
        pass
    rngaudit.wait_for_reports()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch 2.13 + gloo may abort while the interpreter shuts down


if __name__ == "__main__":
    main()
