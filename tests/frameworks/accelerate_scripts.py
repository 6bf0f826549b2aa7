"""Accelerate's own distributed test scripts, from the installed wheel, run as one program.

``test_distributed_data_loop.py``: its ``main()`` minus the four ``join_uneven_inputs`` tests
that need GPUs (on CPU the join is a no-op: ``test_can_join_uneven_inputs`` waits forever and
the ``even_batches`` overrides fail their asserts, audited or not), then ``test_script.py``'s
whole ``main()`` (it destroys the process group at its end). Each step prints ``passed:
<name>`` and notes it in ``$STEPS_DIR/rank-<rank>.txt``; the scripts' own assertions are the
truth (every sample once, the same items for the same seed, ...).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import accelerate.test_utils.scripts as scripts
from accelerate.utils.dataclasses import DistributedType
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate


def load(name: str) -> types.ModuleType:
    path = Path(scripts.__file__).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"acc_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def passed(name: str) -> None:
    """Note ``name`` passed on this rank: a line in ``$STEPS_DIR/rank-<rank>.txt`` if set."""
    print(f"passed: {name}", flush=True)
    where = os.environ.get("STEPS_DIR")
    if where:
        with open(Path(where) / f"rank-{os.environ.get('RANK', '0')}.txt", "a") as out:
            out.write(f"{name}\n")


def data_loop() -> None:
    """``test_distributed_data_loop.main()`` without the GPU-only join tests."""
    m = load("test_distributed_data_loop")
    accelerator = m.create_accelerator()
    import torch

    torch.manual_seed(accelerator.process_index)
    m.test_default_ensures_even_batch_sizes()
    m.test_can_disable_even_batches()
    original = accelerator.state.distributed_type
    accelerator.state.distributed_type = DistributedType.FSDP
    m.test_join_raises_warning_for_non_ddp_distributed(accelerator)
    accelerator.state.distributed_type = original
    m.test_pickle_accelerator()
    passed("data_loop even_batches and join")
    dataset = m.DummyDataset()
    size, workers = m.BATCH_SIZE, m.NUM_WORKERS
    m.test_data_loader(DataLoader(dataset, shuffle=False, batch_size=size, num_workers=workers),
                       accelerator)  # fmt: skip
    passed("data_loop shuffle=False")
    m.test_data_loader(DataLoader(dataset, shuffle=True, batch_size=size, num_workers=workers),
                       accelerator)  # fmt: skip
    passed("data_loop shuffle=True")
    sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
    m.test_data_loader(DataLoader(dataset, batch_sampler=sampler, num_workers=workers), accelerator)
    passed("data_loop batch_sampler")
    sampler = BatchSampler(RandomSampler(dataset), batch_size=size, drop_last=False)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None, collate_fn=default_collate,
                        num_workers=workers)  # fmt: skip
    m.test_data_loader(loader, accelerator)
    passed("data_loop sampler is a BatchSampler")
    m.test_stateful_dataloader(accelerator)
    passed("data_loop stateful_dataloader")
    m.test_stateful_dataloader_save_state(accelerator)
    passed("data_loop stateful_dataloader_save_state")


def script() -> None:
    """``test_script.main()``, whole."""
    load("test_script").main()
    passed("test_script main")


if __name__ == "__main__":
    for part in sys.argv[1:] or ["data_loop", "script"]:
        {"data_loop": data_loop, "script": script}[part]()
