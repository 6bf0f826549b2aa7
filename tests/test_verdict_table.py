"""The decision table of partition harm: every decider's verdict over the summaries the unit
tests build and a grid of shapes, pinned in tests/golden/verdicts.json (RNGAUDIT_UPDATE_GOLDEN=1
rewrites it; a changed row is a deliberate behaviour change, named in its commit)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import torch
from event_factory import epoch_record, make_event, site

from rngaudit import verdict as harm
from rngaudit.epochs import keyed, order_rules, partition, sharding
from rngaudit.findings import Finding
from rngaudit.ranks import overlap, rules
from rngaudit.schema import EpochRecord, Event, RankRecord, SamplerDict, SamplerDraw

GOLDEN = Path(__file__).parent / "golden" / "verdicts.json"
N = 24  # root samples of the grid
BATCH = 4


def _perm(seed: int, n: int = N) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def _summary(taken: list[int], n: int = N, training: bool = True) -> dict[str, Any]:
    tape = partition.Tape([], n)
    tape.take([taken])
    summary = tape.summary()
    summary["training"] = training
    return summary


def _batched_shares(order: list[int], world: int) -> dict[int, list[int]]:
    """``order`` cut into batches of BATCH, dealt round-robin (a BatchSamplerShard)."""
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    return {r: [i for b in batches[r::world] for i in b] for r in range(world)}


def _index_shapes(world: int) -> dict[str, tuple[dict[int, list[int]], int]]:
    """Per shape: what each rank took (root indices) and the root's size."""
    p = _perm(0)
    shapes: dict[str, tuple[dict[int, list[int]], int]] = {
        "partition": ({r: p[r::world] for r in range(world)}, N),
        "partition-prefix": ({r: p[r::world][:BATCH] for r in range(world)}, N),
        "drop-last": ({r: p[: N - 4][r::world] for r in range(world)}, N),
        "overlap": ({r: _perm(r)[r::world] for r in range(world)}, N),
        "overlap-prefix": ({r: _perm(r)[r::world][:BATCH] for r in range(world)}, N),
        "one-rank-differs": (
            {r: (_perm(9) if r == world - 1 else p)[r::world] for r in range(world)},
            N,
        ),
        "identical": ({r: list(p) for r in range(world)}, N),
        "identical-prefix": ({r: p[:BATCH] for r in range(world)}, N),
        "replacement": (
            {
                r: torch.randint(
                    N, (N // world,), generator=torch.Generator().manual_seed(r)
                ).tolist()
                for r in range(world)
            },
            N,
        ),
        "many-prefix": ({r: _perm(5 + r, 1024)[r::world][:256] for r in range(world)}, 1024),
        "by-chance": (
            {r: [1, 2, *range(10 + 5000 * r, 1608 + 5000 * r)] for r in range(world)},
            1_000_000,
        ),
        "whole-perms": ({r: _perm(r, 64)[:48] for r in range(world)}, 64),
    }
    # DistributedSampler padding: N - world + 1 samples padded to N from the order's start
    short = _perm(0, N - world + 1)
    padded = short + short[: world - 1]
    shapes["ds-padding"] = ({r: padded[r::world] for r in range(world)}, N - world + 1)
    # accelerate even_batches: 22 samples, the last round completed from the first batches
    order = _perm(0, 22)
    round_ = world * BATCH
    full = order + order[: (-len(order)) % round_]
    shapes["even-batches"] = (_batched_shares(full, world), 22)
    dropped = order[:-1] + order[: (-len(order[:-1])) % round_]
    shapes["even-batches-one-dropped"] = (_batched_shares(dropped, world), 22)
    # even_batches over a Subset of 13 of a 30-sample root (as generated config w2-s7-01)
    subset = _perm(3, 30)[:13]
    held = subset + subset[: (-len(subset)) % round_]
    shapes["even-batches-subset"] = (_batched_shares(held, world), 30)
    # above partition.MAX_ROOT root samples: a sketch, the counts estimated
    big = partition.MAX_ROOT + 1000
    g = _perm(0, big)
    shapes["sketch-partition"] = ({r: g[r::world][:50_000] for r in range(world)}, big)
    shapes["sketch-overlap"] = ({r: _perm(r, big)[:50_000] for r in range(world)}, big)
    shapes["sketch-identical"] = ({r: g[:50_000] for r in range(world)}, big)
    return shapes


def _row(found: Finding | None) -> str:
    if found is None:
        return "-"
    check = found.details.get("check")
    shared = found.details.get("shared")
    return f"{found.kind}/{found.severity}/{check}" + (f"/shared={shared}" if shared else "")


def _rows(found: list[Finding]) -> list[str]:
    return [_row(f) for f in found]


def _draws_only(world: int) -> list[Finding]:
    """The order finding a DistributedSampler subclass's draws alone give (its seed and epoch
    agree): the finding planned_overlap decides."""
    records = [epoch_record(r, 5, DATA) for r in range(world)]
    for r, record in enumerate(records):
        record["order"] = []
        record["sampler_state"] = {"seed": 0, "epoch": 0, "shuffle": True}
        record["draws"] = [cast(SamplerDraw, {"op": "aten.randperm", "fingerprint": f"f{r}"})]
    return order_rules.compare(records, missing=[])


def _index_table(world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (taken, n) in _index_shapes(world).items():
        for training in (True, False):
            s = {r: _summary(t, n, training) for r, t in taken.items()}
            row = f"w{world}/{name}" + ("" if training else "/no-grad")
            if training:
                seen = overlap.measure(s)
                assert seen is not None
                out[f"{row}/allowed_as"] = str(harm.allowed_as(seen, world))
                for label, rounds in (
                    ("unknown", harm.UNKNOWN),
                    ("rounds", harm.Sharding(rounds=world * BATCH)),
                    ("rounds-covers13", harm.Sharding(rounds=world * BATCH, covers=13)),
                ):
                    out[f"{row}/allowed_as/{label}"] = str(harm.allowed_as(seen, world, rounds))
                    out[f"{row}/partition_overlap/{label}"] = _row(
                        order_rules.partition_overlap(s, "L", "C", 0, rounds)
                    )
                for drawn in (None, 4):
                    for by in (None, "Mine (a DistributedSampler subclass)"):
                        key = f"{row}/first_batches_overlap/drawn={drawn}/by={by is not None}"
                        out[key] = _row(
                            order_rules.first_batches_overlap(s, "L", "C", 1, drawn, by)
                        )
                for complete in (True, False):
                    planned = order_rules.planned_overlap(s, _draws_only(world), complete)
                    out[f"{row}/planned_overlap/complete={complete}"] = _rows(planned)
                records = [
                    cast(
                        RankRecord,
                        {
                            "rank": r,
                            "signature": str(r),
                            "loaders": [{"loader": "L", "samples": v}],
                        },
                    )
                    for r, v in s.items()
                ]
                groups = rules._Groups(records)
                out[f"{row}/dataset_overlap"] = _rows(
                    rules._dataset_overlap(records, 0, groups, world)
                )
            for before in (False, True):
                for dp in (False, True):
                    for ahead in (False, True):
                        for left in (None, "rank 0 after 3 of 6 batches"):
                            found, exact = order_rules.observed_overlap(
                                s, "L", "C", 0, -1 if before else None, dp, ahead, left
                            )
                            key = (
                                f"{row}/observed_overlap/before={before}/dp={dp}/"
                                f"ahead={ahead}/left={left is not None}"
                            )
                            out[key] = f"{_row(found)} exact={exact}"
                            if found is not None:
                                out[f"{key}/content_differs"] = _row(
                                    order_rules.content_differs(found)
                                )
    return out


def _keyed_summary(ids: list[int], cap: int = keyed.CAP) -> dict[str, Any]:
    taken = keyed.Taken(cap)
    taken.add(keyed.read(ids, lambda b: b))
    return taken.summary()


def _keyed_table(world: int) -> dict[str, Any]:
    per = 48
    round_ = world * BATCH
    shapes: dict[str, dict[int, dict[str, Any]]] = {
        "partition": {r: _keyed_summary(list(range(r * per, (r + 1) * per))) for r in range(world)},
        "one-round": {
            r: _keyed_summary(list(range(r * per, (r + 1) * per + (round_ if r == 0 else 0))))
            for r in range(world)
        },
        "beyond-round": {
            r: _keyed_summary(list(range(r * per, (r + 1) * per + (round_ + 1 if r == 0 else 0))))
            for r in range(world)
        },
        "identical": {r: _keyed_summary(list(range(per))) for r in range(world)},
        "own-repeats": {
            r: _keyed_summary(list(range(r * per, (r + 1) * per)) * 3) for r in range(world)
        },
        "one-shared": {
            r: _keyed_summary([*range(r * per, (r + 1) * per), 10_000]) for r in range(world)
        },
        "estimated": {
            r: _keyed_summary(list(range(3000 * r, 3000 * r + 6000)), 512) for r in range(world)
        },
        "unknown": {
            r: ({"keyed": True, "known": False} if r == 0 else _keyed_summary([1]))
            for r in range(world)
        },
    }
    out: dict[str, Any] = {}
    for name, s in shapes.items():
        for dp in (False, True):
            for first in (False, True):
                for partial in ([], [1]):
                    key = f"w{world}/keyed/{name}/dp={dp}/first={first}/partial={bool(partial)}"
                    batch = 0 if first else BATCH
                    out[key] = _row(keyed.verdict(s, "L", "'id'", 0, batch, dp, partial, first))
    return out


DATA = torch.utils.data.TensorDataset(torch.arange(40))


def _ds_record(rank: int, world: int, **state: Any) -> EpochRecord:
    sampler: Any = torch.utils.data.DistributedSampler(DATA, world, rank, **state)
    return {
        **epoch_record(rank, 5, DATA),
        "chain": "DistributedSampler",
        "order": [],
        "sampler_state": sharding.distributed_sampler_state(sampler),
    }


def _compare_table(world: int) -> dict[str, Any]:
    ranks = range(world)
    last = world - 1
    cases: dict[str, list[EpochRecord]] = {
        "same-order": [epoch_record(r, 5, DATA) for r in ranks],
        "orders-differ": [epoch_record(r, 5 + r, DATA) for r in ranks],
        "last-order-differs": [epoch_record(r, 5 + (r == last), DATA) for r in ranks],
        "datasets-differ": [
            epoch_record(r, 5, torch.utils.data.Subset(DATA, _perm(r, 40)[:20])) for r in ranks
        ],
        "ds-seed-differs": [_ds_record(r, world, seed=r) for r in ranks],
        "ds-seed-differs-no-shuffle": [_ds_record(r, world, seed=r, shuffle=False) for r in ranks],
        "ds-same": [_ds_record(r, world, seed=3) for r in ranks],
        "ds-drop-last-differs": [_ds_record(r, world, drop_last=r == last) for r in ranks],
        "position-differs": [{**epoch_record(r, 5, DATA), "position": r} for r in ranks],
        "content-differs": [{**epoch_record(r, 5, DATA), "content": f"c{r}"} for r in ranks],
        "shares-disjoint": [
            {**epoch_record(r, 5, DATA), "dataset": "stream:s", "shares": [f"s{r}"]} for r in ranks
        ],
        "shares-overlap": [
            {**epoch_record(r, 5, DATA), "dataset": "stream:s", "shares": ["s0", f"s{r + 1}"]}
            for r in ranks
        ],
        "stream-differs": [{**epoch_record(r, 5, DATA), "dataset": f"stream:{r}"} for r in ranks],
    }
    out: dict[str, Any] = {}
    for name, records in cases.items():
        out[f"w{world}/compare/{name}"] = _rows(order_rules.compare(records, missing=[]))
    out[f"w{world}/compare/missing"] = _rows(
        order_rules.compare([epoch_record(0, 5, DATA)], missing=list(range(1, world)))
    )
    out[f"w{world}/compare/draws-only"] = _rows(_draws_only(world))
    one, other = epoch_record(0, 5, DATA), epoch_record(0, 5, DATA, epoch=1)
    out[f"w{world}/repeated/same-order"] = _row(order_rules.repeated(other, one))
    out[f"w{world}/repeated/new-order"] = _row(order_rules.repeated(epoch_record(0, 6, DATA), one))
    out[f"w{world}/repeated/first-epoch"] = _row(order_rules.repeated(one, None))
    return out


def _event(seq: int, generator: str, fp: str, sampler: bool, phase: str = "pre-iteration") -> Event:

    drew: SamplerDict = {
        "chain": "BatchSamplerShard > BatchSampler > RandomSampler",
        "loader": "StatefulDataLoader#1",
        "output_digest": fp,
    }
    return make_event(
        seq,
        generator=generator,
        op="aten.randperm" if sampler else "aten.random_",
        call_site=site("/venv/torch/utils/data/sampler.py", 182, "__iter__"),
        fingerprint=fp,
        phase=phase,
        sampler=drew if sampler else None,
    )


def _rank_record(rank: int, events: list[Event], seed: int = 1) -> RankRecord:
    return {
        "rank": rank,
        "events": events,
        "states": {"entry": {"torch.default_generator": f"e{seed}"}, "exit": {}},
        "initial_seeds": {"torch.default_generator": seed},
    }


def _window_table(world: int) -> dict[str, Any]:
    g = "torch.Generator#1 (RandomSampler.generator)"
    cases: dict[str, list[RankRecord]] = {
        "sampler-draws-alike": [_rank_record(r, [_event(1, g, "b", True)]) for r in range(world)],
        "sampler-draws-differ": [
            _rank_record(r, [_event(1, g, f"b{r}", True)], seed=r) for r in range(world)
        ],
        "sampler-draws-differ-in-iteration": [
            _rank_record(r, [_event(1, g, f"b{r}", True, "iteration")], seed=r)
            for r in range(world)
        ],
        "other-draws-differ": [
            _rank_record(r, [_event(1, "torch.default_generator", f"a{r}", False)], seed=r)
            for r in range(world)
        ],
    }
    out: dict[str, Any] = {}
    for name, records in cases.items():
        found = rules.compare(records, world, [])
        out[f"w{world}/window/{name}"] = _rows(
            [f for f in found if f.kind in ("sampler-draw-divergence", "dataset-divergence")]
        )
    return out


def _unlike_table() -> dict[str, Any]:
    row = {"first": [3, 1, 2], "content": "a"}
    return {
        "unlike/differs": order_rules.unlike_content({0: row, 1: dict(row, content="b")}),
        "unlike/same": order_rules.unlike_content({0: row, 1: dict(row)}),
        "unlike/unknown": order_rules.unlike_content({0: row, 1: dict(row, content=None)}),
        "unlike/other-first": order_rules.unlike_content(
            {0: row, 1: {"first": [4], "content": "b"}}
        ),
    }


def table() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for world in (2, 3):
        out.update(_index_table(world))
        out.update(_keyed_table(world))
        out.update(_compare_table(world))
        out.update(_window_table(world))
    out.update(_unlike_table())
    return out


def test_every_decider_gives_the_pinned_verdict() -> None:
    got = json.dumps(table(), indent=1, sort_keys=True) + "\n"
    if os.environ.get("RNGAUDIT_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    want = GOLDEN.read_text()
    if got != want:
        old, new = json.loads(want), json.loads(got)
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        detail = "\n".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:40])
        raise AssertionError(f"{len(changed)} verdicts changed:\n{detail}")


def test_the_table_covers_every_verdict_of_the_rule() -> None:
    """The grid is not vacuous: it holds errors, warnings and no finding for each decider."""
    rows = table()
    for decider in ("partition_overlap", "observed_overlap", "first_batches_overlap", "keyed"):
        values = " ".join(str(v) for k, v in rows.items() if f"/{decider}/" in k)
        assert "/error/" in values, decider
        assert "-" in values.split(), decider
    observed = " ".join(str(v) for k, v in rows.items() if "/observed_overlap/" in k)
    assert "/warning/" in observed
    keyed_rows = " ".join(str(v) for k, v in rows.items() if "/keyed/" in k)
    assert "/warning/" in keyed_rows
