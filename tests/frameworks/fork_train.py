"""Ranks forked in-process, 2 ranks on CPU: ``LAUNCHER SEED``.

LAUNCHER ``notebook``: accelerate's ``notebook_launcher`` (what a notebook cell calls; outside
IPython it takes the same branch: ``elastic_launch`` with ``start_method="fork"`` on CPU), an
``Accelerator`` with the stateful loader (``num_workers=2``) prepared in the function;
``fork``: ``torch.multiprocessing.start_processes(..., start_method="fork")``, plain
``torch.distributed`` with a ``DistributedSampler``.
SEED ``same``: every rank seeds 100 (correct); ``rank``: the notebook ranks seed ``100 + rank``
(the stateful loader draws its order in ``prepare()`` before the RNG sync); the fork ranks build
``DistributedSampler(seed=rank)``.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from truth import log_indices

N, WORLD = 32, 2
LAUNCHER, SEED = sys.argv[1], sys.argv[2]


def notebook_function() -> None:
    from accelerate import Accelerator, DataLoaderConfiguration

    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    acc = Accelerator(cpu=True, dataloader_config=config)
    torch.manual_seed(100 + (acc.process_index if SEED == "rank" else 0))
    model = torch.nn.Linear(1, 1)
    data = DataLoader(TensorDataset(torch.arange(N)), batch_size=4, shuffle=True, num_workers=2)
    model, loader = acc.prepare(model, data)
    log_indices(acc.process_index, [i for b in loader for i in b[0].tolist()])
    print("finished", flush=True)


def fork_function(rank: int, port: int) -> None:
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)  # fmt: skip
    torch.manual_seed(100)
    data = TensorDataset(torch.arange(N))
    sampler: DistributedSampler[int] = DistributedSampler(data, seed=rank if SEED == "rank" else 0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    log_indices(rank, [i for b in loader for i in b[0].tolist()])
    dist.barrier()
    dist.destroy_process_group()
    print("finished", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    if LAUNCHER == "notebook":
        from accelerate import notebook_launcher

        notebook_launcher(notebook_function, num_processes=WORLD, use_port=str(free_port()))
    else:
        from torch.multiprocessing import start_processes  # type: ignore[attr-defined]

        start_processes(fork_function, args=(free_port(),), nprocs=WORLD, start_method="fork")  # type: ignore[no-untyped-call]
