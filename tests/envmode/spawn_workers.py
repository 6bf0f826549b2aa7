"""Seeded DataLoader with spawned workers that draw in __getitem__: prints every value."""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        state_dir = os.environ.get("WORKER_STATE_DIR")
        if state_dir:  # what the audit looks like from inside the worker (read, not imported)
            controller = getattr(sys.modules.get("rngaudit.startup"), "CONTROLLER", None)
            state = {"armed": controller is not None, "detached": getattr(controller, "worker", 0)}
            with open(os.path.join(state_dir, f"worker-{os.getpid()}.json"), "w") as fh:
                json.dump(state, fh)
        return torch.rand(2)


if __name__ == "__main__":
    torch.manual_seed(7)
    loader = DataLoader(Noise(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    values = torch.cat([b for b in loader]).flatten().tolist()
    print(" ".join(f"{v:.8f}" for v in values))
