"""What ranks shard, whatever drew it: verdicts checked against partitions measured unaudited.

Three torchrun launches run every set-up in tests/distributed/harm_scenarios.py: without
rngaudit (the truth), with ``rngaudit.audit()`` around the set-up, and under ``RNGAUDIT=1``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import keyed_checks
import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
N = 32  # the scenarios' dataset size
SCRIPT = ROOT / "tests" / "distributed" / "harm_scenarios.py"
NPROC = 2

# Stated here, independently of the scenario script; the truth test checks each claim.
MUST_RAISE = {  # scenario -> first corrupted epoch
    "user_sampler_stateful": 0,
    "user_numpy_sampler_stateful": 0,
    "user_sampler_default_loader": 0,
    "ds_seed_per_rank": 0,
    "random_split_per_rank": 0,
    "subset_randperm_accelerate": 0,
    "shuffled_list_accelerate": 0,
    "set_epoch_differs": 1,
    "mid_training_rank0_eval": 1,
    "resume_from_stale_checkpoint": 1,
    "hf_shuffle_per_rank": 0,
    "ds_subclass_global_shuffle": 0,
    "ds_subclass_lazy_global_shuffle": 0,
    "ds_subclass_yield_from_global_shuffle": 0,
    "ds_subclass_lazy_global_shuffle_ddp": 0,
    "wrapper_random_split_per_rank": 0,
    "subset_reshuffled_in_place_on_rank0": 1,
    "stream_shard_device_seeds": 0,
    "spawn_style_shards_per_rank_seed": 0,
    "hf_stream_shuffle_seed_per_rank": 0,
    "self_sharding_rank0_eval": 1,
    "self_sharding_lazy_rank0_eval": 1,
    "self_sharding_lazy_late_overlap": 1,
    "ddp_shuffled_no_sampler": 0,
    "ddp_big_root_no_sampler": 0,
    "ddp_shuffled_no_sampler_workers": 0,
    "ddp_compiled_no_sampler": 0,
    "fsdp_shuffled_no_sampler": 0,
    "fsdp1_shuffled_no_sampler": 0,
    "ddp_same_tensors_seed_per_rank": 0,  # the twin of ddp_presharded_tensors_seed_per_rank
}
# Found by the observed partition when every rank has drawn the epoch's last index batch.
AT_EPOCH_END = {
    # a warning at the first batch: its loop yields item by item, its epoch is not readable
    "ds_subclass_lazy_global_shuffle",
}
# Loaders no known class shards (a sampler that shards itself, no sampler at all under DDP) are
# never waited for at their first batch (a rank-0-only evaluation loader looks the same): the
# data-parallel ranks compare the epochs their samplers hold at the DDP module's first training
# forward of the epoch, before the step.
AT_FIRST_STEP = {
    "self_sharding_rank0_eval",
    "ddp_shuffled_no_sampler",
    "self_sharding_lazy_rank0_eval",  # by its first batches: the rest is not readable ahead
    "ddp_big_root_no_sampler",  # a root over 2M samples: the sketch
    "ddp_shuffled_no_sampler_workers",  # two DataLoader workers: the same meeting point
    "ddp_compiled_no_sampler",  # the DDP module called through torch.compile
    "fsdp_shuffled_no_sampler",  # FSDP2 (fully_shard): noted where fully_shard returns
    "fsdp1_shuffled_no_sampler",  # FSDP1 (FullyShardedDataParallel): noted at its __init__
    "ddp_same_tensors_seed_per_rank",  # every rank's TensorDataset holds the same tensors
}
# A lazily yielding sampler of a loader that partitioned before, whose first batches do not
# overlap: what each rank was handed is compared again at training steps 2, 4, 8, ..., each
# before the next step; so is a DistributedSampler subclass yielding lazily from per-rank
# draws, from epoch 0, once the ranks share more than sampling with replacement would before
# repeating (scenario -> its batch size).
AS_DRAWN = {"self_sharding_lazy_late_overlap": 2, "ds_subclass_lazy_global_shuffle_ddp": 4}
# With no earlier partition, the least shared samples that rule out ranks sampling
# independently with replacement (which repeat about half as many of their own, at world 2):
# the smallest s with P(Poisson(s / 2) <= 1) ** 2 < 1e-12.
NOT_BY_REPLACEMENT = next(
    s for s in range(2, 1000) if (math.exp(-s / 2) * (1 + s / 2)) ** 2 < 1e-12
)
MUST_STAY_CLEAN = [
    "ds_shared_seed_per_rank_global",
    "random_split_shared_generator",
    "rank0_eval_default_loader",
    "set_epoch_correct",
    "set_epoch_forgotten",
    "eval_all_ranks",
    "rank0_only_eval_loader",
    "hf_map_per_rank_augment",
    "ds_subclass_seeded_shuffle",
    "ds_subclass_own_share_per_rank_order",
    "ds_subclass_lazy_own_share_ddp",
    "stream_shard_shared_seed",
    "hf_stream_shuffle_shared_seed",
    "hf_stream_split_by_shards_seed_per_rank",
    "spawn_style_shards_shared_seed",
    "reseeded_after_block",
    "self_sharding_rank0_eval_own_generator",
    "self_sharding_reseeded_after_block",
    "self_sharding_lazy_late_overlap_twin",
    "ddp_self_shard_per_rank_augment",
    "ddp_presharded_files",
    "ddp_rank_part_in_getitem",
    "dispatch_batches_loader",
    "ds_drop_last",
    "ddp_big_root_self_shard_twin",
    "ds_no_shuffle_seed_per_rank",  # the seed is unused without shuffle (twin: ds_seed_per_rank)
    # each rank's own file in a TensorDataset, local shuffle, per-rank seeds: the same indices
    # name different samples (twin: ddp_same_tensors_seed_per_rank)
    "ddp_presharded_tensors_seed_per_rank",
    # a per-rank preview drawn from a RandomSampler outside any loader, then a sharded loader
    # (twin: spawn_style_shards_per_rank_seed, whose per-rank order is the training Subset)
    "per_rank_preview_then_sharded",
]
# Ranks overlap by design (measured in test_intended_overlap_is_what_it_claims): never an error.
INTENDED_OVERLAP = {
    "tp_group_same_batch": "identical",  # no data-parallel module: a tensor-parallel group
    "ddp_with_replacement": "repeats",  # each rank repeats samples within its own epoch
    # a small epoch of a big root, drawn so: a few shared, no rank repeating (chance)
    "ddp_small_epoch_with_replacement": "chance",
    # the same from a DistributedSampler subclass yielding lazily (compared as it is drawn)
    "ds_subclass_lazy_with_replacement_ddp": "repeats",
    "ds_padding": "padding",  # DistributedSampler pads the last share: world - 1 duplicates
}
DATASET = {
    "random_split_per_rank",
    "subset_randperm_accelerate",
    "shuffled_list_accelerate",
    "hf_shuffle_per_rank",
    "wrapper_random_split_per_rank",
    "subset_reshuffled_in_place_on_rank0",
    "hf_stream_shuffle_seed_per_rank",
    "spawn_style_shards_per_rank_seed",
}
HOWS = ["block", "env"]


# Checked when the RNGAUDIT window closes (the training loader's first iteration), which in a
# launch shared by every scenario happened in the first one: under RNGAUDIT these scenarios get
# a launch of their own, as a training script would be.
OWN_WINDOW = ["spawn_style_shards_per_rank_seed", "spawn_style_shards_shared_seed"]
# The same, each in a launch alone: its window must still be open when its set-up draws.
OWN_LAUNCH = ["per_rank_preview_then_sharded"]


def _launch(outdir: Path, how: str, only: list[str] | None = None) -> dict[int, dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={NPROC}", str(SCRIPT), str(outdir), "--how", how,
    ]  # fmt: skip
    if only:
        cmd += ["--only", ",".join(only)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if how == "env":
        env.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(outdir / "report"))
        env.update(RNGAUDIT_SAMPLE_KEY="id")  # the keyed scenarios: keyed with no code change
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )  # fmt: skip
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-160:])
    assert proc.returncode == 0, f"{how}: torchrun exited {proc.returncode}\n{tail}"
    results = {}
    for rank in range(NPROC):
        results[rank] = json.loads((outdir / f"result-rank{rank}.json").read_text())
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two launches at a time, each its own torchrun (its own rendezvous port, directory and
    processes): one's start-up and teardown overlap another's scenarios."""
    out: dict[str, Any] = {}
    hows = [*HOWS, "none"]  # the longest first
    dirs = {how: tmp_path_factory.mktemp(f"harm-{how}") for how in hows}
    groups = [OWN_WINDOW, *([name] for name in OWN_LAUNCH)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        main = {how: pool.submit(_launch, dirs[how], how) for how in hows}
        own = [
            pool.submit(_launch, tmp_path_factory.mktemp("harm-env-own"), "env", group)
            for group in groups
        ]
        for how in hows:
            out[how] = main[how].result()
            out[how + "_dir"] = dirs[how]
        for group, future in zip(groups, own, strict=True):
            got = future.result()
            for rank in range(NPROC):
                out["env"][rank].update({name: got[rank][name] for name in group})
    return out


def _corrupted(per_rank: list[list[int]]) -> bool:
    union = [i for items in per_rank for i in items]
    return len(set(union)) != len(union) or not union


def _truth(runs: dict[str, Any], scenario: str) -> list[bool]:
    """Per epoch: is the partition corrupted (duplicates or missing samples)?"""
    res = runs["none"]
    epochs = len(res[0][scenario]["epochs"])
    return [
        _corrupted([res[r][scenario]["epochs"][e] for r in range(NPROC)]) for e in range(epochs)
    ]


def test_unaudited_run_never_imports_rngaudit(runs: dict[str, Any]) -> None:
    assert runs["none"][0]["_meta"]["rngaudit_imported"] is False


@pytest.mark.parametrize("scenario", [*MUST_RAISE, *MUST_STAY_CLEAN])
def test_scenario_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    truth = _truth(runs, scenario)
    if scenario in MUST_RAISE:
        first = MUST_RAISE[scenario]
        assert truth[first] and not any(truth[:first]), truth
    else:
        assert not any(truth), truth


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", [*MUST_RAISE, *MUST_STAY_CLEAN])
def test_verdict_matches_the_measured_partition(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    truth = _truth(runs, scenario)
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert "crashed" not in res, res.get("crashed")
        if any(truth):
            first = truth.index(True)
            assert res["raised"], f"rank {rank}: corrupted at epoch {first} but no raise"
            assert res["error_type"] == "RNGDivergenceError", res
            # raised before the first corrupted epoch's first batch reached the user
            raised_epoch = -1 if res["raised_at"] == "set-up" else int(res["raised_at"].split()[1])
            assert raised_epoch <= first, res["raised_at"]
            assert len(res["epochs"]) <= first
            expected = "dataset-divergence" if scenario in DATASET else "sampler-draw-divergence"
            if scenario in AT_EPOCH_END:  # when the rank drew the epoch's last index batch
                expected = "partition-overlap"
                assert res["raised_at"] == f"epoch {first}", res["raised_at"]
                assert res["items_at_raise"] == len(runs["none"][rank][scenario]["epochs"][first])
            elif scenario in AT_FIRST_STEP:  # in the first training step's forward
                expected = "partition-overlap"
                assert res["raised_at"] == f"epoch {first}", res["raised_at"]
                assert res["steps_at_raise"] == 0, res
            elif scenario in AS_DRAWN:  # in a later training step's forward (measured below)
                expected = "partition-overlap"
                assert res["raised_at"] == f"epoch {first}", res["raised_at"]
                assert 0 < res["steps_at_raise"] < runs["none"][rank][scenario]["steps"][first]
            elif res["raised_at"] == f"epoch {first}":  # before its first batch reached the loop
                assert res["items_at_raise"] == 0, res
            assert expected in res["kinds"], res["kinds"]
        else:
            assert not res["raised"], f"rank {rank}: {res.get('message')}"


@pytest.mark.parametrize("how", HOWS)
def test_auditing_changes_no_partition(runs: dict[str, Any], how: str) -> None:
    """Every epoch trained before any raise holds the same items as without rngaudit."""
    for scenario in [*MUST_RAISE, *MUST_STAY_CLEAN, *INTENDED_OVERLAP]:
        for rank in range(NPROC):
            audited = runs[how][rank][scenario]["epochs"]
            plain = runs["none"][rank][scenario]["epochs"]
            assert audited == plain[: len(audited)], (scenario, rank)
            if scenario not in MUST_RAISE:
                assert len(audited) == len(plain)


@pytest.mark.parametrize("how", HOWS)
def test_messages_name_what_to_fix(runs: dict[str, Any], how: str) -> None:
    res = runs[how][0]
    default = res["user_sampler_default_loader"]["message"]
    draw = next(  # the line of the sampler's draw, wherever edits move it
        i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
        if "perm = torch.randperm(self.n)  # no generator" in line
    )  # fmt: skip
    assert "TorchPermSampler" in default and f"harm_scenarios.py:{draw}" in default
    assert "aten.randperm" in default and "torch.default_generator" in default
    assert "`generator` attribute" in default
    seeds = res["ds_seed_per_rank"]["message"]
    assert "seed differs across ranks (rank 0: 0; rank 1: 1)" in seeds
    assert "same seed=" in seeds
    epoch = res["set_epoch_differs"]["message"]
    assert "epoch 1" in epoch and "set_epoch" in epoch
    numpy_msg = res["user_numpy_sampler_stateful"]["message"]
    assert "NumpyPermSampler" in numpy_msg and "numpy.random" in numpy_msg
    assert "random_split" in res["random_split_per_rank"]["message"]


def test_forgotten_set_epoch_warns(runs: dict[str, Any]) -> None:
    plain = runs["none"][0]["set_epoch_forgotten"]["epochs"]
    assert plain[0] == plain[1]  # the truth: the same order twice
    for how in HOWS:
        merged = json.loads((runs[how + "_dir"] / "report" / "report.json").read_text())
        kinds = [f for f in merged["findings"] if f["kind"] == "epoch-order-repeated"]
        assert kinds, how
        assert all(f["severity"] == "warning" for f in kinds)
        assert all("set_epoch" in f["remedy"] for f in kinds)
    correct = runs["none"][0]["set_epoch_correct"]["epochs"]
    assert correct[0] != correct[1]


@pytest.mark.parametrize("how", HOWS)
def test_the_observed_overlap_is_the_measured_one(runs: dict[str, Any], how: str) -> None:
    """The partition check counts what the ranks were really handed: its numbers are the
    overlap and the gap measured without rngaudit (epoch 1 of a sampler that shards itself,
    after a rank-0-only evaluation; every sample on every rank under DDP)."""
    plain = [set(runs["none"][r]["self_sharding_rank0_eval"]["epochs"][1]) for r in range(2)]
    shared, never = len(plain[0] & plain[1]), 32 - len(plain[0] | plain[1])
    assert shared > 1  # the scenario's claim, measured
    message = runs[how][0]["self_sharding_rank0_eval"]["message"]
    assert f"{shared} of 32 samples went to more than one rank, and {never} of them to none" in (
        message
    )
    assert "An earlier epoch of this loader partitioned the data exactly" in message
    whole = [set(runs["none"][r]["ddp_shuffled_no_sampler"]["epochs"][0]) for r in range(2)]
    assert whole[0] == whole[1] == set(range(32))
    message = runs[how][0]["ddp_shuffled_no_sampler"]["message"]
    assert "every rank was handed the same 32 samples of 32" in message
    assert "2-fold duplication" in message and "DistributedSampler" in message


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", sorted(AT_FIRST_STEP))
def test_unsharded_loaders_raise_before_the_first_training_step(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """The corrupted epoch is raised in the DDP module's first training forward on it: every
    rank got its first batch, and no rank completed a step on it (without rngaudit, each rank
    completes every step of that epoch: the truth)."""
    first = _truth(runs, scenario).index(True)
    for rank in range(NPROC):
        plain = runs["none"][rank][scenario]
        assert plain["steps"][first] > 0 and len(plain["epochs"][first]) > 0
        res = runs[how][rank][scenario]
        assert res["raised_at"] == f"epoch {first}", res
        assert res["steps_at_raise"] == 0, res  # no training step on the corrupted epoch
        assert res["steps"] == plain["steps"][:first]  # the epochs before: every step
        assert 0 < res["items_at_raise"] < len(plain["epochs"][first])  # its first batch only
        assert "before the first training step" in res["message"]


@pytest.mark.parametrize("how", HOWS)
def test_a_lazy_samplers_first_batches_are_the_measured_ones(
    runs: dict[str, Any], how: str
) -> None:
    """A sampler that yields lazily cannot be read ahead: its first batches, which a partition
    would keep disjoint, share the samples measured without rngaudit."""
    scenario = "self_sharding_lazy_rank0_eval"
    firsts = [set(runs["none"][r][scenario]["epochs"][1][:8]) for r in range(NPROC)]
    shared = len(firsts[0] & firsts[1])
    assert shared > NPROC - 1  # the claim, measured: more than padding could explain
    message = runs[how][0][scenario]["message"]
    assert f"the first batches the ranks are about to train on share {shared} samples" in message
    assert "its sampler yields lazily" in message


def _batches(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", sorted(AS_DRAWN))
def test_a_lazy_epoch_is_compared_as_it_is_drawn_at_the_measured_step(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """Its first batches do not overlap (measured): what each rank was handed is published at
    training steps 2, 4, 8, ... and compared before the next; the raise comes before the step
    after the first such count whose batches overlap beyond padding, measured without
    rngaudit, with the measured count, and never later."""
    first = MUST_RAISE[scenario]
    size = AS_DRAWN[scenario]
    plain = [_batches(runs["none"][r][scenario]["epochs"][first], size) for r in range(NPROC)]
    total = len(plain[0])
    least = NPROC if first > 0 else NOT_BY_REPLACEMENT  # epoch 0: no earlier partition

    def shared(k: int) -> int:
        taken = [{i for b in batches[:k] for i in b} for batches in plain]
        return len(set.intersection(*taken))

    assert shared(1) == 0  # the claim: the first batches the ranks train on are disjoint
    due = 2
    while due < total and shared(due) < least:
        due *= 2
    assert due < total, "the measured overlap comes too late for this scenario to show it"
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert res["raised_at"] == f"epoch {first}", res
        assert res["steps_at_raise"] == due, (res["steps_at_raise"], due)
        assert res["steps"] == runs["none"][rank][scenario]["steps"][:first]
        assert (
            f"the first {due} batches each rank was handed share {shared(due)} samples"
            in res["message"]
        ), res["message"]
        assert f"Found before training step {due + 1} of the epoch" in res["message"]


@pytest.mark.parametrize("how", HOWS)
def test_nothing_stays_on_the_forward_path(runs: dict[str, Any], how: str) -> None:
    """The first-step comparison's pre-hook is removed once it fired: after training, the DDP
    models of the intact scenarios carry no forward pre-hook (nor did they unaudited)."""
    ddp = [
        n for n in [*MUST_STAY_CLEAN, *INTENDED_OVERLAP] if "forward_pre_hooks" in runs[how][0][n]
    ]
    assert {"ddp_presharded_files", "self_sharding_rank0_eval_own_generator"} <= set(ddp)
    for scenario in ddp:
        for rank in range(NPROC):
            assert runs[how][rank][scenario]["forward_pre_hooks"] == 0, (scenario, rank)
            assert runs["none"][rank][scenario]["forward_pre_hooks"] == 0


@pytest.mark.parametrize("how", HOWS)
def test_a_big_roots_overlap_is_estimated_within_its_bound(runs: dict[str, Any], how: str) -> None:
    """Over a root of 3M samples the sketch says how many samples every rank shared: an
    estimate whose stated bound holds the count measured without rngaudit."""
    import re

    plain = [set(runs["none"][r]["ddp_big_root_no_sampler"]["epochs"][0]) for r in range(2)]
    assert plain[0] == plain[1] and len(plain[0]) == 2048  # the truth: the same samples
    message = runs[how][0]["ddp_big_root_no_sampler"]["message"]
    found = re.search(r"handed the same about ([\d,]+) \(± ([\d,]+)\) samples of 3000000", message)
    assert found, message
    estimate, spread = (int(g.replace(",", "")) for g in found.groups())
    assert abs(estimate - 2048) <= spread
    from rngaudit.capture import sketch

    assert abs(estimate - 2048) <= sketch.bound(2048, 3_000_000), message
    assert "hash sample of 1 in" in message and "2-fold duplication" in message


def test_an_epoch_published_before_the_others_is_compared_when_the_group_goes(
    runs: dict[str, Any],
) -> None:
    """Rank 0 drew its one epoch before rank 1 began it (no collective between them): rank 1
    compares it at its end and raises; rank 0, which has no later epoch, is told when the
    process group is destroyed, with the overlap measured unaudited. An error with no
    data-parallel module: the sampler holds each rank's rank and the world size (it is there
    to split the data)."""
    plain = [set(runs["none"][r]["unsynced_single_epoch"]["epochs"][0]) for r in range(2)]
    shared, never = len(plain[0] & plain[1]), 40 - len(plain[0] | plain[1])
    assert shared > 1  # the scenario's claim, measured
    counts = f"{shared} of 40 samples went to more than one rank, and {never} of them to none"
    for how in HOWS:
        first = runs[how][0]["unsynced_single_epoch"]
        assert not first["raised"], first  # it drew its epoch before rank 1 announced it
        assert first["epochs"] == runs["none"][0]["unsynced_single_epoch"]["epochs"], first
        second = runs[how][1]["unsynced_single_epoch"]
        assert second["raised"] and second["kinds"] == ["partition-overlap"], second
        assert counts in second["message"] and second["items_at_raise"] == 20, second
        at_exit = json.loads((runs[how + "_dir"] / "exit-rank0.json").read_text())
        assert counts in str(at_exit["raised"]), at_exit
        assert not [w for w in at_exit["warnings"] if " of 40 samples " in w], at_exit
    none = json.loads((runs["none_dir"] / "exit-rank0.json").read_text())
    assert none == {"raised": None, "warnings": [], "log": []}


def test_a_rank_that_left_its_epoch_early_is_compared_when_the_group_goes(
    runs: dict[str, Any],
) -> None:
    """Rank 1 took two batches of its share and left (a break); rank 0 drew all of its own:
    what rank 1 took is compared with rank 0's epoch when the group goes (disjoint shares of
    one permutation, measured: nothing said, nobody named)."""
    plain = [runs["none"][r]["unsynced_left_early"]["epochs"][0] for r in range(2)]
    assert len(plain[0]) == 22 and len(plain[1]) == 8  # the truth: rank 1 left after 2 of 6
    assert not set(plain[0]) & set(plain[1])
    for how in HOWS:
        for rank in range(NPROC):
            res = runs[how][rank]["unsynced_left_early"]
            assert not res["raised"] and res["epochs"][0] == plain[rank], res
            at_exit = json.loads((runs[how + "_dir"] / f"exit-rank{rank}.json").read_text())
            assert " of 44 samples " not in str(at_exit["raised"]), at_exit  # others' raise
            assert not [line for line in at_exit["log"] if "was not compared" in line], at_exit
            assert not [w for w in at_exit["warnings"] if " of 44 samples " in w]


# Every rank leaves each epoch after a few batches: scenario -> an error (True) or clean. The
# truth is what each rank trained on before it left, measured without rngaudit.
LEFT_EARLY = {
    "ddp_lazy_self_shard_left_early": True,
    "ddp_lazy_self_shard_left_early_twin": False,
    "left_early_at_different_batches": False,
    "rank0_alone_left_early": False,
}
LEFT_LENGTH = {  # the index batches of one rank's whole epoch, and of the root
    "ddp_lazy_self_shard_left_early": (6, 48),
    "ddp_lazy_self_shard_left_early_twin": (6, 48),
    "left_early_at_different_batches": (7, 50),
    "rank0_alone_left_early": (5, 36),
    "left_early_last_epoch_per_rank_seed": (7, 52),
}


def _left_shared(runs: dict[str, Any], scenario: str, epoch: int) -> int:
    plain = [set(runs["none"][r][scenario]["epochs"][epoch]) for r in range(NPROC)]
    return len(plain[0] & plain[1])


@pytest.mark.parametrize("scenario", list(LEFT_LENGTH))
def test_an_epoch_left_early_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    """Unaudited: every rank that iterates leaves each epoch before its end, and the ranks'
    partial shares overlap beyond padding exactly where an error is claimed."""
    length, _ = LEFT_LENGTH[scenario]
    for rank in range(NPROC):
        for items in runs["none"][rank][scenario]["epochs"]:
            assert len(items) < 4 * length  # batches of 4: the epoch was left early
    overlaps = [_left_shared(runs, scenario, e) for e in range(2 if scenario in LEFT_EARLY else 1)]
    if LEFT_EARLY.get(scenario, True):
        assert overlaps[0] > NPROC - 1, overlaps  # more than padding, in the first epoch
    else:
        assert overlaps == [0] * len(overlaps), overlaps


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", list(LEFT_EARLY))
def test_an_epoch_left_early_is_compared_as_measured(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """Under DDP, an overlap of what the ranks took before they left is an error, raised at the
    loader's next epoch (before its first batch) with the overlap measured unaudited; the
    twins stay clean, and the ranks train the batches they train unaudited."""
    length, size = LEFT_LENGTH[scenario]
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        plain = runs["none"][rank][scenario]["epochs"]
        assert "crashed" not in res, res.get("crashed")
        assert res["epochs"] == plain[: len(res["epochs"])], (scenario, rank)
        if not LEFT_EARLY[scenario]:
            assert not res["raised"], f"rank {rank}: {res.get('message')}"
            assert len(res["epochs"]) == len(plain)
            continue
        assert res["raised"] and res["error_type"] == "RNGDivergenceError", res
        assert res["raised_at"] == "epoch 1" and res["items_at_raise"] == 0, res
        assert "partition-overlap" in res["kinds"]
        taken = [len(runs["none"][r][scenario]["epochs"][0]) // 4 for r in range(NPROC)]
        assert (
            f"(BatchSampler > LazyRankShardSampler, sharded by no DistributedSampler) was left "
            f"early: rank 0 after {taken[0]} of {length} batches, rank 1 after {taken[1]}: by "
            f"then {_left_shared(runs, scenario, 0)} of {size} samples had gone to more than "
            "one rank"
        ) in res["message"], res["message"]
        assert res["message"].split("] ", 1)[1].startswith("Epoch 0 of ")
        assert "to none" not in res["message"]


def test_an_epoch_every_rank_left_is_compared_when_the_group_goes(runs: dict[str, Any]) -> None:
    """The launch's last epoch of a loader, left early by every rank, is compared when the
    process group is destroyed, with the overlap measured unaudited: an error there, with no
    data-parallel module (its sampler holds each rank's rank and the world size: it is there
    to split the data). A loader rank 0 alone iterated and left is never compared, nor waited
    for."""
    scenario = "left_early_last_epoch_per_rank_seed"
    shared = _left_shared(runs, scenario, 0)
    said = f"rank 0 after 3 of 7 batches, rank 1 after 3: by then {shared} of 52 samples"
    for how in HOWS:
        for rank in range(NPROC):
            at_exit = json.loads((runs[how + "_dir"] / f"exit-rank{rank}.json").read_text())
            assert at_exit["raised"], at_exit  # the first error of those compared there
            assert not [w for w in at_exit["warnings"] if " of 52 samples " in w], at_exit
            assert not [w for w in at_exit["warnings"] if " of 36 samples " in w]
            assert not [line for line in at_exit["log"] if "was not compared" in line]
            waited = runs[how][rank]["rank0_alone_left_early"]["waited"]
            assert not waited, waited
        merged = json.loads((runs[how + "_dir"] / "report" / "report.json").read_text())
        found = [f for f in merged["findings"] if said in f["message"]]
        assert [f["severity"] for f in found] == ["error"], found  # every error is reported


@pytest.mark.parametrize("how", HOWS)
def test_a_rank0_only_loader_is_never_waited_for(runs: dict[str, Any], how: str) -> None:
    """The evaluation loader rank 0 alone iterates between epochs is never compared or waited
    for (the training loader every rank iterates is waited for at an epoch's end when every
    rank has announced that epoch or iterated the loader before: timing, not asserted)."""
    for scenario in ("self_sharding_rank0_eval", "self_sharding_rank0_eval_own_generator"):
        for rank in range(NPROC):
            waited = runs[how][rank][scenario]["waited"]
            assert not any(k.startswith("DataLoader over Items(len=8)") for k in waited), waited
    waited = [runs[how][r]["self_sharding_rank0_eval"]["waited"] for r in range(NPROC)]
    assert any(waited), waited  # the training loader's epoch 0: every rank announced it
    assert not runs[how][0]["self_sharding_rank0_eval_own_generator"]["raised"]


@pytest.mark.parametrize("scenario", list(INTENDED_OVERLAP))
def test_intended_overlap_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    epochs = [runs["none"][r][scenario]["epochs"] for r in range(NPROC)]
    for e in range(len(epochs[0])):
        per_rank = [epochs[r][e] for r in range(NPROC)]
        assert _corrupted(per_rank)  # the ranks overlap, measured
        why = INTENDED_OVERLAP[scenario]
        if why == "identical":
            assert all(sorted(p) == sorted(per_rank[0]) for p in per_rank)
        elif why == "repeats":
            assert all(len(set(p)) < len(p) for p in per_rank)
        elif why == "chance":  # no rank repeats; together they took under 1 % of the root
            assert all(len(set(p)) == len(p) for p in per_rank)
            assert len({i for p in per_rank for i in p}) * 100 < 1_000_000
        else:  # padding: world - 1 samples twice, nothing missing
            union = [i for p in per_rank for i in p]
            assert len(union) - len(set(union)) == NPROC - 1 and len(set(union)) == N + 1


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", list(INTENDED_OVERLAP))
def test_intended_overlap_is_never_an_error(runs: dict[str, Any], how: str, scenario: str) -> None:
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert "crashed" not in res, res.get("crashed")
        assert not res["raised"], f"rank {rank}: {res.get('message')}"


SUBCLASS_AT_FIRST_BATCH = [
    "ds_subclass_global_shuffle",  # its __iter__ returns iter(list)
    "ds_subclass_yield_from_global_shuffle",  # a generator __iter__: yield from the share
]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", SUBCLASS_AT_FIRST_BATCH)
def test_a_subclass_shuffling_from_the_global_generator_raises_at_the_first_batch(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """Its seed and epoch agree; the order its __iter__ drew (from per-rank global state) does
    not: the error comes before the first batch reaches the loop, naming the draw."""
    plain = [set(runs["none"][r][scenario]["epochs"][0]) for r in range(2)]
    assert plain[0] & plain[1]  # the truth: overlapping shares
    for rank in range(NPROC):
        res = runs[how][rank][scenario]
        assert res["raised_at"] == "epoch 0" and res["items_at_raise"] == 0, res
        assert "drew the order it shards from generator state that differs" in res["message"]
        assert "aten.randperm" in res["message"] and "torch.default_generator" in res["message"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", SUBCLASS_AT_FIRST_BATCH)
def test_a_subclass_error_at_the_first_batch_counts_the_measured_overlap(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    """The draws alone are no verdict: the shares each rank's sampler returned (a list, or
    the list a generator yields from) are read before the first batch and their overlap is the
    one measured without rngaudit; a subclass that orders a fixed share of its own from the
    same per-rank state is intact and stays clean (test_verdict_matches_the_measured_partition);
    one whose loop yields item by item gets a warning first."""
    plain = [set(runs["none"][r][scenario]["epochs"][0]) for r in range(2)]
    shared, never = len(plain[0] & plain[1]), N - len(plain[0] | plain[1])
    message = runs[how][0][scenario]["message"]
    assert (
        f"Measured before the first batch, from the epoch each rank's sampler returned: "
        f"{shared} of {N} samples are in more than one rank's share and {never} in none"
    ) in message
    merged = json.loads((runs[how + "_dir"] / "report" / "report.json").read_text())
    lazy = [
        f
        for f in merged["findings"]
        if f["kind"] == "sampler-draw-divergence" and "LazyGlobalShuffle" in f["message"]
    ]
    assert lazy and all(f["severity"] == "warning" for f in lazy), lazy
    assert all("measures what each rank was handed" in f["message"] for f in lazy)
    own = [f for f in merged["findings"] if "OwnShareOrder" in f["message"]]
    assert not own, own


@pytest.mark.parametrize("how", HOWS)
def test_the_datasets_overlap_is_the_measured_one(runs: dict[str, Any], how: str) -> None:
    """Per-rank shards drawn from per-rank orders: the window's comparison of the datasets the
    ranks built counts the overlap and the gap measured without rngaudit."""
    scenario = "spawn_style_shards_per_rank_seed"
    plain = [set(runs["none"][r][scenario]["epochs"][0]) for r in range(2)]
    shared, never = len(plain[0] & plain[1]), 32 - len(plain[0] | plain[1])
    assert shared > 1
    res = runs[how][0][scenario]
    assert res["raised_at"] == "set-up" if how == "block" else res["raised_at"] == "epoch 0"
    assert (
        f"{shared} of 32 root samples are in more than one rank's dataset and {never} in none"
        in res["message"]
    )


def test_a_per_rank_map_augmentation_is_a_warning_that_says_so(runs: dict[str, Any]) -> None:
    """Per-rank content (``.map()`` seeded per rank) with the same samples: intact (measured in
    test_scenario_is_what_it_claims), so at most a warning naming the content, never an error."""
    for how in HOWS:
        merged = json.loads((runs[how + "_dir"] / "report" / "report.json").read_text())
        content = [f for f in merged["findings"] if f["kind"] == "dataset-content-divergence"]
        assert content, how
        assert all(f["severity"] == "warning" for f in content)
        assert all("partition is intact" in f["message"] for f in content)


@pytest.mark.parametrize("how", HOWS)
def test_every_rank_leaves_its_report(runs: dict[str, Any], how: str) -> None:
    report = runs[how + "_dir"] / "report"
    for name in ("rank-0.json", "rank-1.json", "report.json"):
        assert (report / name).is_file(), name
    merged = json.loads((report / "report.json").read_text())
    assert merged["verdict"] == "error"
    assert merged["world_size"] == NPROC
    kinds = {f["kind"] for f in merged["findings"]}
    assert {"sampler-draw-divergence", "dataset-divergence"} <= kinds
    # a loader only rank 0 iterates (rank0_only_eval_loader) is never exchanged: nobody waited
    assert "rank-missing" not in kinds


@pytest.fixture(scope="module")
def slurm_style(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any]]:
    """One process per rank started directly, the rank read from the environment (as SLURM's
    srun does): no torchrun, no launcher process at all, RNGAUDIT=1 exported."""
    import socket

    outdir = tmp_path_factory.mktemp("harm-slurm")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    only = "ds_seed_per_rank,set_epoch_correct"
    procs = []
    for rank in range(NPROC):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(NPROC),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore", RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(outdir / "report"),
        )  # fmt: skip
        cmd = [sys.executable, str(SCRIPT), str(outdir), "--how", "env", "--only", only]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    results = {r: json.loads((outdir / f"result-rank{r}.json").read_text()) for r in range(NPROC)}
    return outdir, results


def test_slurm_style_ranks_are_audited(
    runs: dict[str, Any], slurm_style: tuple[Path, dict[int, Any]]
) -> None:
    outdir, results = slurm_style
    assert any(_truth(runs, "ds_seed_per_rank")) and not any(_truth(runs, "set_epoch_correct"))
    for rank in range(NPROC):
        assert results[rank]["ds_seed_per_rank"]["raised"], rank
        assert not results[rank]["set_epoch_correct"]["raised"], rank
        assert (
            results[rank]["set_epoch_correct"]["epochs"]
            == (runs["none"][rank]["set_epoch_correct"]["epochs"])
        )
    names = sorted(p.name for p in (outdir / "report").iterdir() if p.is_file())
    assert names == ["rank-0.json", "rank-1.json", "report.json"]


@pytest.mark.parametrize("how", HOWS)
def test_same_indices_with_different_content_is_a_warning_that_says_so(
    runs: dict[str, Any], how: str
) -> None:
    """ddp_rank_part_in_getitem: every rank draws the same indices, its dataset maps them to
    the rank's own part (intact, measured by the items): never an error, but said, since a
    per-rank augmentation of the same samples would look the same."""
    res = runs["none"]
    items = [set(i for e in res[r]["ddp_rank_part_in_getitem"]["epochs"] for i in e)
             for r in range(NPROC)]  # fmt: skip
    assert not set.intersection(*items)  # the truth: the ranks' items are disjoint
    merged = json.loads((runs[how + "_dir"] / "report" / "report.json").read_text())
    said = [f for f in merged["findings"] if f.get("details", {}).get("content_differs")]
    assert said, how
    assert all(f["severity"] == "warning" for f in said)
    assert all("picks its part by rank" in f["message"] for f in said)


# Iterable streams of the user's own, keyed by the sample id (tests/keyed_checks.py; the same
# checks at three ranks in tests/test_odd_rank.py).
@pytest.mark.parametrize("scenario", keyed_checks.SCENARIOS)
def test_keyed_scenario_is_what_it_claims(runs: dict[str, Any], scenario: str) -> None:
    keyed_checks.check_truth(runs, scenario)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", keyed_checks.SCENARIOS)
def test_keyed_verdict_matches_the_measured_ids(
    runs: dict[str, Any], how: str, scenario: str
) -> None:
    keyed_checks.check_verdict(runs, how, scenario)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", ["keyed_seed_per_rank", "keyed_workers_seed_per_rank"])
def test_keyed_counts_are_the_measured_ones(runs: dict[str, Any], how: str, scenario: str) -> None:
    keyed_checks.check_counts(runs, how, scenario)


@pytest.mark.parametrize("how", HOWS)
def test_a_keyed_loader_one_rank_iterates_is_never_waited_for(
    runs: dict[str, Any], how: str
) -> None:
    keyed_checks.check_alone(runs, how)
