"""The first DataLoader iteration happens on a thread other than the main one."""

from __future__ import annotations

import threading

import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)
loader: DataLoader[int] = DataLoader(list(range(8)), batch_size=4, shuffle=True)  # type: ignore[arg-type]
seen: dict[str, object] = {}


def iterate() -> None:
    seen["batches"] = [batch.tolist() for batch in loader]
    seen["thread stack"] = torch._C._len_torch_dispatch_stack()


thread = threading.Thread(target=iterate)
thread.start()
thread.join()
print(seen["batches"])
print("thread stack", seen["thread stack"], "main stack", torch._C._len_torch_dispatch_stack())
