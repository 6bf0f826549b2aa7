"""Rank 1 raises inside the audited block: its error propagates unchanged, nobody waits."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

import rngaudit

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
result: dict[str, object] = {"rank": rank}
start = time.monotonic()
try:
    with rngaudit.audit(report_dir=f"{out}/report", timeout=60, mode="report") as a:
        torch.rand(1)
        if rank == 1:
            raise ValueError("user code failed on rank 1")
    result["raised"] = None
except ValueError as exc:
    result["raised"] = f"{type(exc).__name__}: {exc}"
result["elapsed"] = time.monotonic() - start
result["report"] = a.report is not None
with open(f"{out}/result-{rank}.json", "w") as fh:
    json.dump(result, fh)
dist.destroy_process_group()
