"""The replica-streams check's cost, once per optimizer, against one unaudited training step.

In one process (a world of 1, gloo on CPU): a DDP-wrapped ``nn.TransformerEncoder`` (``--layers``
layers of width 256, dropout 0.1 in each: 3 ``Dropout`` modules a layer) and its ``AdamW``. Times
(best of ``--repeats``) one unaudited training step (forward, backward, ``step``) of a batch of
16 sequences of 64 tokens, and what the check adds at the first optimizer step:
``replicas._stream_sources`` (the walk over the DDP module's submodules for stochastic ones in
training mode, and one read of the CPU generator's state; read only, never a draw). The check
rides on the weights check's existing exchange, so no wait is added. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any


def _best(func: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from rngaudit.ranks import data_parallel, replicas

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        init = f"file://{tmp}/store"
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
        model = DistributedDataParallel(nn.TransformerEncoder(layer, args.layers))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(16, 64, 256)

        def step() -> None:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

        step()  # warm-up
        step_s = _best(step, args.repeats)
        data_parallel.note_module(model)
        found: dict[Any, Any] = {}

        def check() -> None:
            found.update(replicas._stream_sources(opt))

        check_s = _best(check, args.repeats)
        dist.destroy_process_group()
    source = next(iter(found.values()), {})
    print(
        json.dumps(
            {
                "layers": args.layers,
                "parameters": sum(p.numel() for p in model.parameters()),
                "modules": sum(1 for _ in model.modules()),
                "stochastic_found": len(source.get("draws", [])),
                "step_s": round(step_s, 5),
                "check_s": round(check_s, 6),
                "check_over_step": round(check_s / step_s, 5),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
