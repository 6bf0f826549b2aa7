"""prepare() of a stateful loader with workers plus a ~10M-parameter model init, audited or not."""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rngaudit

TMP_PREFIX = "rngaudit-bench-prepare-"  # removed at exit, with the generated files and reports

WIDTHS = (1024, 2048, 2048, 1024, 1024, 512)  # Linear stack: 9,968,128 parameters


def build_model() -> nn.Module:
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(WIDTHS):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="wall clock (default) or the main thread's CPU time (what the process itself "
        "spends, without the time it waits for a CPU that its forked workers or other "
        "processes hold)",
    )
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.manual_seed(0)
    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    dataset = TensorDataset(torch.randn(4096, 16), torch.randint(0, 10, (4096,)))
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))

    def body() -> Any:
        model = build_model()
        loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=args.workers)
        return acc.prepare(model, loader)

    def unaudited() -> dict[str, float]:
        t0 = clock()
        prepared = body()
        total = clock() - t0
        del prepared
        return {"total": total}

    def audited() -> dict[str, float]:
        audit = rngaudit.audit(mode="report", report_dir=tempfile.mkdtemp(dir=tmp))
        t0 = clock()
        audit.__enter__()
        t1 = clock()
        try:
            prepared = body()
        finally:
            t2 = clock()
            audit.__exit__(None, None, None)
        t3 = clock()
        del prepared
        return {"total": t3 - t0, "enter": t1 - t0, "body": t2 - t1, "exit": t3 - t2}

    def timed(fn: Any) -> dict[str, float]:
        gc.collect()
        result: dict[str, float] = fn()
        acc.free_memory()  # drops the prepared loader: its prefetch workers shut down, untimed
        gc.collect()
        return result

    params = sum(p.numel() for p in build_model().parameters())
    timed(unaudited), timed(audited)  # warm-up
    plain: list[float] = []
    again: list[float] = []  # a second unaudited run per pair: the A/A noise
    audit_runs: list[dict[str, float]] = []
    for pair in range(args.pairs):
        if pair % 2 == 0:
            plain.append(timed(unaudited)["total"])
            audit_runs.append(timed(audited))
            again.append(timed(unaudited)["total"])
        else:
            again.append(timed(unaudited)["total"])
            audit_runs.append(timed(audited))
            plain.append(timed(unaudited)["total"])
    ratios = [a["total"] / p for a, p in zip(audit_runs, plain, strict=True)]
    aa = [b / p for b, p in zip(again, plain, strict=True)]
    benchlib.emit(
        {
            "params": params,
            "workers": args.workers,
            "pairs": args.pairs,
            "clock": args.clock,
            "unaudited_s": benchlib.median(plain),
            "audited_s": benchlib.median([a["total"] for a in audit_runs]),
            "ratio": benchlib.median(ratios),
            "ratio_range": benchlib.spread(ratios),
            "aa_ratio": benchlib.median(aa),
            "aa_range": benchlib.spread(aa),
            "enter_ms": benchlib.median([a["enter"] for a in audit_runs]) * 1e3,
            "body_s": benchlib.median([a["body"] for a in audit_runs]),
            "exit_ms": benchlib.median([a["exit"] for a in audit_runs]) * 1e3,
        }
    )


if __name__ == "__main__":
    benchlib.main_cleaning_up(main, TMP_PREFIX)
