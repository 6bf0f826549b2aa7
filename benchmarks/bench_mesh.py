"""The mesh checks' cost at the first training steps: world 4, a (dp, tp) mesh, ABAB launches.

Each launch (torchrun, 4 processes, gloo on CPU) builds a 2 x 2 ``DeviceMesh`` ("dp", "tp"),
a ``DistributedSampler(num_replicas=dp size, rank=dp rank)`` loader (32-feature samples,
batches of 16) and an MLP of 4 ``Linear(256, 256)`` layers (263k parameters, one seed), and
trains the torch tutorial's way (backward, gradients averaged over the dp group with
``dist.all_reduce``, ``SGD.step``). Timed on rank 0: from the loader's construction through
the first ``--first`` steps (the first batch's order check and peers' digest exchange, the
first optimizer step's weights digest and exchange), then the next ``--after`` steps (what
stays: the optimizer pre-hook's look-up and the all-reduce wrapper's entry). Arms: ``plain``
(without rngaudit), ``before`` (the loader built inside ``rngaudit.audit()`` with this issue's
checks switched off: no peers' digest, no layout, no weights hook: rngaudit as it was) and
``audited`` (all of it). In ``audited``, rank 0 also times the mesh checks' own functions
(the peers' fields and comparison, the layout, the optimizer pre-hook with its exchange):
``mesh_checks_s``. ``--micro``: in one process (a world of 1, gloo), what stays after the
first steps: ``dist.all_reduce`` of a 1-element tensor and ``SGD.step()`` over 5 parameters,
unwrapped, after a window of rngaudit as it was (this issue's hook and wrapper off), then
with the weights check armed (past its 16 looked-at steps), the best of 7 repeats of 2,000
calls. Prints one JSON object: the median of each arm over ``--pairs`` rounds of launches
(plain, before, audited) and the ratios.
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
ARMS = ("plain", "before", "audited")


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

    spent: dict[str, float] = {}
    if arm != "plain":
        import rngaudit
        from rngaudit.ranks import peers, replicas

        if arm == "before":  # this checks off
            peers.first_fields = lambda shard, batch: {}  # type: ignore[assignment]
            peers.as_replicas = lambda summaries, records: (summaries, None)  # type: ignore[assignment]
            replicas.arm = lambda watch: None  # type: ignore[assignment]
        else:
            for module, name in (
                (peers, "first_fields"), (peers, "check_first"), (peers, "as_replicas"),
                (replicas, "_pre_step"),
            ):  # fmt: skip
                setattr(module, name, _timed(name, getattr(module, name), spent))
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
            "mesh_checks_s": sum(spent.values()),
            "mesh_checks": spent,
        }
        (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _timed(name: str, func: Any, spent: dict[str, float]) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

    return timed


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


def micro() -> dict[str, float]:
    import tempfile as tf
    import timeit

    import torch
    import torch.distributed as dist

    store = tf.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{store}/pg", rank=0, world_size=1)
    x = torch.ones(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(2)], torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    def best(stmt: Any) -> float:
        return min(timeit.repeat(stmt, number=2000, repeat=7)) / 2000 * 1e6

    out = {"all_reduce_us": best(lambda: dist.all_reduce(x)), "step_us": best(opt.step)}
    import rngaudit
    from rngaudit.ranks import replicas

    arm = replicas.arm
    replicas.arm = lambda watch: None  # type: ignore[assignment]
    with rngaudit.audit(report_dir=f"{store}/report"):
        pass  # rngaudit as it was, after a window
    out["all_reduce_before_us"] = best(lambda: dist.all_reduce(x))
    out["step_before_us"] = best(opt.step)
    replicas.arm = arm  # type: ignore[method-assign]
    with rngaudit.audit(report_dir=f"{store}/report"):
        pass
    assert replicas._state["armed"]
    for _ in range(20):
        opt.step()  # past the steps looked at
    out["all_reduce_armed_us"] = best(lambda: dist.all_reduce(x))
    out["step_armed_us"] = best(opt.step)
    dist.destroy_process_group()
    return {k: round(v, 2) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--first", type=int, default=8)
    parser.add_argument("--after", type=int, default=40)
    parser.add_argument("--child", choices=ARMS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--micro", action="store_true")
    args = parser.parse_args()
    if args.micro:
        print(json.dumps(micro(), indent=1))
        return
    if args.child:
        child(args.child, args.first, args.after, args.out)
        return
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for _ in range(args.pairs):
        for arm in ARMS:
            runs[arm].append(launch(arm, args.first, args.after))

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    out: dict[str, Any] = {"pairs": args.pairs, "first_steps": args.first}
    for key in ("first_s", "after_per_step_ms"):
        a, z, b = med("plain", key), med("before", key), med("audited", key)
        out[key] = {
            "unaudited": round(a, 4),
            "before": round(z, 4),
            "audited": round(b, 4),
            "ratio_to_unaudited": round(b / a, 3),
            "ratio_to_before": round(b / z, 3),
            "round_ratios_to_before": [
                round(rb[key] / rz[key], 3)
                for rz, rb in zip(runs["before"], runs["audited"], strict=True)
            ],
        }
    out["mesh_checks_s"] = [round(r["mesh_checks_s"], 4) for r in runs["audited"]]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
