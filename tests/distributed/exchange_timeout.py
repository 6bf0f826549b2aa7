"""Rank 1 never reaches the audit's exchange: rank 0 must time out and name it."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import rngaudit

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
result: dict[str, object] = {"rank": rank}
if rank == 0:
    start = time.monotonic()
    try:
        with rngaudit.audit(report_dir=f"{out}/report", timeout=1) as a:
            torch.rand(1)
        result["raised"] = None
    except rngaudit.RNGAuditTimeoutError as exc:
        result["raised"] = type(exc).__name__
        result["missing"] = list(exc.missing_ranks)
        result["message"] = str(exc)
        result["kinds"] = [f.kind for f in a.report.findings] if a.report else []
    result["elapsed"] = time.monotonic() - start
    with open(f"{out}/result-{rank}.json", "w") as fh:
        json.dump(result, fh)
else:
    # busy elsewhere, never audits: waits for rank 0's result (an event, not a fixed sleep)
    deadline = time.monotonic() + 120
    while not os.path.exists(f"{out}/result-0.json") and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(f"{out}/result-{rank}.json", "w") as fh:
        json.dump(result, fh)
dist.destroy_process_group()
