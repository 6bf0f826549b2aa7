"""The prepare-prefetch repro with rngaudit.audit() around accelerator.prepare() (torchrun it)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

import rngaudit

N, BS = 96, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("seeding", choices=["seed", "noseed"], help="seed: manual_seed(1234) first")
    parser.add_argument("--mode", choices=["raise", "warn", "report"], default="raise")
    parser.add_argument("--report-dir", default="rngaudit-report")
    parser.add_argument("--timeout", type=float, default=60.0, help="fingerprint exchange timeout")
    return parser.parse_args(argv)


def print_findings(report: rngaudit.AuditReport, report_dir: str) -> None:
    infos = [f for f in report.findings if f.severity == "info"]
    print(f"rngaudit verdict: {report.verdict}", flush=True)
    for f in report.findings:
        if f.severity != "info":
            print(f"  [{f.severity}] {f.kind} (ranks {f.ranks}): {f.message}", flush=True)
    if infos:
        print(f"  ({len(infos)} info finding(s): python -m rngaudit report {report_dir})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seeding == "seed":
        torch.manual_seed(1234)  # identical on both ranks before prepare()

    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    raw = DataLoader(TensorDataset(torch.arange(N)), batch_size=BS, shuffle=True, num_workers=6)

    try:
        with rngaudit.audit(mode=args.mode, report_dir=args.report_dir, timeout=args.timeout) as a:
            loader = acc.prepare(raw)
    except rngaudit.RNGAuditError as exc:
        # Every rank raises together (the verdict is agreed at the exchange), so all exit here.
        if acc.is_main_process:
            print(f"\n{type(exc).__name__}: {exc}\n", file=sys.stderr, flush=True)
            print(f"report: {args.report_dir}", file=sys.stderr, flush=True)
        # Leave together: torchrun stops the others as soon as one rank exits non-zero.
        with contextlib.suppress(Exception):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
        dist.destroy_process_group()
        return 1

    report = getattr(a, "report", None)
    if acc.is_main_process and report is not None:
        print_findings(report, args.report_dir)

    # Iterate epoch 0 and show what the ranks really got.
    flat = [i for b in loader for i in b[0].tolist()]
    gathered: list[list[int] | None] = [None] * acc.num_processes
    dist.all_gather_object(gathered, flat)
    acc.wait_for_everyone()
    if acc.is_main_process:
        union = [i for rank_items in gathered for i in (rank_items or [])]
        union_set = set(union)
        missing = len(set(range(N)) - union_set)
        duplicates = len(union) - len(union_set)
        print(
            f"mode={args.seeding}: epoch-0 union={len(union_set)}/{N}, "
            f"missing={missing}, duplicates={duplicates}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
