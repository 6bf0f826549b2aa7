"""The per-batch path after the window: a shuffled DataLoader loop, RNGAUDIT=1 against unset.

Each arm is a fresh process (the audit is armed at interpreter start): ``batch_size=1``,
``num_workers=0``, a tiny step per batch, seven epochs; the child prints the median time of
epochs 2-7 (epoch 0 closes the RNGAUDIT window, epoch 1 is a warm-up). Arms alternate (ABAB)
and an A/A pair of unaudited runs shows the noise. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(batches: int) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(batches, 8))
    loader = DataLoader(data, batch_size=1, shuffle=True)
    weight = torch.randn(8, 8)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for (x,) in loader:
            (x @ weight).sum()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"epoch_s": statistics.median(times[2:]), "batches": batches}))


def _run(armed: bool, batches: int, report: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env["OMP_NUM_THREADS"] = "1"
    if armed:
        env.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=report)
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(batches)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["epoch_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4000)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory() as report:
        off, on, aa = [], [], []
        for i in range(args.pairs):
            pair = [(off, False), (on, True)]
            for sink, armed in pair if i % 2 == 0 else reversed(pair):
                sink.append(_run(armed, args.batches, report))
            aa.append(_run(False, args.batches, report) / off[-1])
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    print(
        json.dumps(
            {
                "unaudited_epoch_s": statistics.median(off),
                "audited_epoch_s": statistics.median(on),
                "ratio": statistics.median(ratios),
                "ratios": [round(r, 3) for r in ratios],
                "aa_ratios": [round(r, 3) for r in aa],
                "added_us_per_batch": (statistics.median(on) - statistics.median(off))
                / args.batches
                * 1e6,
            }
        )
    )


if __name__ == "__main__":
    main()
