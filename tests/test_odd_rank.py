"""Three ranks, one of them (not rank 0) alone different: every check names it, every rank raises.

The set-ups are in tests/distributed/harm_scenarios.py (``odd_*``): the first-batch order
check (a DistributedSampler seed; a DistributedSampler subclass shuffling from the global
generator, by the state its draw came from; accelerate's IterableDatasetShard over a stream
seeded per rank), the datasets compared when the window closes (per-rank shards of per-rank
orders; a wrapper around a per-rank random_split of a ConcatDataset), the index mapping at an
epoch's first batch (Subset.indices reshuffled in place by rank 1 alone), Hugging Face streams
after split_dataset_by_node (split by examples: the shuffle seed; split by shards: the shards
each rank reads), the observed partition of loaders no known class shards (a sampler that
shards itself, with the last rank alone evaluating between epochs; DDP with no sampler: every
rank trains every sample; raised at the DDP module's first training forward of the corrupted
epoch, before its step; a lazily yielding one whose first batches are disjoint: compared as the
epoch is drawn, raised at a later step), each with its twin where no rank differs, and runs
intact though a rank's seed differs (reseeded alike after the block; shards that stay
disjoint). Three torchrun launches: without rngaudit (the truth), with ``rngaudit.audit()``
around the set-up, and under ``RNGAUDIT=1`` (the window's check first, as a training script's
only loader would be).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import keyed_checks
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "distributed" / "harm_scenarios.py"
NPROC = 3
ODD = NPROC - 1
CORRUPTED = {  # scenario -> the finding kind
    "odd_spawn_style": "dataset-divergence",
    "odd_subclass_global_shuffle": "sampler-draw-divergence",
    "odd_ds_seed": "sampler-draw-divergence",
    "odd_self_sharding_eval": "partition-overlap",
    "odd_ddp_shuffled_no_sampler": "partition-overlap",
    "odd_wrapper_random_split": "dataset-divergence",
    "odd_subset_reshuffled_in_place": "dataset-divergence",
    "odd_hf_stream_shuffle_seed": "dataset-divergence",
    "odd_hf_stream_split_by_shards": "dataset-divergence",
    "odd_stream_shard_seed": "sampler-draw-divergence",
}
# the first corrupted epoch, when not 0
FIRST = {"odd_self_sharding_eval": 1, "odd_subset_reshuffled_in_place": 1}
ODD_RANK = {"odd_subset_reshuffled_in_place": 1}  # the rank that differs, when not the last
TWINS = [  # intact: no rank differs, or one's seed differs and the partition does not
    "odd_spawn_style_twin",
    "odd_subclass_global_shuffle_twin",
    "odd_ds_seed_twin",
    "odd_self_sharding_eval_twin",
    "odd_ddp_self_shard_twin",
    "odd_wrapper_random_split_twin",
    "odd_subset_reshuffled_in_place_twin",
    "odd_hf_stream_shuffle_seed_twin",
    "odd_hf_stream_split_by_shards_twin",
    "odd_hf_stream_split_by_shards_intact",
    "odd_stream_shard_seed_twin",
    "odd_reseeded_after_block",
    "odd_self_sharding_reseeded_after_block",
    "odd_self_sharding_lazy_late_twin",
    "odd_subclass_lazy_ddp_twin",
]
# lazily yielded, first batches disjoint: compared as drawn, raised at a later training step
# (scenario -> the corrupted epoch, the batch size)
AS_DRAWN = {"odd_self_sharding_lazy_late": (1, 2), "odd_subclass_lazy_ddp": (0, 8)}
# Epoch 0 of a DistributedSampler subclass (no earlier partition): the least shared samples
# that rule out three ranks sampling independently with replacement (each would repeat about
# shared / 6 of its own): the smallest s with P(Poisson(s / 6) <= 2) ** 3 < 1e-12.
NOT_BY_REPLACEMENT = next(
    s for s in range(3, 1000) if (math.exp(-s / 6) * (1 + s / 6 + (s / 6) ** 2 / 2)) ** 3 < 1e-12
)
FIRST_FIVE = list(CORRUPTED)[:5]
# the keyed streams first: the odd scenarios leave epochs to compare when the group goes
ORDER = [
    *keyed_checks.ORDER, "odd_spawn_style", *TWINS[:1], *FIRST_FIVE[1:], *TWINS[1:5],
    *list(CORRUPTED)[5:], *TWINS[5:], *AS_DRAWN,
]  # fmt: skip

pytestmark = pytest.mark.timeout(600)


def _launch(outdir: Path, how: str) -> dict[int, dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={NPROC}", str(SCRIPT), str(outdir), "--how", how,
        "--only", ",".join(ORDER),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if how == "env":
        env.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(outdir / "report"))
        env.update(RNGAUDIT_SAMPLE_KEY="id")  # the keyed scenarios: keyed with no code change
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, f"{how}: torchrun exited {proc.returncode}\n{tail}"
    return {r: json.loads((outdir / f"result-rank{r}.json").read_text()) for r in range(NPROC)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        how: _launch(tmp_path_factory.mktemp(f"odd-{how}"), how) for how in ("none", "block", "env")
    }


def _duplicated(runs: dict[str, Any], scenario: str, epoch: int) -> bool:
    items = [i for r in range(NPROC) for i in runs["none"][r][scenario]["epochs"][epoch]]
    return len(set(items)) != len(items)


@pytest.mark.parametrize("scenario", [*CORRUPTED, *TWINS])
def test_the_scenario_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    epochs = len(runs["none"][0][scenario]["epochs"])
    truth = [_duplicated(runs, scenario, e) for e in range(epochs)]
    first = FIRST.get(scenario, 0)
    assert any(truth) == (scenario in CORRUPTED)
    if scenario in CORRUPTED:
        assert truth.index(True) == first
        plain = [set(runs["none"][r][scenario]["epochs"][first]) for r in range(NPROC)]
        if scenario == "odd_ddp_shuffled_no_sampler":  # every rank trains every sample
            assert all(p == set(range(36)) for p in plain)
        else:  # the odd rank is the one that differs: the others agree
            odd = ODD_RANK.get(scenario, ODD)
            others = [p for r, p in enumerate(plain) if r != odd]
            assert not others[0] & others[1]
            assert any(plain[odd] & p for p in others)


@pytest.mark.parametrize("how", ["block", "env"])
@pytest.mark.parametrize("scenario", [*CORRUPTED, *TWINS])
def test_every_rank_gets_the_verdict_of_the_truth(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert "crashed" not in res, res.get("crashed")
        plain_epochs = runs["none"][rank][scenario]["epochs"]  # auditing changes no partition
        assert res["epochs"] == plain_epochs[: len(res["epochs"])], (scenario, rank)
        if scenario in CORRUPTED:
            assert len(res["epochs"]) == FIRST.get(scenario, 0)  # every epoch before it
            assert res["raised"], f"rank {rank} did not raise"
            assert CORRUPTED[scenario] in res["kinds"], res["kinds"]
            first = FIRST.get(scenario, 0)
            assert res["raised_at"] in ("set-up", f"epoch {first}"), res["raised_at"]
            if CORRUPTED[scenario] == "partition-overlap":  # at the first training step
                plain = runs["none"][rank][scenario]
                assert plain["steps"][first] > 0  # the truth: that epoch's steps, unaudited
                assert res["raised_at"] == f"epoch {first}", res
                assert res["steps_at_raise"] == 0, res  # none of them ran audited
                assert 0 < res["items_at_raise"] < len(plain["epochs"][first])
            elif res["raised_at"] != "set-up":  # before the first batch reached the loop
                assert res["items_at_raise"] == 0
        else:
            assert not res["raised"], f"rank {rank}: {res.get('message')}"
            assert len(res["epochs"]) == len(plain_epochs)


def _shared(batches: list[list[list[int]]], k: int) -> int:
    """Samples in more than one rank's first ``k`` batches."""
    counts: dict[int, int] = {}
    for per_rank in batches:
        for i in {i for b in per_rank[:k] for i in b}:
            counts[i] = counts.get(i, 0) + 1
    return sum(1 for n in counts.values() if n > 1)


@pytest.mark.parametrize("how", ["block", "env"])
@pytest.mark.parametrize("scenario", sorted(AS_DRAWN))
def test_a_lazy_epoch_is_compared_as_it_is_drawn_and_every_rank_raises_at_the_measured_step(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """Three ranks, a sampler that yields lazily: the last rank alone evaluating after epoch 0
    (a loader that partitioned before), or a DistributedSampler subclass drawing from the last
    rank's differing seed (epoch 0, under its bound for sampling with replacement). The first
    batches are disjoint (measured), so the group compares what each rank was handed at
    training steps 2, 4, 8, ...; every rank raises before the step after the first such count
    whose batches overlap beyond padding (epoch 0: beyond the bound), measured without
    rngaudit."""
    first, size = AS_DRAWN[scenario]
    plain = [runs["none"][r][scenario] for r in range(NPROC)]
    assert not any(_duplicated(runs, scenario, e) for e in range(first))
    assert _duplicated(runs, scenario, first)
    batches = [
        [p["epochs"][first][i : i + size] for i in range(0, len(p["epochs"][first]), size)]
        for p in plain
    ]
    assert _shared(batches, 1) == 0  # the claim: the first batches are disjoint
    least = NPROC if first > 0 else NOT_BY_REPLACEMENT
    due, total = 2, len(batches[0])
    while due < total and _shared(batches, due) < least:
        due *= 2
    assert due < total
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert res["raised"] and res["raised_at"] == f"epoch {first}", res
        assert res["steps_at_raise"] == due, (rank, res["steps_at_raise"], due)
        assert res["epochs"] == plain[rank]["epochs"][:first]
        assert "partition-overlap" in res["kinds"]
        shared = _shared(batches, due)
        assert (
            f"the first {due} batches each rank was handed share {shared} samples"
            in (res["message"])
        )


@pytest.mark.parametrize("how", ["block", "env"])
def test_the_order_check_names_the_odd_rank(runs: dict[str, Any], how: str) -> None:
    message = runs[how][0]["odd_ds_seed"]["message"]
    assert f"seed differs across ranks (ranks 0, 1: 100; rank {ODD}: 101)" in message
    message = runs[how][0]["odd_subclass_global_shuffle"]["message"]  # the draw's state
    assert re.search(rf"fingerprints ranks 0, 1: \w+; rank {ODD}: \w+\)", message), message
    message = runs[how][0]["odd_stream_shard_seed"]["message"]  # the stream before sharding
    assert re.search(rf"differs \(ranks 0, 1: \w+; rank {ODD}: \w+\)", message), message
    message = runs[how][0]["odd_subset_reshuffled_in_place"]["message"]  # rank 1 reshuffled
    assert re.search(r"\(ranks 0, 2: Subset\(len=36, indices=\w+,.*; rank 1: Subset\(", message)
    assert "epoch 1: the index mapping each rank is about to shard differs" in message
    message = runs[how][0]["odd_hf_stream_shuffle_seed"]["message"]  # its shuffle's state
    assert re.search(rf"\(ranks 0, 1: stream:.*split=examples.*; rank {ODD}: stream:", message)
    # the datasets the ranks built (compared when the window closes: the block) or the index
    # mapping at the first batch (under RNGAUDIT=1 the window closed at the launch's first)
    message = runs[how][0]["odd_wrapper_random_split"]["message"]
    assert (
        f"By the dataset they built, the ranks group as ranks 0, 1; rank {ODD}." in message
        if how == "block"
        else re.search(rf"\(ranks 0, 1: Wrapper\(len=24, .*; rank {ODD}: Wrapper\(", message)
    ), message


@pytest.mark.parametrize("how", ["block", "env"])
def test_the_shards_read_twice_are_the_measured_ones(runs: dict[str, Any], how: str) -> None:
    """Split by shards, the last rank's shuffle seed ordering its shard list otherwise: the
    shards read by more than one rank (and by none) and which ranks share them are the ones
    measured without rngaudit, 6 samples a shard."""
    scenario = "odd_hf_stream_split_by_shards"
    plain = [set(runs["none"][r][scenario]["epochs"][0]) for r in range(NPROC)]
    union = set().union(*plain)
    shared = sum(1 for i in union if sum(i in p for p in plain) > 1) // 6
    pairs = [(a, b) for a in range(NPROC) for b in range(a + 1, NPROC) if plain[a] & plain[b]]
    assert shared > 0 and pairs == [(0, ODD)]  # the truth: the last rank reads rank 0's shards
    message = runs[how][0][scenario]["message"]
    assert (
        f"{shared} of its 6 shards go to more than one rank (ranks 0, {ODD} read the same "
        f"shards) and {(36 - len(union)) // 6} to none"
    ) in message


@pytest.mark.parametrize("how", ["block", "env"])
def test_the_counts_are_the_measured_ones(runs: dict[str, Any], how: str) -> None:
    for scenario, says in (
        ("odd_spawn_style", "root samples are in more than one rank's dataset and"),
        ("odd_self_sharding_eval", "samples went to more than one rank, and"),
    ):
        first = FIRST.get(scenario, 0)
        plain = [set(runs["none"][r][scenario]["epochs"][first]) for r in range(NPROC)]
        union = set().union(*plain)
        shared = sum(1 for i in union if sum(i in p for p in plain) > 1)
        assert f"{shared} of 36 {says} {36 - len(union)}" in runs[how][0][scenario]["message"]


@pytest.mark.parametrize("scenario", keyed_checks.SCENARIOS)
def test_keyed_scenario_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    keyed_checks.check_truth(runs, scenario)


@pytest.mark.parametrize("how", ["block", "env"])
@pytest.mark.parametrize("scenario", keyed_checks.SCENARIOS)
def test_keyed_verdict_names_the_odd_ranks_overlap(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    keyed_checks.check_verdict(runs, how, scenario)
    if scenario in ("keyed_seed_per_rank", "keyed_workers_seed_per_rank"):
        keyed_checks.check_counts(runs, how, scenario)


@pytest.mark.parametrize("how", ["block", "env"])
def test_a_keyed_loader_the_odd_rank_iterates_alone_is_never_waited_for(
    runs: dict[str, Any], how: str
) -> None:
    keyed_checks.check_alone(runs, how)
