"""The keyed-stream scenarios' checks, shared by the world-2 and the world-3 launches.

The scenarios (``keyed_*`` in tests/distributed/harm_scenarios.py) run in the launches of
tests/test_harm_matrix.py (2 ranks) and tests/test_odd_rank.py (3 ranks, the last one odd):
without rngaudit (the truth: the ids each rank trained on), with ``rngaudit.sample_key`` in an
``audit()`` block, and under ``RNGAUDIT=1 RNGAUDIT_SAMPLE_KEY=id`` (no code change).
"""

from __future__ import annotations

from typing import Any

BATCH = {"keyed_left_early": 2}  # the loaders' batch size (4 elsewhere)
CORRUPTED = {  # scenario -> the epoch whose verdict raises (left early: compared at the next)
    "keyed_seed_per_rank": "epoch 0",
    "keyed_workers_seed_per_rank": "epoch 0",
    "keyed_left_early": "epoch 1",
    "keyed_ddp_no_split": "epoch 0",  # at the DDP module's first training forward
}
CLEAN = [
    "keyed_shared_seed",
    "keyed_workers_shared_seed",
    "keyed_presharded",
    "keyed_per_rank_augment",
    "keyed_one_rank_alone",
    "keyed_ddp_shared_seed",
]
SCENARIOS = [*CORRUPTED, *CLEAN]
# the launch order (tests/distributed/harm_scenarios.py KEYED): the loader one rank iterates
# alone last (under RNGAUDIT_SAMPLE_KEY it moves the iteration order later loaders match by)
ORDER = [s for s in SCENARIOS if s != "keyed_one_rank_alone"] + ["keyed_one_rank_alone"]


def overlap(runs: dict[str, Any], scenario: str, epoch: int) -> tuple[int, list[int], int]:
    """Measured unaudited: the ids more than one rank trained on, each rank's distinct ids
    (the ranks that iterated), and the distinct ids of all."""
    plain = [runs["none"][r][scenario]["epochs"] for r in sorted(k for k in runs["none"])]
    shares = [set(p[epoch]) for p in plain if len(p) > epoch and p[epoch]]
    union = set().union(*shares)
    shared = sum(1 for i in union if sum(i in s for s in shares) > 1)
    return shared, [len(s) for s in shares], len(union)


def corrupted(runs: dict[str, Any], scenario: str, epoch: int) -> bool:
    """The truth: ids shared by ranks beyond one round of padding (world x batch size)."""
    world = len(runs["none"])
    return overlap(runs, scenario, epoch)[0] > world * BATCH.get(scenario, 4)


def check_truth(runs: dict[str, Any], scenario: str) -> None:
    world = len(runs["none"])
    truth = [corrupted(runs, scenario, e) for e in range(2)]
    assert truth[0] == (scenario in CORRUPTED), (scenario, truth, overlap(runs, scenario, 0))
    if scenario == "keyed_one_rank_alone":  # the last rank alone took the whole stream
        epochs = [runs["none"][r][scenario]["epochs"] for r in range(world)]
        assert all(e == [[], []] for e in epochs[:-1]) and len(set(epochs[-1][0])) == 96
    if scenario == "keyed_per_rank_augment":  # the same ids as its twin, content of its own
        for r in range(world):
            assert (
                runs["none"][r][scenario]["epochs"]
                == runs["none"][r]["keyed_shared_seed"]["epochs"]
            )
    if scenario == "keyed_left_early":
        assert all(len(runs["none"][r][scenario]["epochs"][0]) == 40 for r in range(world))


def check_verdict(runs: dict[str, Any], how: str, scenario: str) -> None:
    """Every rank's verdict is the truth's; the audited run took the batches the unaudited one
    took (the auditor changes nothing it audits)."""
    for rank in sorted(runs[how]):
        res, plain = runs[how][rank][scenario], runs["none"][rank][scenario]
        assert "crashed" not in res, res.get("crashed")
        assert res["epochs"] == plain["epochs"][: len(res["epochs"])], (rank, scenario)
        if scenario in CORRUPTED:
            assert res["raised"], f"rank {rank}: {scenario} did not raise"
            assert res["kinds"] == ["partition-overlap"], res["kinds"]
            assert res["raised_at"] == CORRUPTED[scenario], res
            epoch = int(CORRUPTED[scenario].split()[1])
            if scenario == "keyed_left_early":  # at epoch 1's first batch, before the loop
                assert res["items_at_raise"] == 0, res
            elif scenario == "keyed_ddp_no_split":  # the first batch, before its step
                assert plain["steps"][0] == 24  # unaudited: every step of the epoch
                assert res["items_at_raise"] == 4 and res["steps_at_raise"] == 0, res
                assert "first batches of epoch 0" in res["message"], res["message"]
                assert "before the first training step" in res["message"]
            else:  # the epoch's end: its whole share drawn
                assert res["items_at_raise"] == len(plain["epochs"][epoch]), res
        else:
            assert not res["raised"], f"rank {rank}: {res.get('message')}"
            assert len(res["epochs"]) == len(plain["epochs"]) == 2


def check_counts(runs: dict[str, Any], how: str, scenario: str) -> None:
    """The message's counts are the ones measured unaudited."""
    shared, per_rank, union = overlap(runs, scenario, 0)
    took = ", ".join(f"rank {r} took {n}" for r, n in enumerate(per_rank))
    says = f"{shared} samples (by key 'id') went to more than one rank; {took}, {union} distinct"
    for rank in sorted(runs[how]):
        assert says in runs[how][rank][scenario]["message"], (says, runs[how][rank][scenario])


def check_alone(runs: dict[str, Any], how: str) -> None:
    """A keyed loader only the last rank iterates is never compared or waited for."""
    last = max(runs[how])
    res = runs[how][last]["keyed_one_rank_alone"]
    assert not res["raised"] and len(res["epochs"][0]) == 96, res
    for rank in sorted(runs[how]):
        assert runs[how][rank]["keyed_one_rank_alone"]["waited"] == {}, rank
    # the loaders every rank iterates in lockstep are waited for at their ends: timing shows it
    assert any(runs[how][r]["keyed_shared_seed"]["waited"] for r in runs[how])
