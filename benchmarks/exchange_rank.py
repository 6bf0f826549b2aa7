"""One torchrun rank: draw at N call sites in an rngaudit.audit() window, time its exit."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import rngaudit
from rngaudit.ranks import exchange, rules, session

TIMED: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` so its cumulated seconds land in ``TIMED[name]`` (benchmark-side only)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMED[name] = TIMED.get(name, 0.0) + time.perf_counter() - start

    return wrapper


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sites", type=Path, required=True, help="generated draw module")
    parser.add_argument("--report-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3, help="audits per process")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    draws = load(args.sites)
    exchange.exchange = timed("exchange", exchange.exchange)
    rules.compare = timed("compare", rules.compare)
    session.Session.write = timed("write", session.Session.write)  # type: ignore[method-assign]

    rounds = []
    for i in range(args.rounds):
        torch.manual_seed(1234)
        TIMED.clear()
        report_dir = args.report_dir / str(i)  # one session per round: no file growth
        audit = rngaudit.audit(mode="report", report_dir=report_dir, timeout=60)
        audit.__enter__()
        draws.draw()
        dist.barrier()  # every rank leaves the window together: time the exit, not the skew
        start = time.perf_counter()
        audit.__exit__(None, None, None)
        exit_s = time.perf_counter() - start
        assert audit.report is not None
        rounds.append(
            {
                "exit_s": exit_s,
                **{f"{k}_s": v for k, v in TIMED.items()},
                "verdict": audit.report.verdict,
                "events": len(audit.report.ranks[rank]["events"]),
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "rounds": rounds}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
