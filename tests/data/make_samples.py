"""Writes the sample report directories under tests/data (run it after a schema change).

``divergent``: 2 ranks seeded alike by ``accelerate.utils.set_seed(42)``; rank 0 then makes one
extra ``torch.rand`` before ``accelerator.prepare()``, so the sampler generator that prepare()
seeds from the global RNG differs across ranks. ``clean``: the same run without the extra draw.
Each directory holds ``rank-0.json``, ``rank-1.json`` and the merged ``report.json``.
The events are built by hand in the producer's shapes (``rngaudit.records.Event``, checked by
mypy): they are not yet captured from a real 2-rank run. ``make goldens`` runs both steps:

    .venv/bin/python tests/data/make_samples.py
    RNGAUDIT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rngaudit.events import ITERATION, PRE_ITERATION
from rngaudit.records import CallSiteDict, Event, SamplerDict
from rngaudit.report_read import load_report_dir

HERE = Path(__file__).parent
SP = "/opt/venv/lib/python3.11/site-packages/"
USER = "/home/alice/proj/train.py"
RUN_ID = "7f3a9c1e2b4d"
SAMPLER = "torch.Generator#1 (sampler.generator)"
GLOBAL = "torch.default_generator"


def site(file: str, line: int, function: str) -> CallSiteDict:
    return {"file": file, "line": line, "function": function}


def event(
    generator: str,
    op: str,
    kind: str,
    chain: list[CallSiteDict],
    user: CallSiteDict,
    fingerprint: str | None,
    *,
    sampler: SamplerDict | None = None,
    count: int = 1,
    phase: str = PRE_ITERATION,
) -> Event:
    return {
        "seq": 0,
        "audit": 0,
        "generator": generator,
        "op": op,
        "kind": kind,
        "call_site": chain[0],
        "chain": chain,
        "user_call_site": user,
        "count": count,
        "fingerprint": fingerprint,
        "thread": "MainThread",
        "pid": 0,
        "phase": phase,
        "sampler": sampler,
    }


def record(rank: int, extra_draw: bool) -> dict[str, Any]:
    user_seed, user_prep = site(USER, 28, "main"), site(USER, 38, "main")
    seed_chain = [site(SP + "accelerate/utils/random.py", 53, "set_seed"), user_seed]
    prep = site(SP + "accelerate/data_loader.py", 1240, "prepare_data_loader")
    base = site(SP + "torch/utils/data/dataloader.py", 690, "__init__")
    draw = site(SP + "torch/utils/data/sampler.py", 172, "__iter__")
    state_dict = site(
        SP + "torchdata/stateful_dataloader/stateful_dataloader.py", 415, "state_dict"
    )
    events = [
        event("random (global)", "random.seed", "seed", seed_chain, user_seed, None),
        event(
            "numpy.random (global)",
            "numpy.random.seed",
            "seed",
            [site(SP + "accelerate/utils/random.py", 54, "set_seed"), user_seed],
            user_seed,
            None,
        ),
        event(
            GLOBAL,
            "torch.manual_seed",
            "seed",
            [site(SP + "accelerate/utils/random.py", 55, "set_seed"), user_seed],
            user_seed,
            None,
        ),
    ]
    # After set_seed(42) every rank's global torch state is the same.
    states = ["5e6f7a8b", "a1b2c3d4"]  # fingerprints are crc32s: 8 hex digits
    sampler_state = "3b4c5d6e"
    if extra_draw:
        rand = site(USER, 35, "main")
        events.append(event(GLOBAL, "aten.uniform_", "draw", [rand], rand, states[0]))
        states = ["a1b2c3d4", "d4c3b2a1"]
        sampler_state = "f0e1d2c3"
    accelerator_prepare = site(SP + "accelerate/accelerator.py", 2412, "prepare")
    adapter_init = site(SP + "accelerate/data_loader.py", 437, "__init__")
    reset = site(SP + "torch/utils/data/dataloader.py", 1276, "_reset")
    forward = site("/home/alice/proj/model.py", 61, "forward")
    events += [
        event(
            GLOBAL,
            "aten.random_",
            "draw",
            [prep, accelerator_prepare, user_prep],
            user_prep,
            states[0],
        ),
        event(
            GLOBAL,
            "aten.random_",
            "draw",
            [base, state_dict, adapter_init, user_prep],
            user_prep,
            states[1],
        ),
        event(
            SAMPLER,
            "aten.randperm",
            "draw",
            [draw, reset, user_prep],
            user_prep,
            sampler_state,
            sampler={
                "chain": "BatchSamplerShard > BatchSampler > RandomSampler",
                "loader": "train_loader",
                "output_digest": "77e1c0de" + sampler_state,
            },
        ),
        event(
            GLOBAL,
            "aten.bernoulli_",
            "draw",
            [site(SP + "torch/nn/functional.py", 1425, "dropout"), forward],
            forward,
            "c0ffee00",
            count=240,
            phase=ITERATION,
        ),
    ]
    pid = 4101 + rank
    for seq, item in enumerate(events):
        item["seq"], item["pid"] = seq, pid
    exit_state = "3333cccc" if extra_draw else "5555eeee"
    return {
        "rank": rank,
        "pid": pid,
        "host": "node-a",
        "events": events,
        "states": {"entry": {GLOBAL: "1111aaaa"}, "exit": {GLOBAL: exit_state}},
    }


FINDINGS = [
    {
        "kind": "sampler-draw-divergence",
        "severity": "error",
        "message": (
            "Ranks 0 and 1 drew sampler indices (RandomSampler via BatchSamplerShard, loader "
            f"'train_loader') from different states of {SAMPLER} before the first batch: their "
            "shards overlap or miss samples."
        ),
        "ranks": [0, 1],
        "audit": 0,
        "generator": SAMPLER,
        "call_site": site(SP + "torch/utils/data/sampler.py", 172, "__iter__"),
        "user_call_site": site(USER, 38, "main"),
        "remedy": (
            f"Rank 0 drew from {GLOBAL} before accelerator.prepare() (aten.uniform_ at train.py:35 "
            "in main). Make that draw on every rank, move it after the first batch, or give it "
            "a private torch.Generator."
        ),
        "details": {"first_divergent_seq": 3, "loader": "train_loader"},
    },
    {
        "kind": "consumption-mismatch",
        "severity": "warning",
        "message": (
            "Rank 0 made 4 draws before the first batch, rank 1 made 3: the extra one is "
            f"aten.uniform_ from {GLOBAL}."
        ),
        "ranks": [0],
        "audit": 0,
        "generator": GLOBAL,
        "call_site": site(USER, 35, "main"),
        "user_call_site": site(USER, 35, "main"),
        "remedy": "Draw rank-specific randomness from a private torch.Generator.",
    },
]


def write_sample(name: str, divergent: bool) -> None:
    directory = HERE / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    verdict = "error" if divergent else "ok"
    for rank in (0, 1):
        doc = {
            "schema_version": 1,
            "run_id": RUN_ID,
            "world_size": 2,
            "rank": rank,
            "mode": "raise",
            "verdict": verdict,
            "audits": [{"index": 0, "label": "epoch 0", "verdict": verdict}],
            "findings": FINDINGS if divergent else [],
            "record": record(rank, extra_draw=divergent and rank == 0),
        }
        (directory / f"rank-{rank}.json").write_text(json.dumps(doc, indent=2) + "\n")
    merged = load_report_dir(directory).to_dict()
    (directory / "report.json").write_text(json.dumps(merged, indent=2) + "\n")


if __name__ == "__main__":
    write_sample("divergent", divergent=True)
    write_sample("clean", divergent=False)
