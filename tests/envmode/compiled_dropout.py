"""A torch.compile'd model with dropout, called inside an audit window and after it.

``compiled_dropout.py REPORT_DIR BACKEND...``: for each backend, one run without rngaudit, then
one audited (report in ``REPORT_DIR/BACKEND``), each from a reset dynamo and ``manual_seed(0)``
as in a fresh process. Prints one JSON object: ``"BACKEND plain|audited"`` -> four lines.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch._dynamo.utils

import rngaudit


def run(backend: str, report_dir: str | None) -> list[str]:
    torch._dynamo.reset()  # no graph, guard or counter left from an earlier run
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5))
    compiled = torch.compile(model, backend=backend)
    x = torch.ones(8, 16)
    if report_dir is not None:
        with rngaudit.audit(mode="report", report_dir=report_dir):
            inside = compiled(x)
    else:
        inside = compiled(x)
    after = compiled(x)
    lines = [
        f"{name} {hashlib.sha256(value.detach().numpy().tobytes()).hexdigest()}"
        for name, value in (("inside", inside), ("after", after))
    ]
    counters = torch._dynamo.utils.counters
    lines.append(f"graphs {counters['stats']['unique_graphs']} frames {dict(counters['frames'])}")
    lines.append(f"stack {torch._C._len_torch_dispatch_stack()}")
    return lines


report_root, backends = sys.argv[1], sys.argv[2:]
out: dict[str, list[str]] = {}
for backend in backends:
    out[f"{backend} plain"] = run(backend, None)
    out[f"{backend} audited"] = run(backend, f"{report_root}/{backend}")
print(json.dumps(out))
