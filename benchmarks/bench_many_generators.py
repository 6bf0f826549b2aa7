"""Many generators in one window: events, report size, peak and held memory, what stays alive."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import benchlib

CHILD = r"""
import gc, json, os, sys, time, tracemalloc
import numpy as np, torch
n, audited, report_dir = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
import rngaudit
from rngaudit.reports import files

def body():
    for i in range(n):
        np.random.default_rng(i)
        torch.rand(1, generator=torch.Generator().manual_seed(i))

def live():
    return sum(isinstance(o, (np.random.Generator, torch.Generator)) for o in gc.get_objects())

gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
start = time.perf_counter()
events = None
if audited:
    with rngaudit.audit(report_dir=report_dir, mode="report") as audit:
        body()
    files.flush()
    events = sum(len(r["events"]) for r in audit.report.ranks)
    del audit
else:
    body()
wall = time.perf_counter() - start
peak = tracemalloc.get_traced_memory()[1] - base
gc.collect()
held = tracemalloc.get_traced_memory()[0] - base
tracemalloc.stop()
files = {p: os.path.getsize(os.path.join(report_dir, p)) for p in os.listdir(report_dir)
         if p.endswith(".json")} if audited else {}
print(json.dumps({"wall_s": wall, "peak_mb": peak / 1e6, "held_mb": held / 1e6,
                  "live_generators": live(), "events": events, "files": files}))
"""


def measure(n: int, audited: bool, tmp: Path) -> dict[str, Any]:
    report_dir = tmp / f"report-{n}-{int(audited)}"
    cmd = [benchlib.PYTHON, "-c", CHILD, str(n), "1" if audited else "0", str(report_dir)]
    _, out = benchlib.run(cmd, benchlib.child_env())
    result: dict[str, Any] = benchlib.last_json(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--generators", type=int, nargs="+", default=[2000, 20000])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rngaudit-bench-many-"))
    try:
        results = {
            str(n): {"unaudited": measure(n, False, tmp), "audited": measure(n, True, tmp)}
            for n in args.generators
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    benchlib.emit({"many_generators": results})


if __name__ == "__main__":
    main()
