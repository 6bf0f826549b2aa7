"""Correct runs under each launcher, RNGAUDIT=1 against unset: wall time of the whole run (ABBA)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import PYTHON, child_env, median

ACCELERATE = str(Path(PYTHON).parent / "accelerate")
TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
LAUNCHES = {
    "torchrun (accelerate, stateful loader, seeded)": [
        *TORCHRUN, "examples/repro_prepare_prefetch.py", "seed",
    ],
    "accelerate launch (seeded)": [
        ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2",
        "examples/repro_prepare_prefetch.py", "seed",
    ],
    "Lightning ddp, `python train.py`": [
        PYTHON, "tests/frameworks/lightning_train.py", "ddp", "same",
    ],
    "Lightning ddp_spawn": [PYTHON, "tests/frameworks/lightning_train.py", "ddp_spawn", "same"],
    "HF Trainer under torchrun": [*TORCHRUN, "tests/frameworks/hf_train.py"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in LAUNCHES.items():
            truth = Path(tmp) / "truth"
            truth.mkdir(exist_ok=True)
            base = {"TRUTH_DIR": str(truth), "HF_HUB_OFFLINE": "1"}
            off = child_env(**base)
            on = child_env(**base, RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(Path(tmp) / "report"))
            times: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(args.pairs):
                order = [("off", off), ("on", on)]
                for arm, env in order if i % 2 == 0 else reversed(order):
                    start = time.perf_counter()
                    benchlib.run(cmd, env)
                    times[arm].append(time.perf_counter() - start)
            out[name] = times
            ratio = median(times["on"]) / median(times["off"])
            print(
                f"{name}: unset {median(times['off']):.1f} s, RNGAUDIT=1 "
                f"{median(times['on']):.1f} s, {ratio:.3f}x",
                file=sys.stderr,
                flush=True,
            )
    benchlib.emit(out)


if __name__ == "__main__":
    main()
