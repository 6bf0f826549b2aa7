"""The mesh checks' cost at the first training steps: world 4, a (dp, tp) mesh, ABAB launches.

Each launch (torchrun, 4 processes, gloo on CPU) builds a 2 x 2 ``DeviceMesh`` ("dp", "tp"),
a ``DistributedSampler(num_replicas=dp size, rank=dp rank)`` loader (32-feature samples,
batches of 16) and an MLP of 4 ``Linear(256, 256)`` layers (263k parameters, one seed), and
trains the torch tutorial's way (backward, gradients averaged over the dp group with
``dist.all_reduce``, ``SGD.step``). Timed on rank 0: from the loader's construction through
the first ``--first`` steps (the first batch's order check and peers' digest exchange, the
first optimizer step's weights digest and exchange), then the next ``--after`` steps (what
stays: the optimizer pre-hook's look-up and the all-reduce wrapper's entry). Arm A: without
rngaudit; arm B: the loader built inside ``rngaudit.audit()``. Prints one JSON object: the
median of each arm over ``--pairs`` A/B pairs of launches and the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def child(arm: str, first: int, after: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256), *[torch.nn.Linear(256, 256) for _ in range(4)]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(4096, 32))
    dist.barrier()
    t0 = time.perf_counter()

    def build() -> Any:
        sampler = DistributedSampler(
            data, num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
        )
        return DataLoader(data, batch_size=16, sampler=sampler)

    if arm == "audited":
        import rngaudit

        with rngaudit.audit(report_dir=str(out / "report")):
            loader = build()
    else:
        loader = build()
    marks = []
    for step, (x,) in enumerate(loader):
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp.get_group())
            p.grad /= dp.size()
        opt.step()
        opt.zero_grad()
        marks.append(time.perf_counter())
        if step + 1 == first + after:
            break
    if rank == 0:
        result = {
            "first_s": marks[first - 1] - t0,
            "after_per_step_ms": (marks[-1] - marks[first - 1]) / after * 1e3,
        }
        (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def launch(arm: str, first: int, after: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
        env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
            str(HERE), "--child", arm, "--first", str(first), "--after", str(after),
            "--out", tmp,
        ]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
        result: dict[str, float] = json.loads((Path(tmp) / "result.json").read_text())
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--first", type=int, default=8)
    parser.add_argument("--after", type=int, default=40)
    parser.add_argument("--child", choices=("plain", "audited"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.first, args.after, args.out)
        return
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "audited": []}
    for _ in range(args.pairs):
        for arm in ("plain", "audited"):
            runs[arm].append(launch(arm, args.first, args.after))

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    out: dict[str, Any] = {"pairs": args.pairs, "first_steps": args.first}
    for key in ("first_s", "after_per_step_ms"):
        a, b = med("plain", key), med("audited", key)
        out[key] = {"unaudited": round(a, 4), "audited": round(b, 4), "ratio": round(b / a, 3)}
        out[key]["pair_ratios"] = [
            round(rb[key] / ra[key], 3)
            for ra, rb in zip(runs["plain"], runs["audited"], strict=True)
        ]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
