"""Torchrun-able RNG scenarios: audit the loader set-up, then measure the real epoch-0 partition.

One launch runs one scenario (results in OUTDIR) or several in turn (comma-separated names,
results in OUTDIR/<name>/). Each scenario starts from the RNG states the process had before the
first one ran, so it draws what it would draw in a launch of its own; set-ups that never touch
accelerate run first, while accelerate is not yet imported.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

# Hard per-process deadline: a hung rank dumps its stacks and exits instead of hanging the test.
WATCHDOG_S = float(os.environ.get("RNGAUDIT_SCENARIO_WATCHDOG_S", "300"))
AUDIT_TIMEOUT_S = 60.0
PG_TIMEOUT = datetime.timedelta(seconds=90)


Batches = Any  # what a set-up returns to iterate: a prepared loader or a live iterator


@dataclass(frozen=True)
class Scenario:
    name: str
    expect_corrupted: bool
    n_items: int
    batch_size: int
    num_workers: int
    setup: Callable[[Scenario, Path, bool], tuple[Any, Batches]]
    description: str
    accelerate: bool = True  # False: the set-up must run before accelerate is ever imported


# --------------------------------------------------------------------------- helpers


def _audit_ctx(report_dir: Path, use_audit: bool) -> Any:
    """The audit context (or a stand-in with no report when the audit is disabled)."""
    if not use_audit:
        return contextlib.nullcontext()
    import rngaudit

    return rngaudit.audit(mode="raise", report_dir=str(report_dir), timeout=AUDIT_TIMEOUT_S)


def _accelerator(*, stateful: bool, seedable: bool = False) -> Any:
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import InitProcessGroupKwargs

    config = DataLoaderConfiguration(
        use_stateful_dataloader=stateful, use_seedable_sampler=seedable
    )
    return Accelerator(
        cpu=True,
        dataloader_config=config,
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=PG_TIMEOUT)],
    )


def _dataset(sc: Scenario) -> TensorDataset:
    return TensorDataset(torch.arange(sc.n_items))


def _loader(sc: Scenario) -> DataLoader[Any]:
    return DataLoader(
        _dataset(sc), batch_size=sc.batch_size, shuffle=True, num_workers=sc.num_workers
    )


class _Outcome:
    """What happened inside one audited block, filled by ``_run_audited``."""

    def __init__(self) -> None:
        self.raised = False
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.report: dict[str, Any] | None = None
        self.audit_s = 0.0


def _run_audited(
    report_dir: Path, use_audit: bool, body: Callable[[], Any]
) -> tuple[Any, _Outcome]:
    """Run ``body`` inside the audit; record a raised RNGAuditError instead of propagating it."""
    out = _Outcome()
    result: Any = None
    a: Any = None
    ctx = _audit_ctx(report_dir, use_audit)
    t0 = time.perf_counter()
    try:
        with ctx as a:
            result = body()
    except Exception as exc:
        if not use_audit:
            raise
        import rngaudit

        if not isinstance(exc, rngaudit.RNGAuditError):
            raise
        out.raised = True
        out.error_type = type(exc).__name__
        out.error_message = str(exc)
    out.audit_s = time.perf_counter() - t0
    if use_audit:
        report = getattr(a, "report", None)
        if report is not None:
            out.report = report.to_dict()
    return result, out


# --------------------------------------------------------------------------- set-ups
# Each returns (outcome, iterable-of-batches); the scenario's randomness happens before the
# audited block exactly as a user's training script would do it.


def _accelerate_setup(
    *,
    stateful: bool,
    seedable: bool = False,
    pre: Callable[[int], None] | None = None,
) -> Callable[[Scenario, Path, bool], tuple[Any, Batches]]:
    def setup(sc: Scenario, report_dir: Path, use_audit: bool) -> tuple[Any, Batches]:
        acc = _accelerator(stateful=stateful, seedable=seedable)
        if pre is not None:
            pre(acc.process_index)
        raw = _loader(sc)
        loader, outcome = _run_audited(report_dir, use_audit, lambda: acc.prepare(raw))
        return outcome, loader

    return setup


def _pre_seed_1234(rank: int) -> None:
    torch.manual_seed(1234)  # identical on every rank before prepare()


def _pre_set_seed_device_specific(rank: int) -> None:
    from accelerate.utils import set_seed

    set_seed(1234, device_specific=True)  # seed 1234 + process_index: differs per rank


def _pre_extra_draw_rank0(rank: int) -> None:
    from accelerate.utils import set_seed

    set_seed(42)  # identical seeds...
    if rank == 0:
        torch.rand(1)  # ...then rank 0 consumes one extra draw (e.g. an extra layer init)


def _plain_ddp_setup(sc: Scenario, report_dir: Path, use_audit: bool) -> tuple[Any, Batches]:
    from torch.utils.data.distributed import DistributedSampler

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", timeout=PG_TIMEOUT)

    def body() -> Any:
        ds = _dataset(sc)
        sampler: DistributedSampler[Any] = DistributedSampler(ds, shuffle=True)  # seed + epoch
        sampler.set_epoch(0)
        loader = DataLoader(
            ds, batch_size=sc.batch_size, sampler=sampler, num_workers=sc.num_workers
        )
        return iter(loader)  # spawns workers and prefetches: the sampler runs here

    it, outcome = _run_audited(report_dir, use_audit, body)
    return outcome, it


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        # ---- must raise: the epoch-0 partition really is corrupted
        Scenario(
            "repro_noseed",
            True,
            96,
            4,
            6,
            _accelerate_setup(stateful=True),
            "seed report repro, no seed: ranks start from different global RNG states",
        ),
        Scenario(
            "set_seed_device_specific",
            True,
            16,
            2,
            2,
            _accelerate_setup(stateful=True, pre=_pre_set_seed_device_specific),
            "set_seed(1234, device_specific=True) before a stateful prepare, num_workers=2",
        ),
        Scenario(
            "extra_draw_rank0",
            True,
            16,
            2,
            2,
            _accelerate_setup(stateful=True, pre=_pre_extra_draw_rank0),
            "identical seeds, one extra torch.rand(1) on rank 0, stateful, num_workers=2",
        ),
        Scenario(
            "extra_draw_rank0_seedable",
            True,
            16,
            2,
            2,
            _accelerate_setup(stateful=True, seedable=True, pre=_pre_extra_draw_rank0),
            "as extra_draw_rank0 with use_seedable_sampler=True",
        ),
        # ---- must stay clean: the partition is intact
        Scenario(
            "repro_seed",
            False,
            96,
            4,
            6,
            _accelerate_setup(stateful=True, pre=_pre_seed_1234),
            "seed report repro with torch.manual_seed(1234) on every rank",
        ),
        Scenario(
            "stateful_unseeded_workers0",
            False,
            16,
            2,
            0,
            _accelerate_setup(stateful=True),
            "stateful, unseeded, num_workers=0: the sampler first runs after the RNG sync",
        ),
        Scenario(
            "not_stateful_unseeded_workers2",
            False,
            16,
            2,
            2,
            _accelerate_setup(stateful=False),
            "plain accelerate loader, unseeded, num_workers=2",
        ),
        Scenario(
            "plain_ddp_distributed_sampler",
            False,
            16,
            2,
            2,
            _plain_ddp_setup,
            "torch.distributed + DistributedSampler, unseeded, num_workers=2, no accelerate",
            accelerate=False,
        ),
    ]
}

MUST_RAISE = [name for name, s in SCENARIOS.items() if s.expect_corrupted]
MUST_STAY_CLEAN = [name for name, s in SCENARIOS.items() if not s.expect_corrupted]


# --------------------------------------------------------------------------- measurement


def measure_partition(items: list[int], n_items: int) -> dict[str, Any]:
    """Gather every rank's epoch-0 items and compare the union with range(n_items)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, items)
    union = [i for rank_items in gathered for i in rank_items]
    union_set = set(union)
    per_rank = [sorted(r) for r in gathered]
    overlap = set(per_rank[0]).intersection(*per_rank[1:]) if len(per_rank) > 1 else set()
    return {
        "n": n_items,
        "union": len(union_set),
        "missing": len(set(range(n_items)) - union_set),
        "duplicates": len(union) - len(union_set),
        "overlap_all_ranks": len(overlap),
        "per_rank_counts": [len(r) for r in per_rank],
        "per_rank_items": per_rank,
    }


def summarize_report(report: dict[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {
        "verdict": report.get("verdict"),
        "findings": [
            {"kind": f.get("kind"), "severity": f.get("severity"), "ranks": f.get("ranks")}
            for f in report.get("findings", [])
        ],
    }


def run(name: str, outdir: Path, use_audit: bool) -> dict[str, Any]:
    sc = SCENARIOS[name]
    outdir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    t0 = time.perf_counter()
    outcome, batches = sc.setup(sc, outdir / "report", use_audit)
    t_setup = time.perf_counter() - t0

    # ALWAYS iterate epoch 0, whatever the audit said: this is the ground truth.
    flat = [i for b in batches for i in (b[0] if isinstance(b, list | tuple) else b).tolist()]
    partition = measure_partition(flat, sc.n_items)
    result: dict[str, Any] = {
        "scenario": name,
        "description": sc.description,
        "expect_corrupted": sc.expect_corrupted,
        "rank": rank,
        "world_size": dist.get_world_size(),
        "audit_enabled": use_audit,
        "n_items": sc.n_items,
        "batch_size": sc.batch_size,
        "num_workers": sc.num_workers,
        "audit": {
            "raised": outcome.raised,
            "error_type": outcome.error_type,
            "error_message": outcome.error_message,
            "report": summarize_report(outcome.report),
            "seconds": round(outcome.audit_s, 3),
        },
        "partition": partition,
        "corrupted": partition["missing"] > 0 or partition["duplicates"] > 0,
        "seconds": {"setup": round(t_setup, 3), "total": round(time.perf_counter() - t0, 3)},
    }
    path = outdir / f"result-rank{rank}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if rank == 0:
        p = partition
        print(
            f"[{name}] audit={'on' if use_audit else 'off'} raised={outcome.error_type} "
            f"union={p['union']}/{p['n']} missing={p['missing']} duplicates={p['duplicates']}",
            flush=True,
        )
    return result


class _FreshRNG:
    """The global RNG states as the process had them first; restored before every scenario."""

    def __init__(self) -> None:
        import numpy as np

        self.torch = torch.get_rng_state()
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        import numpy as np

        torch.set_rng_state(self.torch)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


def _names(text: str) -> list[str]:
    names = text.split(",")
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"unknown or repeated scenario in {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "scenario", type=_names, help=f"one or more of {','.join(SCENARIOS)}, comma-separated"
    )
    parser.add_argument("outdir", type=Path)
    parser.add_argument(
        "--no-audit",
        action="store_true",
        default=os.environ.get("RNGAUDIT_SCENARIO_NO_AUDIT", "") not in ("", "0"),
        help="skip rngaudit entirely (also: RNGAUDIT_SCENARIO_NO_AUDIT=1); measure only",
    )
    args = parser.parse_args(argv)
    names: list[str] = args.scenario
    names.sort(key=lambda name: SCENARIOS[name].accelerate)  # stable: the others keep order
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    fresh = _FreshRNG()
    try:
        for name in names:
            fresh.restore()
            outdir = args.outdir if len(names) == 1 else args.outdir / name
            run(name, outdir, use_audit=not args.no_audit)
            dist.barrier()  # every rank done with this scenario before the next one starts
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        faulthandler.cancel_dump_traceback_later()
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
