"""Two ranks that break the exchange's protocol on purpose: ``exchange_protocol.py NAMES OUTDIR``.

The scenarios in NAMES (comma-separated) run in turn in one launch. For each, every rank writes
``OUTDIR/<name>/result-<rank>.json`` (what every audit said or raised); the audits' report goes
to ``OUTDIR/<name>/report``. Ranks wait for each other through files (``wait_for``), never for a
fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset, TensorDataset

import rngaudit
from rngaudit.ranks import store as protocol

names, root = sys.argv[1].split(","), Path(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
# The running scenario's directory, result and report directory (set before each one runs).
out = root
result: dict[str, Any] = {}
report_dir = root


def wait_for(name: str, limit: float = 120.0) -> None:
    """Wait until the other rank wrote ``out/name`` (an event, not a duration)."""
    deadline = time.monotonic() + limit
    while not (out / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: {name} never appeared")
        time.sleep(0.01)


def signal_file(name: str, text: str = "") -> None:
    tmp = out / f".{name}.{rank}"
    tmp.write_text(text)
    os.replace(tmp, out / name)


class Outcome:
    """What one audit said or raised, kept in ``result``; ``box.audit(...)`` opens it."""

    def __init__(self, name: str) -> None:
        self.entry: dict[str, Any] = {"name": name, "raised": None}
        self.opened: Any = None

    def audit(self, **kw: Any) -> Any:
        self.opened = rngaudit.audit(report_dir=report_dir, **kw)
        return self.opened


@contextmanager
def outcome(name: str) -> Iterator[Outcome]:
    box = Outcome(name)
    entry = box.entry
    start = time.monotonic()
    try:
        yield box
    except rngaudit.RNGAuditError as exc:
        entry["raised"] = type(exc).__name__
        entry["message"] = str(exc)
    except (ValueError, KeyboardInterrupt) as exc:
        entry["raised"] = f"{type(exc).__name__}: {exc}"
    entry["elapsed"] = time.monotonic() - start
    entry["caught_at"] = time.time()
    report = box.opened.report if box.opened is not None else None
    if report is not None:
        entry["verdict"] = report.verdict
        entry["kinds"] = sorted({f.kind for f in report.findings})
        entry["findings"] = [f.to_dict() for f in report.findings]
        entry["ranks_with_events"] = [r["rank"] for r in report.ranks if r.get("events")]
    result["audits"].append(entry)


def draws(n: int) -> Any:
    def body() -> None:
        for _ in range(n):
            torch.rand(1)

    return body


# Each audit opens on its own line: its call site is its identity across ranks.


def rank0_only() -> None:
    # Rank 0 audits an evaluation set-up the other rank never runs, then both audit B and C.
    if rank == 0:
        with outcome("A") as box, box.audit(mode="warn", timeout=20):  # rank 0 only
            torch.rand(1)
    with outcome("B") as box, box.audit(mode="warn", timeout=20):
        torch.rand(1)
    with outcome("C") as box, box.audit(mode="warn", timeout=20):
        draws(1 + rank)()  # rank 1 draws once more


def late_rank(late: int) -> None:
    if rank == late:
        wait_for("decided")  # arrive just after the other rank gave up on us
    with outcome("late" if rank == late else "on time") as box, box.audit(timeout=2):
        torch.rand(1)
    if rank != late:
        signal_file("decided")


def modes() -> None:
    torch.manual_seed(rank)  # the ranks' splits differ: an error finding
    with outcome("modes") as box, box.audit(mode="raise" if rank == 0 else "warn", timeout=60):
        split: Subset[Any] = Subset(
            TensorDataset(torch.arange(32)), torch.randperm(32)[:16].tolist()
        )
        DataLoader(split, batch_size=4)


def raised() -> None:
    with outcome("raised") as box, box.audit(timeout=60):
        torch.rand(1)
        if rank == 1:
            raise ValueError("user code failed on rank 1")
        torch.rand(1)


def sigint_block() -> None:
    with outcome("block") as box, box.audit(timeout=60):
        torch.rand(1)
        if rank == 0:
            signal_file("rank0-exchanging")
        else:
            wait_for("rank0-exchanging")
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C inside the block
            time.sleep(30)  # interrupted long before this ends


def sigint_wait() -> None:
    if rank == 0:
        signal_file("rank0-pid", str(os.getpid()))
    with outcome("wait") as box, box.audit(timeout=60):
        torch.rand(1)
        if rank == 1:  # Ctrl-C on rank 0 while it waits in the exchange; then arrive
            wait_for("rank0-pid")
            store = protocol.default()
            deadline = time.monotonic() + 120
            while not store.check([protocol.WAITING]) or int(store.add(protocol.WAITING, 0)) < 1:
                if time.monotonic() > deadline:
                    raise SystemExit("rank 0 never waited")
                time.sleep(0.01)  # rank 0 counts itself once inside the exchange
            result["signalled_at"] = time.time()
            os.kill(int((out / "rank0-pid").read_text()), signal.SIGINT)
            wait_for("rank0-interrupted")
    if rank == 0:
        signal_file("rank0-interrupted")


SCENARIOS: dict[str, Callable[[], None]] = {
    "rank0_only": rank0_only,
    "late_rank1": lambda: late_rank(1),
    "late_rank0": lambda: late_rank(0),
    "modes": modes,
    "raised": raised,
    "sigint_block": sigint_block,
    "sigint_wait": sigint_wait,
}
unknown = [name for name in names if name not in SCENARIOS]
if unknown:
    raise SystemExit(f"unknown scenario {unknown}")
for number, scenario in enumerate(names):
    if number:
        dist.barrier()  # every rank done with the previous scenario
    out = root / scenario
    out.mkdir(parents=True, exist_ok=True)
    report_dir = out / "report"
    result = {"rank": rank, "audits": []}
    torch.manual_seed(0)
    SCENARIOS[scenario]()
    (out / f"result-{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
