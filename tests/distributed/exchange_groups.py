"""Three ranks with equal records: rank 0 fetches every record, the others one per group."""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import torch
import torch.distributed as dist

import rngaudit

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
random.seed(0)  # every global generator equal across ranks: equal records
np.random.seed(0)
with rngaudit.audit(report_dir=f"{out}/report", timeout=60) as a:
    torch.rand(1)
assert a.report is not None
result = {
    "rank": rank,
    "verdict": a.report.verdict,
    "ranks": [{"rank": r["rank"], "same_as": r.get("same_as")} for r in a.report.ranks],
}
with open(f"{out}/result-{rank}.json", "w") as fh:
    json.dump(result, fh)
dist.destroy_process_group()
