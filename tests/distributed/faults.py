"""A rank that dies for real during an audit (launched without torchrun, as srun or mpirun do:
rank 0 hosts the store). The test kills it when the file ``ready`` appears.

store-host-killed: rank 0 is SIGKILLed in its block while rank 1 waits in the exchange.
sigterm-exchange:  rank 1 is SIGTERMed (a handler that exits) while it waits in the exchange.
sigterm-block:     rank 1 is SIGTERMed inside its block.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from typing import Any

import torch.distributed as dist

import rngaudit

out, scenario = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # as schedulers expect
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
result: dict[str, Any] = {"rank": rank}


def touch(name: str) -> None:
    with open(os.path.join(out, name), "w"):
        pass


def wait_for(name: str) -> None:
    while not os.path.exists(os.path.join(out, name)):  # an event from the test, no fixed wait
        time.sleep(0.01)


def others_waiting() -> None:
    while int(store.add("rngaudit/waiting", 0)) < 1:  # the other rank is in the exchange
        time.sleep(0.01)


start = cpu = 0.0
audit = rngaudit.audit(report_dir=os.path.join(out, "report"), timeout=float(sys.argv[3]))
try:
    with audit:
        if scenario == "store-host-killed" and rank == 0:
            others_waiting()
            touch("ready")
            time.sleep(3600)  # killed here
        if scenario == "sigterm-exchange" and rank == 0:
            others_waiting()
            touch("ready")
            wait_for("go")  # rank 1 was terminated in the exchange
        if scenario == "sigterm-block":
            if rank == 1:
                touch("ready")
                time.sleep(3600)  # terminated here
            wait_for("go")
        start, cpu = time.monotonic(), sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    result["raised"] = None
except BaseException as exc:
    result.update(raised=type(exc).__name__, message=str(exc))
    result["missing"] = list(getattr(exc, "missing_ranks", []))
    if not isinstance(exc, Exception):
        raise
finally:
    result["elapsed"] = time.monotonic() - start
    result["cpu"] = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu
    report = audit.report
    result["findings"] = [(f.kind, f.message) for f in report.findings] if report else []
    with open(os.path.join(out, f"result-{rank}.json"), "w") as fh:
        json.dump(result, fh)
rngaudit.wait_for_reports()
os._exit(0)  # the store host is gone: no teardown of the process group
