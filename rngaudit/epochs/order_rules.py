"""Rules for the per-epoch order check: do the ranks shard the same order of the same dataset?"""

from __future__ import annotations

import dataclasses
from typing import Any

from rngaudit import findings as fk
from rngaudit import verdict
from rngaudit.capture import sketch
from rngaudit.findings import Finding
from rngaudit.ranks import overlap
from rngaudit.ranks.rules import DATASET_REMEDY
from rngaudit.schema import EpochRecord, SamplerDraw
from rngaudit.wording import format_site, ranks_phrase

ORDER_REMEDY = (
    "Make the order every rank shards come from state that is identical on every rank: give "
    "your sampler a `generator` attribute seeded identically on every rank "
    "(torch.Generator().manual_seed(SEED)), or seed every rank identically before iteration. "
    "Per-rank seeds (for dropout, augmentation) are fine once the sampler has its own generator."
)
DS_SEED_REMEDY = (
    "Pass the same seed= to DistributedSampler on every rank (a shared constant, never the rank; "
    "Lightning takes it from seed_everything()/PL_GLOBAL_SEED, so seed_everything(SEED) must get "
    "the same SEED on every rank). Per-rank seeds for dropout can be set after the sampler exists."
)
DS_EPOCH_REMEDY = (
    "Call sampler.set_epoch(epoch) with the same epoch on every rank before each epoch (after a "
    "resume, restore the epoch counter on every rank from the same checkpoint)."
)
SEEDABLE_REMEDY = (
    "Use the same seed on every rank for the data order: accelerate's SeedableRandomSampler "
    "seeds from data_seed (or torch.initial_seed()) + epoch, so set_seed(SEED) without "
    "device_specific=True, or the same data_seed= / TrainingArguments(seed=, data_seed=) on "
    "every rank."
)
POSITION_REMEDY = (
    "Restore every rank's loader from the same step: save each rank's "
    "StatefulDataLoader.state_dict() at the same step (accelerate's save_state() does, for every "
    "rank) and load each rank's own state from that one checkpoint."
)
STREAM_REMEDY = (
    "Shuffle a stream that is split between ranks with the same seed on every rank: "
    "IterableDataset.shuffle(seed=SEED) before split_dataset_by_node (never seed=rank), "
    "set_epoch(epoch) with the same epoch on every rank; for a dataset of your own under "
    "accelerate, seed every rank identically (set_seed(SEED), not device_specific=True)."
)
CONTENT_REMEDY = (
    "Nothing to fix if the per-rank content is intended (augmentation). If every rank must "
    "see identical rows, seed the .map() function's randomness identically on every rank (or "
    "run .map() once and save the result with save_to_disk)."
)
SUBCLASS_REMEDY = (
    "A DistributedSampler subclass must draw its order from a generator seeded identically "
    "on every rank: g = torch.Generator(); g.manual_seed(self.seed + self.epoch); "
    "torch.randperm(n, generator=g), as DistributedSampler does (never the global generator, "
    "which per-rank seeds and rank-only work make differ)."
)
REPEAT_REMEDY = (
    "Call sampler.set_epoch(epoch) at the start of every epoch (DistributedSampler, accelerate's "
    "loaders do it for you); a sampler that reseeds itself identically each epoch repeats "
    "its order."
)


def _groups(values: dict[int, Any]) -> str:
    by_value: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(str(value), []).append(rank)
    parts = []
    for value, ranks in by_value.items():
        parts.append(f"{ranks_phrase(ranks)}: {value}")
    return "; ".join(parts)


def _common_prefix_differs(orders: dict[int, list[str]]) -> bool:
    lists = [o for o in orders.values() if o]
    if len(lists) < 2:
        return False
    m = min(len(o) for o in lists)
    return len({tuple(o[:m]) for o in lists}) > 1


def _draw_lines(records: list[EpochRecord]) -> tuple[list[str], SamplerDraw | None]:
    """Sentences naming the sampler draws whose state (or output) differs across ranks."""
    per_rank = {int(r["rank"]): list(r.get("draws") or []) for r in records}
    longest = max((len(d) for d in per_rank.values()), default=0)
    lines: list[str] = []
    first: SamplerDraw | None = None
    for k in range(longest):
        at_k = {rank: d[k] for rank, d in per_rank.items() if k < len(d)}
        fps = {rank: e.get("fingerprint") for rank, e in at_k.items()}
        outs = {rank: e.get("output_digest") for rank, e in at_k.items()}
        if len(set(fps.values())) <= 1 and len(set(outs.values())) <= 1:
            continue
        e = next(iter(at_k.values()))
        first = first or e
        user = e.get("user_call_site")
        via = f", reached from {format_site(user)}" if user and user != e.get("call_site") else ""
        lines.append(
            f"The order was drawn by {e.get('op')} at {format_site(e.get('call_site'))}{via}, "
            f"from {e.get('generator')}, whose state differs across ranks "
            f"(fingerprints {_groups(fps)})."
        )
        if len(lines) >= 2:
            break
    return lines, first


def compare(
    records: list[EpochRecord], missing: list[int], timeout: float | None = None
) -> list[Finding]:
    """Findings for one epoch check of one loader, the same on every rank."""
    records = sorted(records, key=lambda r: int(r["rank"]))
    out: list[Finding] = []
    if not records:
        return out
    head = records[0]
    loader = str(head.get("loader"))
    epoch = int(head.get("epoch", 0))
    where = f"{loader} ({head.get('chain')}), epoch {epoch}"
    if missing:
        arrived = [int(r["rank"]) for r in records]
        out.append(
            fk.rank_missing(
                missing,
                arrived,
                where=f"reach the order check of {where}",
                timeout=timeout,
                unseen="the orders",
                severity="warning",
                remedy="A sharded loader must be iterated by every rank; iterate "
                "rank-0-only evaluation loaders without a DistributedSampler.",
                details={"loader": loader, "epoch": epoch, "check": "epoch-order"},
            )
        )
    if len(records) < 2:
        return out
    datasets = {int(r["rank"]): r.get("dataset") for r in records}
    shares = {int(r["rank"]): r["shares"] for r in records if "shares" in r}
    if len(set(datasets.values())) > 1:
        mapped = _dataset_finding(records, where, datasets, loader, epoch)
        mapped.details["measure"] = "planned"  # what the ranks are handed decides, if read
        out.append(mapped)
    elif len(shares) == len(records) and (found := _shares_finding(where, shares, loader, epoch)):
        out.append(found)
    else:
        contents = {int(r["rank"]): r.get("content") or "" for r in records}
        if len(set(contents.values())) > 1:
            out.append(_content_finding(where, contents, loader, epoch))
    states = {int(r["rank"]): r.get("sampler_state") for r in records}
    orders = {int(r["rank"]): list(r.get("order") or []) for r in records}
    keys = ["seed", "epoch", "shuffle", "drop_last", "total_size", "resume_at"]
    if all((s or {}).get("shuffle") is False for s in states.values()):
        # no shuffle: the seed and epoch draw nothing, a difference in them is no cause (a
        # subclass that shuffles anyway draws: the shares it hands are measured instead)
        keys = keys[2:]
    differs = [key for key in keys if len({str((s or {}).get(key)) for s in states.values()}) > 1]
    prefix = _common_prefix_differs(orders)
    if differs or prefix or _sampler_draws_differ(records):
        cause = "sampler state" if differs else "order before sharding" if prefix else "draws"
        decided = verdict.by_cause(cause)
        finding = _order_finding(records, where, states, orders, differs, loader, epoch, decided)
        finding.details["measure"] = "planned"  # what the ranks are handed decides, if read
        out.append(finding)
    positions = {int(r["rank"]): r.get("position") for r in records}
    if len(set(positions.values())) > 1:
        out.append(_position_finding(where, positions, loader, epoch))
    return out


def _sampler_draws_differ(records: list[EpochRecord]) -> bool:
    """A DistributedSampler (a subclass's own ``__iter__``) drew the epoch's order, on every
    rank, from generator state (or with an output) that differs across ranks: its seed and
    epoch no longer fix the order it shards."""
    if any(r.get("sampler_state") is None or not r.get("draws") for r in records):
        return False
    firsts = [(r.get("draws") or [])[0] for r in records]
    return (
        len({str(d.get("fingerprint")) for d in firsts}) > 1
        or len({str(d.get("output_digest")) for d in firsts}) > 1
    )


def shares_decide(found: list[Finding]) -> bool:
    """An order or dataset finding whose cause (a sampler's state or draws, a mapping, an
    order before sharding) explains it: the shares the ranks are about to be handed, where
    they can be read, decide the verdict."""
    return any(f.details.get("measure") == "planned" for f in found)


_DRAWS_ONLY = (
    "Each rank takes its share of a different permutation: this epoch duplicates some samples "
    "and drops others. Nothing else will report this."
)


def _shared(seen: dict[str, Any]) -> str:
    """How many samples more than one rank took, in words (an estimate says so)."""
    if not seen.get("estimated"):
        return str(seen["shared"])
    return sketch.about(int(seen["shared"]), float(seen["shared_bound"]))


def _never(seen: dict[str, Any]) -> str:
    """How many samples no rank took, in words."""
    if not seen.get("estimated"):
        return str(seen["root_size"] - seen["union"])
    return sketch.about(int(seen["never_estimate"]), float(seen["never_bound"]))


def _union(seen: dict[str, Any]) -> str:
    """How many samples any rank took, in words."""
    if not seen.get("estimated"):
        return str(seen["union"])
    return sketch.about(int(seen["union"]), float(seen["union_bound"]))


def _estimated(seen: dict[str, Any]) -> str:
    """The sentence that says how an estimate was made ("" for an exact count)."""
    if not seen.get("estimated"):
        return ""
    return (
        f" (estimated from a hash sample of 1 in {round(1 / float(seen['rate'])):,} root "
        f"samples, the same on every rank: {seen['shared_proven']} sampled samples were taken "
        "by more than one rank; bounds hold with probability 1 - 1e-9)"
    )


def planned_overlap(
    summaries: dict[int, dict[str, Any]],
    found: list[Finding],
    complete: bool,
    sharding: verdict.Sharding = verdict.UNKNOWN,
) -> list[Finding]:
    """The order and dataset findings, decided by the shares the ranks are about to be handed
    (each rank's whole epoch, read before its first batch): an overlap beyond padding is an
    error with the measured counts; shares that partition the data (a per-rank order of a
    fixed share, a shuffle-free sampler whose seed differs) are no finding. Shares that could
    not be read (a sampler that yields lazily, a BatchSamplerShard) leave a convicting cause's
    error as it is (:data:`~rngaudit.verdict.CONVICTING`: nothing is measurable before the
    epoch) and the draws' warning (``details["shares"] = "unread"``), and the epoch's end
    measures what the ranks were handed (under DDP/FSDP also the training steps as they come:
    :meth:`~rngaudit.epochs.sharded_check.ShardedCheck._follow_drawn`)."""
    seen = overlap.measure(summaries) if complete else None
    out: list[Finding] = []
    for f in found:
        if f.details.get("measure") != "planned":
            out.append(f)
            continue
        del f.details["measure"]
        world = len(summaries)
        if f.kind == fk.DATASET_DIVERGENCE and not _mapped_apart(summaries):
            out.append(f)  # the datasets differ where no index mapping shows it (a Hugging
            continue  # Face dataset's own indices): positions name different samples
        if seen is None and f.severity == "error":
            out.append(f)  # a cause that convicts where the shares cannot be read: CONVICTING
            continue
        if seen is None:
            f.message = f.message.replace(
                _DRAWS_ONLY,
                "If their shares overlap, this epoch duplicates some samples and drops others: "
                "the shares could not be read before the epoch (the sampler yields lazily), so "
                "the partition check measures what each rank was handed at the epoch's end.",
            )
            f.details["shares"] = "unread"  # under DDP/FSDP: also compared as they are drawn
            out.append(f)
            continue
        taken = verdict.Taken(seen, world, "planned")
        if verdict.decide(taken, verdict.Facts(sharding=sharding, sharded=True)) is None:
            continue  # measured intact: the ranks order shares that still partition the data
        never = int(seen.get("never_estimate", seen["root_size"] - seen["union"]))
        f.severity = "error"
        f.message += (
            f"\nMeasured before the first batch, from the epoch each rank's sampler returned: "
            f"{_shared(seen)} of {seen['root_size']} samples are in more than one rank's share "
            f"and {_never(seen)} in none{_estimated(seen)}."
        )
        f.details.update(shared=seen["shared"], never=never, root_size=seen["root_size"])
        out.append(f)
    return out


def _mapped_apart(summaries: dict[int, dict[str, Any]]) -> bool:
    """Whether the ranks' planned epochs map through index mappings that differ (the
    difference between their datasets is one the root samples measured show)."""
    return len({str(s.get("levels")) for s in summaries.values()}) > 1


def _position_finding(where: str, positions: dict[int, Any], loader: str, epoch: int) -> Finding:
    """The ranks resume one epoch at different batches (a loader state restored per rank from
    different steps): each takes its share of different batches and they run different numbers
    of steps."""
    lines = [
        f"The ranks are about to shard from different positions of the epoch in {where}: "
        f"batches already yielded when its first batch came back: {_groups(positions)}.",
        "The loader state each rank restored was saved at a different step: the ranks take "
        "their shares of different batches (some samples trained twice this epoch, others "
        "never) and run different numbers of steps (a collective then waits on the others).",
    ]
    details = {"loader": loader, "epoch": epoch, "check": "epoch-order", "positions": positions}
    decided = verdict.by_cause("resume position")
    return _finding(
        fk.SAMPLER_DRAW_DIVERGENCE,
        decided,
        lines,
        sorted(positions),
        None,
        POSITION_REMEDY,
        details,
    )


def _dataset_finding(
    records: list[EpochRecord], where: str, datasets: dict[int, Any], loader: str, epoch: int
) -> Finding:
    split = _split_draw(records)
    lines = [
        f"The ranks shard different datasets in {where}: the index mapping each rank is about "
        f"to shard differs ({_groups(datasets)}).",
        "Each rank splits its own permutation of a different mapping: samples are duplicated "
        "across ranks and others never seen (a random_split without a shared generator also "
        "leaks validation samples into training).",
    ]
    remedy = DATASET_REMEDY
    if any("stream:" in str(d) for d in datasets.values()):
        lines = [
            f"The ranks split different streams in {where}: what fixes each rank's stream (its "
            f"shuffle generator's state, its epoch, its shards) differs ({_groups(datasets)}).",
            "Each rank takes its share of a differently shuffled stream: samples are "
            "duplicated across ranks and others never seen.",
        ]
        remedy = STREAM_REMEDY
        split = None  # a stream is not built by random_split
    if split is not None:
        user = split.get("user_call_site")
        lines.append(
            f"The mapping was drawn by {split.get('op')} at {format_site(split.get('call_site'))}"
            + (f", called from {format_site(user)}" if user else "")
            + f", from {split.get('generator')}."
        )
    details = {
        "loader": loader,
        "epoch": epoch,
        "datasets": {str(k): v for k, v in datasets.items()},
    }
    decided = verdict.by_cause("dataset mapping")
    return _finding(fk.DATASET_DIVERGENCE, decided, lines, sorted(datasets), split, remedy, details)


def _split_draw(records: list[EpochRecord]) -> SamplerDraw | None:
    """The random_split draw to name behind differing datasets: the first one each rank
    recorded, only where their state or output differs across ranks (a split drawn alike, or
    seen by one rank only, built no divergence: it may belong to another loader)."""
    firsts = [d[0] for r in records if (d := r.get("dataset_draws"))]
    if len(firsts) < 2:
        return None
    if len({(e.get("fingerprint"), e.get("output_digest")) for e in firsts}) < 2:
        return None
    return firsts[0]


def _shares_finding(
    where: str, shares: dict[int, list[str]], loader: str, epoch: int
) -> Finding | None:
    """A stream split by shards whose ranks are about to read the same shards (each took
    every world-th shard of a list its own shuffle seed ordered), or None when every shard
    goes to one rank: the error names the ranks that share shards and counts them."""
    holders: dict[str, list[int]] = {}
    for rank, share in sorted(shares.items()):
        for shard in share:
            holders.setdefault(shard, []).append(rank)
    shared = {s: r for s, r in holders.items() if len(r) > 1}
    seen = {
        "shared": len(shared),
        "union": len(holders),
        "per_rank": {r: len(set(share)) for r, share in shares.items()},
        "identical": len({tuple(sorted(set(share))) for share in shares.values()}) == 1,
    }
    taken = verdict.Taken(seen, len(shares), "planned", by_key=True)  # a shard names itself
    decided = verdict.decide(taken, verdict.Facts(sharded=True))  # split_dataset_by_node
    if decided is None:
        return None
    total = sum(len(s) for s in shares.values())  # the ranks' positions cover every shard once
    pairs = sorted({tuple(sorted(set(r))) for r in shared.values()})
    named = "; ".join(ranks_phrase(list(p)) for p in pairs)
    lines = [
        f"The ranks are about to read the same shards of the stream in {where}: "
        f"{len(shared)} of its {total} shards go to more than one rank ({named} read the "
        f"same shards) and {total - len(holders)} to none.",
        "The stream is split by shards: each rank takes every world-th shard of the shard list "
        "its own shuffle seed ordered, so ranks shuffled with different seeds read the same "
        "shards twice and others never.",
    ]
    details = {
        "loader": loader,
        "epoch": epoch,
        "shares": {str(k): v for k, v in shares.items()},
        "shared_by": [list(p) for p in pairs],
    }
    ranks = sorted(shares)
    return _finding(fk.DATASET_DIVERGENCE, decided, lines, ranks, None, STREAM_REMEDY, details)


def _content_finding(where: str, contents: dict[int, str], loader: str, epoch: int) -> Finding:
    """The ranks shard the same samples, whose content differs: intended (a per-rank
    augmentation in ``.map()``) or not, the partition is intact, so this is a warning."""
    return Finding(
        kind=fk.DATASET_CONTENT_DIVERGENCE,
        severity="warning",
        message=(
            f"The ranks shard the same samples in the same order in {where}, but the "
            f"content of the rows differs ({_groups(contents)}: the datasets' fingerprints). "
            "The partition is intact; if the rows were transformed with per-rank randomness "
            "(a .map() augmentation seeded per rank) this is by design."
        ),
        ranks=sorted(contents),
        remedy=CONTENT_REMEDY,
        details={
            "loader": loader,
            "epoch": epoch,
            "contents": {str(k): v for k, v in contents.items()},
        },
    )


def _finding(
    kind: str,
    decided: verdict.Verdict,
    lines: list[str],
    ranks: list[int],
    draw: SamplerDraw | None,
    remedy: str,
    details: dict[str, Any],
) -> Finding:
    """The finding of a verdict that names the draw (generator, library and user call sites)
    behind it."""
    return Finding(
        kind=kind,
        severity=decided.severity,
        message="\n".join(lines),
        ranks=ranks,
        generator=draw.get("generator") if draw else None,
        call_site=draw.get("call_site") if draw else None,
        user_call_site=draw.get("user_call_site") if draw else None,
        remedy=remedy,
        details=details,
    )


def _order_finding(
    records: list[EpochRecord],
    where: str,
    states: dict[int, Any],
    orders: dict[int, list[str]],
    differs: list[str],
    loader: str,
    epoch: int,
    decided: verdict.Verdict,
) -> Finding:
    chain = str(records[0].get("chain"))
    lines = [f"The ranks are about to shard different orders in {where}."]
    remedy = ORDER_REMEDY
    if differs:
        for key in differs:
            values = {rank: (s or {}).get(key) for rank, s in states.items()}
            lines.append(
                f"The DistributedSampler's {key} differs across ranks ({_groups(values)})."
            )
        remedy = DS_EPOCH_REMEDY if differs == ["epoch"] else DS_SEED_REMEDY
    elif any(r.get("sampler_state") is not None for r in records):
        lines.append(
            f"Its seed and epoch agree on every rank, but its __iter__ ({chain}) drew the order "
            "it shards from generator state that differs across ranks."
        )
        remedy = SUBCLASS_REMEDY
    else:
        firsts = {rank: (o[0] if o else None) for rank, o in orders.items()}
        lines.append(f"The first batch of the order before sharding differs ({_groups(firsts)}).")
        if "SeedableRandomSampler" in chain:
            remedy = SEEDABLE_REMEDY
    draw_lines, draw = _draw_lines(records)
    lines.extend(draw_lines)
    lines.append(_DRAWS_ONLY)
    details = {
        "loader": loader,
        "epoch": epoch,
        "sampler": chain,
        "check": "epoch-order",
        "differs": differs,
        "first_batches": {str(r): (o[0] if o else None) for r, o in sorted(orders.items())},
    }
    ranks = sorted(orders)
    return _finding(fk.SAMPLER_DRAW_DIVERGENCE, decided, lines, ranks, draw, remedy, details)


def repeated(record: EpochRecord, previous: EpochRecord | None) -> Finding | None:
    """A warning when a shuffling sampler hands out exactly the previous epoch's order."""
    if previous is None or not record.get("shuffling"):
        return None
    same_state = record.get("sampler_state") is not None and record.get(
        "sampler_state"
    ) == previous.get("sampler_state")
    same_order = bool(record.get("order")) and record.get("order") == previous.get("order")
    if not (same_state or same_order):
        return None
    where = f"{record.get('loader')} ({record.get('chain')})"
    return Finding(
        kind=fk.EPOCH_ORDER_REPEATED,
        severity="warning",
        message=(
            f"Epoch {record.get('epoch')} of {where} hands out exactly the order of epoch "
            f"{previous.get('epoch')}: the shuffling sampler was not advanced (set_epoch "
            "never called?). Training quietly sees the same order every epoch."
        ),
        ranks=[int(record["rank"])],
        remedy=REPEAT_REMEDY,
        details={"loader": record.get("loader"), "epoch": record.get("epoch")},
    )


PARTITION_REMEDY = (
    "Every rank must shard one order of one dataset: give the sampler a generator seeded "
    "identically on every rank (or seed every rank identically before iteration), pass the same "
    "seed= and epoch to DistributedSampler on every rank, and build splits with a shared "
    "generator. A DistributedSampler subclass must shuffle from a generator seeded with "
    "self.seed + self.epoch, as DistributedSampler does."
)


def partition_overlap(
    summaries: dict[int, dict[str, Any]],
    loader: str,
    chain: str,
    epoch: int,
    sharding: verdict.Sharding = verdict.UNKNOWN,
) -> Finding | None:
    """An error when the samples the ranks actually took in an epoch overlap beyond padding.

    The evidence is what each rank was handed (root sample indices observed in its main
    process), whatever produced it. Padding (a DistributedSampler without ``drop_last``) lets up
    to ``world - 1`` samples appear twice; a rank repeating more samples than that within its own
    share samples with replacement, and then an overlap proves nothing: no finding.
    ``sharding``: what the trigger knows of the sharder (accelerate's even_batches rounds).
    """
    world = len(summaries)
    seen = overlap.measure(summaries)
    if seen is None:
        return None
    decided = verdict.decide(
        verdict.Taken(seen, world), verdict.Facts(sharding=sharding, sharded=True)
    )
    if decided is None:
        return None
    never = int(seen.get("never_estimate", seen["root_size"] - seen["union"]))
    counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(seen["per_rank"].items()))
    message = (
        f"In epoch {epoch} of {loader} ({chain}) the ranks were handed overlapping samples: "
        f"{_shared(seen)} of {seen['root_size']} samples went to more than one rank, and "
        f"{_never(seen)} of them to none ({counts} distinct samples each). Each rank trained "
        "on its share of a different order: this epoch duplicated some samples and dropped "
        f"others (observed from the index batches each rank drew){_estimated(seen)}."
    )
    return Finding(
        kind=fk.PARTITION_OVERLAP,
        severity=decided.severity,
        message=message,
        ranks=sorted(summaries),
        remedy=PARTITION_REMEDY,
        details={
            "loader": loader,
            "epoch": epoch,
            "check": "partition",
            "shared": seen["shared"],
            "never": never,
            "root_size": seen["root_size"],
            "per_rank": {str(r): n for r, n in seen["per_rank"].items()},
        },
    )


DUPLICATION_REMEDY = (
    "Shard the loader between the data-parallel ranks: DataLoader(ds, "
    "sampler=DistributedSampler(ds, shuffle=True, seed=SEED)) with sampler.set_epoch(epoch) "
    "each epoch (or let accelerate's prepare() / Lightning shard it). A sampler of your own "
    "that takes perm[rank::world] must draw perm from a generator seeded identically on every "
    "rank (torch.Generator().manual_seed(SEED + epoch)), never from the global generator."
)


def observed_overlap(
    summaries: dict[int, dict[str, Any]],
    loader: str,
    chain: str,
    epoch: int,
    padded_before: int | None,
    data_parallel: bool,
    ahead: bool = False,
    left: str | None = None,
) -> tuple[Finding | None, bool]:
    """The verdict on one epoch of a loader no known class shards, from what each rank was
    handed, and whether this epoch partitioned the data exactly (evidence for later epochs).

    An overlap beyond padding is an error when the loader partitioned the data exactly in an
    earlier epoch (it is meant to be sharded) or when the ranks trained under a data-parallel
    module (DDP / FSDP: every rank stepping on the same samples is duplication); otherwise a
    partial overlap is a warning and ranks handed identical samples (a tensor-parallel group,
    a replicated evaluation) are nothing at all. ``ahead``: the summaries are the epochs the
    ranks' samplers held at their first training step (read ahead), said so in the message.
    ``left``: some rank left the epoch early (how far each rank got, in words): the overlap is
    of what the ranks took until then, never evidence of a partition, and nothing is said of
    samples no rank took (the epoch did not finish). ``padded_before``: None unless an earlier
    epoch partitioned the data exactly; then the padding it showed, where it was as long
    (-1: unknown, up to ``world - 1``).
    """
    world = len(summaries)
    seen = overlap.measure(summaries)
    if seen is None:
        return None, False
    identical = bool(seen.get("identical"))
    taken = verdict.Taken(seen, world, "epoch" if left is None else "left")
    facts = observed_facts(summaries, padded_before, data_parallel, left is None)
    partitioned_before = facts.partitioned_before
    decided = verdict.decide(taken, facts)
    if decided is None:  # a partition, by design, or no evidence of harm (with replacement)
        return None, verdict.partitions(taken, facts.sharding.covers)
    severity = decided.severity
    never: int | None = int(seen.get("never_estimate", seen["root_size"] - seen["union"]))
    counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(seen["per_rank"].items()))
    where = f"epoch {epoch} of {loader} ({chain}, sharded by no DistributedSampler)"
    seen_how = "observed from the index batches each rank drew"
    if ahead:  # the whole epoch, before the module's first training forward on it
        seen_how = (
            "read before the first training step of the epoch, from the whole epoch each "
            "rank's sampler held (no draw)"
        )
    if left is not None:  # what the ranks took until they left: no sample "went to none"
        never = None
        seen_how = "observed from the index batches each rank drew before it left the epoch"
        start = f"Epoch {epoch} of {loader} ({chain}, sharded by no DistributedSampler)"
        if identical:
            lines = [
                f"{start} was left early: {left}: by then every rank had been handed the same "
                f"{_union(seen)} samples of {seen['root_size']}: the data-parallel ranks "
                f"trained on identical batches, a {world}-fold duplication ({seen_how}, while "
                f"a DistributedDataParallel / FSDP module trained){_estimated(seen)}."
            ]
        else:
            lines = [
                f"{start} was left early: {left}: by then {_shared(seen)} of "
                f"{seen['root_size']} samples had gone to more than one rank ({counts} "
                f"distinct samples each): they were trained on twice ({seen_how})"
                f"{_estimated(seen)}."
            ]
    elif identical:
        lines = [
            f"In {where} every rank was handed the same "
            f"{_union(seen)} samples of "
            f"{seen['root_size']}: the data-parallel ranks trained on identical batches, a "
            f"{world}-fold duplication of the epoch ({seen_how}, while a "
            f"DistributedDataParallel / FSDP module trained){_estimated(seen)}."
        ]
    else:
        lines = [
            f"In {where} the ranks were handed overlapping samples: {_shared(seen)} of "
            f"{seen['root_size']} samples went to more than one rank, and {_never(seen)} of "
            f"them to none ({counts} distinct samples each). Each rank took its share of a "
            "different order: this epoch duplicated some samples and dropped others "
            f"({seen_how}){_estimated(seen)}."
        ]
    if not identical:
        if facts.own_data:
            lines.append(
                f"Each rank reads a dataset of its own (a per-rank Subset), cut from one of "
                f"{facts.sharding.covers} samples: the program split the data between the "
                "ranks, and the splits overlap."
            )
        elif facts.sharded:
            lines.append(
                "A sampler of the loader holds this rank and the world size: it is there to "
                "split the order between the ranks, and the shares overlap."
            )
        if partitioned_before:
            lines.append(
                "An earlier epoch of this loader partitioned the data exactly: the order it "
                "shards was drawn from state that no longer agrees across ranks (a rank-only "
                "evaluation or per-rank seeding between epochs, with a sampler drawing from the "
                "global generator)."
            )
        elif severity == "warning":
            lines.append(
                "No data-parallel module (DistributedDataParallel / FSDP) was found training "
                "and no earlier epoch partitioned the data, so this may be by design."
            )
    finding = Finding(
        kind=fk.PARTITION_OVERLAP,
        severity=severity,
        message="\n".join(lines),
        ranks=sorted(summaries),
        remedy=DATASET_REMEDY if facts.own_data else DUPLICATION_REMEDY,
        details={
            "loader": loader,
            "epoch": epoch,
            "check": "observed-partition",
            "shared": seen["shared"],
            "never": never,
            "root_size": seen["root_size"],
            "identical": identical,
            "per_rank": {str(r): n for r, n in seen["per_rank"].items()},
            **({"left_early": left} if left is not None else {}),
        },
    )
    return finding, False


def observed_facts(
    summaries: dict[int, dict[str, Any]],
    padded_before: int | None,
    data_parallel: bool,
    whole: bool,
) -> verdict.Facts:
    """What the ranks published of an observed loader's epoch tells the verdict besides the
    samples taken: a sampler that shards itself (every rank's holds its rank and the world),
    datasets of the ranks' own cut from one (:func:`~rngaudit.ranks.overlap.cut_from`; their
    padding, in a ``whole`` epoch, leaves none out), the samples the loader's dataset holds, an
    earlier exact partition (and the padding it showed, ``padded_before``), and a data-parallel
    module training (every rank's gradients on)."""
    cut = overlap.cut_from(summaries)
    training = all(s.get("training") for s in summaries.values())
    covers = cut if cut is not None else _loader_size(summaries)
    return verdict.Facts(
        sharding=verdict.Sharding(
            pads=-1 if padded_before is None else padded_before,
            covers=covers,
            complete=whole and cut is not None,
        ),
        sharded=all(s.get("shards_self") is True for s in summaries.values()),
        own_data=cut is not None,
        partitioned_before=padded_before is not None,
        data_parallel=data_parallel and training,
    )


def _loader_size(summaries: dict[int, dict[str, Any]]) -> int:
    """The samples the loader's dataset holds (its outermost index mapping's length, the same
    on every rank: a split of the root), or 0 when unknown (the root's size stands in)."""
    sizes = set()
    for s in summaries.values():
        levels = s.get("levels")
        if not isinstance(levels, list):
            return 0
        sizes.add(int(levels[0][0]) if levels else int(s.get("root_size") or 0))
    return sizes.pop() if len(sizes) == 1 else 0


def content_differs(finding: Finding) -> Finding:
    """An overlap of identical indices whose first batches hold different content on different
    ranks: a warning, never an error. The indices may name different samples on each rank (a
    dataset that picks its part by rank inside ``__getitem__``: intact) or the same samples,
    augmented per rank (duplication); the batches cannot tell the two apart."""
    return dataclasses.replace(
        finding,
        severity=verdict.unshown_identity(finding.severity),
        message=(
            f"{finding.message} The ranks' first batches hold different content for the same "
            "indices: if the dataset picks its part by rank inside __getitem__, this is by "
            "design (give it an attribute that names its part to silence this); if the "
            "content differs only by a per-rank augmentation, every rank trains the same "
            "samples."
        ),
        details={**finding.details, "content_differs": True},
    )


def unlike_content(summaries: dict[int, dict[str, Any]]) -> bool:
    """Whether the ranks' first batches took the same root samples yet hold different content:
    the indices do not name the same samples on every rank (a dataset that picks its part by
    rank inside ``__getitem__``), so they are no evidence of an overlap. Content that could not
    be digested on some rank is unknown: no conclusion."""
    values = list(summaries.values())
    firsts = {str(s.get("first")) for s in values}
    contents = [s.get("content") for s in values]
    return (
        len(values) > 1
        and len(firsts) == 1
        and bool(values[0].get("first"))
        and all(isinstance(c, str) for c in contents)
        and len(set(contents)) > 1
    )


def first_batches_overlap(
    summaries: dict[int, dict[str, Any]],
    loader: str,
    chain: str,
    epoch: int,
    drawn: int | None = None,
    sharded_by: str | None = None,
) -> Finding | None:
    """An error when the first batches the ranks are about to train on (root samples) overlap
    beyond padding, for a loader an earlier epoch of which partitioned the data exactly: a
    partition never hands one sample to two ranks, so the ranks now shard different orders.
    Used where the rest of the epoch cannot be read ahead (a sampler that yields lazily).
    ``drawn``: the summaries are what each rank had been handed by its ``drawn``-th training
    forward of the epoch (compared at the next one), not its first batch. ``sharded_by``: the
    sampler class that shards the loader (a DistributedSampler subclass whose own ``__iter__``
    drew from state that differs across ranks), the reason the overlap is harm instead."""
    world = len(summaries)
    seen = overlap.measure(summaries)
    if seen is None:
        return None
    # no earlier partition with a sharder: too few shared to rule out sampling by design
    facts = verdict.Facts(sharded=sharded_by is not None, partitioned_before=sharded_by is None)
    decided = verdict.decide(verdict.Taken(seen, world, "prefix"), facts)
    if decided is None:
        return None
    firsts = ", ".join(f"rank {r}: {n}" for r, n in sorted(seen["per_rank"].items()))
    if drawn is None:
        what = "the first batches the ranks are about to train on share"
        found = (
            "Found before the first training step, from each rank's first batch (its sampler "
            "yields lazily: the rest of the epoch cannot be read ahead)."
        )
    else:
        what = f"the first {drawn} batches each rank was handed share"
        found = (
            f"Found before training step {drawn + 1} of the epoch, from the batches each rank "
            f"had been handed by its training step {drawn} (its sampler yields lazily: the "
            "epoch is compared as it is drawn, at steps 2, 4, 8, ..., each before the next "
            "step)."
        )
    if sharded_by is None:
        where = f"{loader} ({chain}, sharded by no DistributedSampler)"
        why = (
            "An earlier epoch of this loader partitioned the data exactly, and a partition "
            "never hands one sample to two ranks"
        )
    else:
        where = f"{loader} ({chain})"
        why = (
            f"Its {sharded_by} is there to partition the data between the ranks, and a "
            "partition never hands one sample to two ranks; its own __iter__ drew the order "
            "from a generator whose state differs across ranks (the warning at the epoch's "
            "first batch), and they share more samples than ranks sampling independently with "
            "replacement could before repeating one of their own"
        )
    message = (
        f"In epoch {epoch} of {where} {what} {seen['shared']} samples ({firsts} distinct "
        f"samples each). {why}: the ranks now take their shares of different orders, and this "
        f"epoch duplicates some samples and drops others. {found}"
    )
    return Finding(
        kind=fk.PARTITION_OVERLAP,
        severity=decided.severity,
        message=message,
        ranks=sorted(summaries),
        remedy=DUPLICATION_REMEDY,
        details={
            "loader": loader,
            "epoch": epoch,
            "check": "observed-first-batches" if drawn is None else "observed-so-far",
            **({"batches": drawn} if drawn is not None else {}),
            "shared": seen["shared"],
            "per_rank": {str(r): n for r, n in seen["per_rank"].items()},
        },
    )
