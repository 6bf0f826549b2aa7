"""Hugging Face Trainer under torchrun, 2 ranks on CPU, tiny model, no downloads.

Options: ``seed=rank`` (``seed=42 + rank``), ``data_seed=rank``, ``group_by_length``,
``eval_first`` (``evaluate()`` before ``train()``), ``callback`` (``RNGAuditCallback``).
"""

from __future__ import annotations

import os
import sys

import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N = 32
OPTS = set(sys.argv[1:])
RANK = int(os.environ["RANK"])


class Tiny(torch.nn.Module):
    """input_ids[:, 0] is the sample index; the model logs it in epoch 0."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.logging = False

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training and self.logging:
            log_indices(RANK, input_ids[:, 0].tolist())
        return {"loss": self.layer(input_ids[:, :1].float()).pow(2).mean()}


def collate(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    width = max(len(r["input_ids"]) for r in rows)
    ids = [r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows]
    return {"input_ids": torch.tensor(ids), "labels": torch.zeros(len(rows))}


def main() -> None:
    data = Dataset.from_dict(
        {"input_ids": [[i] * (1 + i % 5) for i in range(N)], "labels": [0.0] * N}
    )
    args = TrainingArguments(
        output_dir=os.environ["TRUTH_DIR"] + "/out", per_device_train_batch_size=4,
        num_train_epochs=1, report_to=[], save_strategy="no", use_cpu=True,
        seed=42 + RANK if "seed=rank" in OPTS else 42,
        data_seed=42 + RANK if "data_seed=rank" in OPTS else None,
        train_sampling_strategy="group_by_length" if "group_by_length" in OPTS else "random",
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    callbacks = []
    if "callback" in OPTS:
        from rngaudit.integrations.hf_trainer import RNGAuditCallback

        callbacks.append(RNGAuditCallback())
    model = Tiny()
    trainer = Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data, data_collator=collate,
        callbacks=callbacks,
    )  # fmt: skip
    if "eval_first" in OPTS:
        trainer.evaluate()
    model.logging = True
    trainer.train()
    torch.distributed.destroy_process_group()
    print("finished", flush=True)
    # torch 2.13 + gloo: after a Trainer run the interpreter's teardown sometimes hangs, also
    # unaudited (measured: 1 of 5 plain torchrun runs); the reports are written by now.
    os._exit(0)


if __name__ == "__main__":
    main()
