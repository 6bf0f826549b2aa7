"""Lightning DDP on CPU, 2 ranks, tiny model: ``STRATEGY SEED [val] [callback]``.

SEED ``same``: ``seed_everything(42)`` (correct); ``rank``: ``seed_everything(42 + rank)``.
"""

from __future__ import annotations

import os
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32
STRATEGY, SEED = sys.argv[1], sys.argv[2]
VAL, CALLBACK = "val" in sys.argv[3:], "callback" in sys.argv[3:]


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.current_epoch == 0:
            log_indices(self.global_rank, batch[0].tolist())
        out: torch.Tensor = self.layer(batch[0].float().unsqueeze(1)).sum()
        return out

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.layer(batch[0].float().unsqueeze(1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning's children get LOCAL_RANK
    pl.seed_everything(42 if SEED == "same" else 42 + rank)
    data = TensorDataset(torch.arange(N))
    train = DataLoader(data, batch_size=4, shuffle=True)
    val = DataLoader(data, batch_size=8) if VAL else None
    callbacks = []
    if CALLBACK:
        from rngaudit.integrations.lightning import RNGAuditCallback

        callbacks.append(RNGAuditCallback())
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=STRATEGY, max_epochs=1, callbacks=callbacks,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=2 if VAL else 0,
    )  # fmt: skip
    trainer.fit(Tiny(), train, val)
    print("finished")


if __name__ == "__main__":
    main()
