"""The one verdict on partition harm: its allowance table, its decision, the causes that convict."""

from __future__ import annotations

from typing import Any

from rngaudit import verdict


def seen(shared: int, union: int, root: int = 22, repeats: int = 0) -> dict[str, Any]:
    return {"root_size": root, "shared": shared, "union": union,
            "per_rank": {0: 12, 1: 12}, "repeats": {0: repeats, 1: 0}}  # fmt: skip


def beyond(seen: dict[str, Any], world: int, sharding: verdict.Sharding = verdict.UNKNOWN) -> bool:
    """No allowance explains the overlap: the first question of verdict.decide."""
    return verdict.allowed_as(seen, world, sharding) is None


def test_every_allowance_named_is_in_the_table() -> None:
    names = {name for name, _ in verdict.ALLOWANCES}
    rounds = verdict.Sharding(rounds=8)
    cases = [seen(1, 22), seen(2, 21, repeats=3), seen(2, 22)]
    got = {verdict.allowed_as(s, 2, rounds) for s in cases}
    assert got == {"DistributedSampler padding", "independent draws with replacement",
                   "accelerate even_batches"}  # fmt: skip
    assert got <= names
    assert verdict.allowed_as(seen(0, 20), 2) == "nothing shared"


def test_even_batches_padding_is_allowed_only_where_the_sharder_pads_by_rounds() -> None:
    # measured in accelerate's own test_distributed_data_loop: 22 samples, batch 4, world 2
    padded = seen(2, 22)
    assert beyond(padded, 2)  # no known sharder: 2 shared at world 2 is beyond padding
    assert not beyond(padded, 2, verdict.Sharding(rounds=8))


def test_even_batches_allowance_never_covers_a_dropped_sample_or_more_than_a_round() -> None:
    rounds = verdict.Sharding(rounds=8)
    assert beyond(seen(2, 21), 2, rounds)  # a sample no rank took: different orders
    assert beyond(seen(9, 22), 2, rounds)  # more than one round shared
    estimated = {**seen(2, 22), "estimated": True, "shared_proven": 2}
    assert beyond(estimated, 2, rounds)  # a sketch cannot show that none was dropped


def test_even_batches_over_a_subset_counts_the_samples_its_order_holds() -> None:
    # generated config w2-s7-01: a Subset of 15 of a 30-sample root, batch 3, world 2:
    # accelerate re-hands 3 samples; the 15 outside the Subset were never the loader's
    over_subset = seen(3, 15, root=30)
    assert beyond(over_subset, 2, verdict.Sharding(rounds=6))  # unknown cover: the root
    assert not beyond(over_subset, 2, verdict.Sharding(rounds=6, covers=15))
    assert beyond(seen(3, 14, root=30), 2, verdict.Sharding(rounds=6, covers=15))  # 1 dropped


def _taken(shared: int, union: int, scope: Any = "epoch", identical: bool = False) -> Any:
    return verdict.Taken({**seen(shared, union), "identical": identical}, 2, scope)


def test_one_decision_for_every_trigger_and_the_evidence_it_needs() -> None:
    beyond = _taken(6, 18)
    assert verdict.decide(_taken(1, 22), verdict.Facts(sharded=True)) is None  # padding
    warned = verdict.decide(beyond, verdict.Facts())
    assert warned is not None and warned.severity == "warning"
    assert verdict.decide(_taken(12, 12, identical=True), verdict.Facts()) is None  # replicated
    for facts in (verdict.Facts(sharded=True), verdict.Facts(partitioned_before=True)):
        decided = verdict.decide(beyond, facts)
        assert decided is not None and decided.severity == "error"
    # under a data-parallel module alone: a small overlap with no repeat may be by chance
    assert verdict.decide(_taken(2, 22), verdict.Facts(data_parallel=True)) is None
    # a prefix of a sharder's epoch: sampling with replacement must be ruled out (34 shared)
    assert verdict.decide(_taken(6, 18, "prefix"), verdict.Facts(sharded=True)) is None
    many = verdict.Taken({**seen(40, 200, root=1024)}, 2, "prefix")
    decided = verdict.decide(many, verdict.Facts(sharded=True))
    assert decided is not None and decided.why.startswith("independent draws")
    # the same indices with other content: a warning at most
    unshown = verdict.decide(beyond, verdict.Facts(sharded=True, identity_shown=False))
    assert unshown is not None and unshown.severity == "warning"


def test_ids_of_a_declared_key_allow_one_round_and_warn_when_identical_without_ddp() -> None:
    def taken(shared: int, identical: bool = False, scope: Any = "epoch") -> Any:
        counts = {"shared": shared, "union": 96, "per_rank": {0: 48, 1: 48}}
        return verdict.Taken({**counts, "identical": identical}, 2, scope, by_key=True)

    assert verdict.decide(taken(8), verdict.Facts(key_round=8)) is None
    decided = verdict.decide(taken(9), verdict.Facts(key_round=8))
    assert decided is not None and decided.severity == "error"
    same = verdict.decide(taken(48, identical=True), verdict.Facts(key_round=8))
    assert same is not None and same.severity == "warning"
    same = verdict.decide(taken(48, identical=True), verdict.Facts(key_round=8, data_parallel=True))
    assert same is not None and same.severity == "error"
    first = verdict.decide(taken(1, scope="prefix"), verdict.Facts())
    assert first is not None and first.severity == "error"


def test_only_the_named_causes_convict_alone() -> None:
    assert verdict.by_cause("drawn before the sync").severity == "error"
    assert verdict.by_cause("draws").severity == "warning"  # the shares decide
    assert set(verdict.CONVICTING) == {
        "drawn before the sync", "sampler state", "order before sharding", "dataset mapping",
        "resume position",
    }  # fmt: skip


HARM_KINDS = {"PARTITION_OVERLAP", "DATASET_DIVERGENCE", "SAMPLER_DRAW_DIVERGENCE"}
RULE_PARTS = {"allowed_as", "replacement_ruled_out", "by_chance_ruled_out", "_evidence"}


def test_exactly_one_function_decides_partition_harm() -> None:
    """Read statically: no module but verdict.py asks the rule's questions (an allowance, the
    chance of sampling with replacement), and no finding of a partition-harm kind is built with
    a severity of its own: each takes the one verdict's (verdict.decide, or verdict.by_cause
    for a cause that convicts alone)."""
    import ast
    from pathlib import Path

    root = Path(verdict.__file__).parent  # the package
    asked: list[str] = []
    own_severity: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "verdict.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                if name in RULE_PARTS:
                    asked.append(f"{path.name}:{node.lineno} {name}")
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding"):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            kind = keywords.get("kind")
            named = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", "")
            harmful = named in HARM_KINDS or named == "kind"  # a helper's kind: any of them
            if harmful and isinstance(keywords.get("severity"), ast.Constant):
                own_severity.append(f"{path.name}:{node.lineno}")
    assert asked == []
    assert own_severity == []


def test_a_distributed_sampler_pads_no_more_than_its_total_size_holds_beyond_the_data() -> None:
    # generated config w2-s14-03: 8 samples at world 2, a DistributedSampler pads none; one
    # sample on both ranks (per-rank orders) is no padding
    one = seen(1, 7, root=8)
    assert not beyond(one, 2)  # a sampler not known: up to world - 1 may be padding
    assert beyond(one, 2, verdict.Sharding(pads=0))
    assert not beyond(seen(1, 9, root=9), 2, verdict.Sharding(pads=1))  # 9 samples: 1 pad
    assert not beyond(seen(2, 10, root=10), 3, verdict.Sharding(pads=5))  # never over world - 1
    assert beyond(seen(3, 10, root=10), 3, verdict.Sharding(pads=5))


def test_datasets_of_the_ranks_own_pad_only_with_every_sample_taken() -> None:
    # generated config w2-s7-13: per-rank Subsets of 4 of 8 samples, drawn from per-rank
    # orders: one sample on both ranks, one on none; padding completes a round, never drops
    own = verdict.Sharding(covers=8, complete=True)
    assert beyond(seen(1, 7, root=8), 2, own)
    assert not beyond(seen(1, 8, root=8), 2, own)  # a padded split: every sample taken
    estimated = {**seen(1, 7, root=8), "estimated": True}
    assert not beyond(estimated, 2, own)  # a sketch cannot show a sample left out
    facts = verdict.Facts(sharding=own, own_data=True)
    decided = verdict.decide(_taken(1, 7), facts)
    assert decided is not None and decided.severity == "error"
    assert "dataset of its own" in decided.why
    assert verdict.decide(_taken(3, 20), verdict.Facts(own_data=True)) is not None
    # no sign the data is meant to be split, no data-parallel module: a warning at most
    warned = verdict.decide(_taken(3, 20), verdict.Facts())
    assert warned is not None and warned.severity == "warning"


def test_a_sampler_that_shards_itself_is_there_to_split_the_data() -> None:
    decided = verdict.decide(_taken(3, 20), verdict.Facts(sharded=True))
    assert decided is not None and decided.severity == "error"
    assert verdict.decide(_taken(3, 20, "prefix"), verdict.Facts(sharded=True)) is None


def test_padding_re_hands_a_sample_to_one_more_rank_only() -> None:
    # generated config w3-s13-15: 17 samples at world 3, each rank keeping 4; one sample on
    # all three ranks is no padding (a pad is one more copy of a distinct sample)
    on_three = {"root_size": 17, "shared": 1, "union": 10, "most": 3,
                "per_rank": {0: 4, 1: 4, 2: 4}, "repeats": {0: 0, 1: 0, 2: 0}}  # fmt: skip
    assert verdict.allowed_as(on_three, 3) is None
    assert verdict.allowed_as({**on_three, "most": 2}, 3) == "DistributedSampler padding"
    tiny = {**on_three, "root_size": 2, "union": 2}  # fewer samples than ranks: pads wrap
    assert verdict.allowed_as(tiny, 3) == "DistributedSampler padding"
