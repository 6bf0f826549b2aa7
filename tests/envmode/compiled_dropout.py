"""A torch.compile'd model with dropout, called inside an audit window and after it."""

from __future__ import annotations

import hashlib
import sys

import torch
import torch._dynamo.utils

import rngaudit

backend, audited, report_dir = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5))
compiled = torch.compile(model, backend=backend)
x = torch.ones(8, 16)
if audited:
    with rngaudit.audit(mode="report", report_dir=report_dir):
        inside = compiled(x)
else:
    inside = compiled(x)
after = compiled(x)
for name, value in (("inside", inside), ("after", after)):
    print(name, hashlib.sha256(value.detach().numpy().tobytes()).hexdigest())
counters = torch._dynamo.utils.counters
print("graphs", counters["stats"]["unique_graphs"], "frames", dict(counters["frames"]))
print("stack", torch._C._len_torch_dispatch_stack())
