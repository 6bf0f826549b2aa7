"""Comparison of rank records: the rules that turn fingerprints into findings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from rngaudit import config, library_samplers, verdict
from rngaudit import findings as fk
from rngaudit.capture import framework, naming
from rngaudit.findings import Finding
from rngaudit.ranks import exchange, overlap
from rngaudit.schema import DRAW, PRE_ITERATION, SEED, CallSiteDict, Event, RankRecord, SamplerDict
from rngaudit.wording import format_ranks, format_site, ranks_phrase

UNSEEN = "<not loaded>"  # a generator absent at entry and never drawn from

SAMPLER_REMEDY = (
    "Seed every rank identically before prepare(): accelerate.utils.set_seed(SEED) "
    "(without device_specific=True) or torch.manual_seed(SEED) on all ranks; or give the "
    "DataLoader its own seeded generator: DataLoader(..., "
    "generator=torch.Generator().manual_seed(SEED)); or avoid the early draw "
    "(num_workers=0 or use_stateful_dataloader=False) until accelerate defers the "
    "state_dict() prefetch in prepare()."
)


def _sampler_remedy(kind: str, own: bool) -> str:
    """The fix for a sampler that drew from unequal state, in the words of the run's framework."""
    seed = framework.seed_advice(kind)
    if own:
        return (
            "Give your sampler a `generator` attribute seeded identically on every rank "
            "(self.generator = torch.Generator().manual_seed(SEED), and draw with generator="
            "self.generator; for numpy, np.random.default_rng(SEED)), or seed every rank "
            f"identically before the loader draws: {seed}."
        )
    if kind == framework.ACCELERATE:
        return SAMPLER_REMEDY
    return (
        f"Seed every rank identically before the loader draws: {seed}; or give the DataLoader "
        "its own seeded generator: DataLoader(..., generator=torch.Generator().manual_seed(SEED))."
    )


def _known_sampler(chain: str) -> bool:
    """Whether the innermost sampler of a chain is a library's (not the user's own)."""
    return library_samplers.ends_in_library(chain)


CONSUMPTION_REMEDY = (
    "Make every rank draw the same randomness before iteration (no rank-0-only draws "
    "such as a stray torch.rand or an evaluation), or reseed all ranks identically after "
    "the unequal part."
)
DATASET_REMEDY = (
    "Build the dataset identically on every rank: random_split(ds, lengths, "
    "generator=torch.Generator().manual_seed(SEED)), Subset(ds, torch.randperm(n, "
    "generator=torch.Generator().manual_seed(SEED))), random.Random(SEED).shuffle(items); or "
    "split once on rank 0 and share the indices (a file, or broadcast_object_list)."
)
STATE_REMEDY = (
    "If ranks should draw the same values (dropout masks, augmentations shared across ranks), "
    "seed them identically with accelerate.utils.set_seed(SEED); if per-rank randomness is "
    "intended (set_seed(..., device_specific=True)), this is expected."
)


def _state_remedy(kind: str) -> str:
    if kind == framework.ACCELERATE:
        return STATE_REMEDY
    return (
        "If ranks should draw the same values (dropout masks, augmentations shared across "
        f"ranks), seed them identically: {framework.seed_advice(kind)}; if per-rank randomness "
        "is intended, this is expected."
    )


def _framework(records: list[RankRecord]) -> str:
    """The run's framework as the lowest rank recorded it (every rank picks the same)."""
    for record in sorted(records, key=lambda r: int(r["rank"])):
        kind = record.get("framework")
        if isinstance(kind, str):
            return kind
    return framework.ACCELERATE  # records written before the field existed


def _site(cs: CallSiteDict | None) -> str:
    return format_site(cs) or "<unknown>"


def _groups(values: Mapping[int, object]) -> str:
    """``rank 0: a; ranks 1-7: b``: ranks grouped by value."""
    by_value: dict[object, list[int]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(value, []).append(rank)
    parts = []
    for value, ranks in by_value.items():
        parts.append(f"{ranks_phrase(ranks)}: {value}")
    return "; ".join(parts)


def signature(record: RankRecord) -> str:
    """A digest of everything the rules compare in a rank record.

    Each rank computes its own before the exchange; ranks with equal signatures are compared
    once, through one representative, so comparing thousands of ranks stays cheap.
    """
    events = [
        (
            e.get("generator"), e.get("op"), e.get("kind"), e.get("phase"),
            e.get("count"), e.get("fingerprint"), e.get("sampler"), e.get("aggregated"),
            *_file_line(e.get("call_site")), *_file_line(e.get("user_call_site")),
        )
        for e in sorted(record.get("events", []), key=lambda e: int(e.get("seq", 0)))
    ]  # fmt: skip
    payload: list[Any] = [
        events,
        record.get("states"),
        record.get("initial_seeds"),
        bool(record.get("from_start")),
    ]
    datasets = [loader["samples"] for loader in record.get("loaders", []) if "samples" in loader]
    if datasets:  # the root samples of the loaders' datasets (a per-rank split or shard)
        payload.append(datasets)
    return exchange.signature(payload)


_V = TypeVar("_V")


def _file_line(site: CallSiteDict | None) -> tuple[str | None, int | None]:
    return (site.get("file"), site.get("line")) if site else (None, None)


class _Groups:
    """Ranks with equal records, each represented by its lowest rank."""

    def __init__(self, records: list[RankRecord]) -> None:
        by_sig: dict[str, list[RankRecord]] = {}
        for r in records:  # (one record alone is its group: no signature needed)
            sig = r.get("signature") or (signature(r) if len(records) > 1 else "")
            by_sig.setdefault(str(sig), []).append(r)
        self.representatives = [group[0] for group in by_sig.values()]
        self.members = {
            int(group[0]["rank"]): sorted(int(r["rank"]) for r in group)
            for group in by_sig.values()
        }

    def expand(self, values: Mapping[int, _V]) -> dict[int, _V]:
        """Per-representative values, per rank."""
        return {m: v for rep, v in values.items() for m in self.members.get(rep, [rep])}

    def ranks(self, reps: Iterable[int]) -> list[int]:
        return sorted(m for rep in reps for m in self.members.get(rep, [rep]))


def _pre_iteration(record: RankRecord, audit: int) -> list[Event]:
    # each rank numbers its own audits: a record says which of its audits it is
    audit = int(record.get("audit_index", audit))
    events = [
        e
        for e in record.get("events", [])
        if e.get("phase") == PRE_ITERATION and e.get("audit", audit) == audit
    ]
    return sorted(events, key=lambda e: int(e.get("seq", 0)))


def _entry_state(record: RankRecord, generator: str) -> str | None:
    """The generator's state when the audit began, or else when it was first used."""
    entry = record.get("states", {}).get("entry", {})
    if generator in entry:
        return entry[generator]
    for event in sorted(record.get("events", []), key=lambda e: int(e.get("seq", 0))):
        if event.get("generator") == generator:
            return event.get("fingerprint")
    return UNSEEN


def _entry_differs(records: list[RankRecord], generator: str) -> bool:
    return len({_entry_state(r, generator) for r in records}) > 1


def _unseen_at_entry(records: list[RankRecord], generator: str) -> bool:
    return any(_entry_state(r, generator) is UNSEEN for r in records)


def _origin(records: list[RankRecord], groups: _Groups) -> list[str]:
    """Why the global torch RNG differed, as far as the records tell."""
    seeds = {int(r["rank"]): r.get("initial_seeds", {}).get(naming.TORCH_DEFAULT) for r in records}
    if None not in seeds.values() and len(set(seeds.values())) > 1:
        return [
            f"The ranks' torch seeds differ ({_groups(groups.expand(seeds))}): torch picks a "
            "random seed at "
            "import unless every rank seeds it, and set_seed(..., device_specific=True) adds "
            "the rank to the seed."
        ]
    if _entry_differs(records, naming.TORCH_DEFAULT):
        if all(r.get("from_start") for r in records):
            return ["The global torch RNG differed across ranks from the first recorded draw."]
        return [
            "The global torch RNG already differed across ranks when this audit began, although "
            "the ranks were seeded alike: run with RNGAUDIT=1 from process start to find the "
            "unequal draw."
        ]
    return []


MODE_ORDER = tuple(reversed(config.MODES))  # weakest first: every rank acts on the strictest


def strictest(modes: list[str], default: str) -> tuple[str, bool]:
    """(mode, strict) every rank acts on, from the modes the ranks declared (``warn+strict``)."""
    names = [m.split("+", 1)[0] for m in modes if m] or [default]
    known = [m for m in names if m in MODE_ORDER] or [default]
    return max(known, key=MODE_ORDER.index), any(m.endswith("+strict") for m in modes)


def protocol(
    kind: str,
    audits: dict[str, dict[str, Any]],
    modes: dict[str, list[int]],
    raised: dict[int, str],
    interrupted: list[int],
    audit: int = 0,
    why: str = "KeyboardInterrupt",
) -> list[Finding]:
    """Findings about the exchange itself: ranks in different audits, in different modes,
    a rank whose block raised, a rank interrupted. The same on every rank: they come from the
    one decision every rank reads."""
    out: list[Finding] = []
    if kind == "interrupted":
        out.append(
            Finding(
                kind=fk.RANK_INTERRUPTED,
                severity="error",
                message=f"Rank {format_ranks(interrupted)} was interrupted ({why}) "
                "during the audit; the exchange was abandoned and nothing was compared.",
                ranks=list(interrupted),
                remedy="Stop every rank (the launcher does when one exits), or rerun.",
                audit=audit,
            )
        )
    if kind == "mismatch" and audits:
        parts = [
            f"{ranks_phrase(_span_ranks(v['ranks']))} at {v['label'] or key}"
            for key, v in sorted(audits.items(), key=lambda kv: _span_ranks(kv[1]["ranks"]))
        ]
        out.append(
            Finding(
                kind=fk.AUDIT_MISMATCH,
                severity="warning",
                message="The ranks were in different audits when they exchanged: "
                + "; ".join(parts)
                + ". An audit opened on some ranks only (say under `if is_main_process:`) "
                "has nothing to be compared with; these windows were not compared.",
                ranks=sorted(r for v in audits.values() for r in _span_ranks(v["ranks"])),
                remedy="Open every audit on every rank (the same blocks in the same order), or "
                "keep rank-specific code outside audited blocks.",
                audit=audit,
                details={
                    "audits": {
                        str(v["label"] or key): _span_ranks(v["ranks"]) for key, v in audits.items()
                    }
                },
            )
        )
    if len(modes) > 1:
        mode, strict = strictest(list(modes), "raise")
        acting = mode + (" (strict)" if strict else "")
        out.append(
            Finding(
                kind=fk.MODE_MISMATCH,
                severity="warning",
                message="The ranks audit in different modes ("
                + "; ".join(f"{ranks_phrase(rs)}: {m}" for m, rs in sorted(modes.items()))
                + f"); every rank acts on the strictest, {acting}.",
                ranks=sorted(r for rs in modes.values() for r in rs),
                remedy="Give every rank the same mode= (and strict=), or the same RNGAUDIT value.",
                audit=audit,
                details={"modes": {m: rs for m, rs in sorted(modes.items())}},
            )
        )
    for rank, text in sorted(raised.items()):
        if rank in interrupted and kind == "interrupted":  # said by the finding above
            continue
        out.append(
            Finding(
                kind=fk.RANK_RAISED,
                severity="error",
                message=f"Rank {rank} raised {text} inside the audited block; its draws stop "
                "there, so they were not compared with the other ranks'.",
                ranks=[rank],
                remedy="See that rank's traceback: the exception propagates unchanged there.",
                audit=audit,
                details={"exception": text},
            )
        )
    return out


def _span_ranks(spans: Any) -> list[int]:
    """Rank lists as the decision carries them (``[[lo, hi], ...]``) or plain."""
    out: list[int] = []
    for item in spans:
        if isinstance(item, list):
            out.extend(range(int(item[0]), int(item[1]) + 1))
        else:
            out.append(int(item))
    return sorted(out)


def compare(
    records: list[RankRecord],
    world_size: int,
    missing: list[int],
    audit: int = 0,
    timeout: float | None = None,
    arrived: list[int] | None = None,
) -> list[Finding]:
    """Every finding for one audit, from the records of the ranks that arrived.

    Deterministic: every rank computes the same findings from the same records.
    """
    records = sorted(records, key=lambda r: int(r["rank"]))
    out: list[Finding] = []
    if missing:
        arrived = sorted(arrived) if arrived is not None else [int(r["rank"]) for r in records]
        out.append(
            fk.rank_missing(
                missing,
                arrived,
                where="arrive at the rngaudit exchange",
                timeout=timeout,
                unseen="their draws",
                severity="error",
                remedy="Check that every rank runs the audited block the same number of times "
                "and that none crashed or is stuck; raise timeout= / RNGAUDIT_TIMEOUT if slow.",
                audit=audit,
                details={"arrived": arrived},
            )
        )
    groups = _Groups(records)
    reps = groups.representatives
    out.extend(_aggregated(reps, audit, groups))
    if len(reps) < 2:
        return out  # every rank recorded the same: nothing differs
    mismatch = _consumption_mismatch(reps, audit, groups)
    out.extend(_sampler_divergence(reps, audit, mismatch, groups))
    if mismatch is not None:
        out.append(mismatch)
    out.extend(_state_divergence(reps, audit, mismatch is not None, groups))
    out.extend(_dataset_overlap(reps, audit, groups, len(records)))
    return out


def _dataset_overlap(
    records: list[RankRecord], audit: int, groups: _Groups, world: int
) -> list[Finding]:
    """An error where the datasets the ranks built for one loader (per-rank splits or shards of
    one root dataset) overlap beyond padding: the partition is fixed, and wrong, already.

    Identical datasets (one split, then sharded by a sampler) and disjoint ones (each rank its
    own shard) are correct; only samples held by more than one rank's dataset while the
    datasets differ are evidence of harm."""
    per_loader: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        for loader in r.get("loaders", []):
            samples = loader.get("samples")
            if isinstance(samples, dict):
                per_loader.setdefault(str(loader.get("loader")), {})[int(r["rank"])] = samples
    out: list[Finding] = []
    for name, per_rep in per_loader.items():
        per_rank = groups.expand(per_rep)
        if len(per_rank) < world or len({str(s.get("bitmap")) for s in per_rank.values()}) < 2:
            continue
        seen = overlap.measure(per_rank)
        if seen is None:
            continue
        cut = overlap.cut_from(per_rank)  # padding completes a round: it never drops one
        facts = verdict.Facts(sharding=verdict.Sharding(covers=cut or 0, complete=bool(cut)))
        decided = verdict.decide(verdict.Taken(seen, len(per_rank), "datasets"), facts)
        if decided is None:
            continue
        never = seen["root_size"] - seen["union"]
        counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(seen["per_rank"].items()))
        alike: dict[str, list[int]] = {}
        for rank, samples in sorted(per_rank.items()):
            alike.setdefault(str(samples.get("bitmap")), []).append(rank)
        same = ""
        if "None" not in alike and len(alike) < len(per_rank):  # some ranks built one dataset
            same = " By the dataset they built, the ranks group as " + (
                "; ".join(ranks_phrase(g) for g in alike.values()) + "."
            )
        out.append(
            Finding(
                kind=fk.DATASET_DIVERGENCE,
                severity=decided.severity,
                message=(
                    f"The datasets the ranks built for {name} overlap: {seen['shared']} of "
                    f"{seen['root_size']} root samples are in more than one rank's dataset and "
                    f"{never} in none ({counts} samples each). Each rank built its own split or "
                    "shard from state that differs across ranks (a per-rank seed, an unseeded "
                    "random_split, shuffle or randperm): samples are trained on by several ranks "
                    "and others by none (a random_split without a shared generator also leaks "
                    "held-out samples into training)." + same
                ),
                ranks=sorted(per_rank),
                remedy=DATASET_REMEDY,
                audit=audit,
                details={
                    "loader": name,
                    "check": "datasets",
                    "shared": seen["shared"],
                    "never": never,
                    "root_size": seen["root_size"],
                },
            )
        )
    return out


def _sampler_divergence(
    records: list[RankRecord], audit: int, mismatch: Finding | None, groups: _Groups
) -> list[Finding]:
    """The cause that proves the harm before anything is measurable: a loader's sampler drew
    its epoch-0 order before iteration (a stateful loader's prefetch in ``prepare()``) from
    state that differs across ranks. A sampler iterated by the program itself, outside any
    loader (``list(RandomSampler(ds))`` for a per-rank preview, or for a Subset whose overlap
    the dataset check measures), proves nothing: no finding."""
    per_rank = {
        int(r["rank"]): [
            (e, sampler)
            for e in _pre_iteration(r, audit)
            if (sampler := e.get("sampler")) and sampler.get("loader") and e["kind"] == DRAW
        ]
        for r in records
    }
    longest = max(len(v) for v in per_rank.values())
    out: list[Finding] = []
    reported: set[tuple[str, str | None]] = set()
    for k in range(longest):
        at_k = {rank: events[k] for rank, events in per_rank.items() if k < len(events)}
        first, sampler = next(iter(at_k.values()))
        loader_key = (str(sampler.get("chain")), sampler.get("loader"))
        if loader_key in reported:
            continue
        fps = {rank: _state_of(e) for rank, (e, _) in at_k.items()}
        outputs = {rank: s.get("output_digest") for rank, (_, s) in at_k.items()}
        if len(set(fps.values())) <= 1 and len(set(outputs.values())) <= 1:
            continue
        reported.add(loader_key)
        fps, outputs = groups.expand(fps), groups.expand(outputs)
        out.append(_sampler_finding(records, audit, first, sampler, fps, outputs, mismatch, groups))
    return out


def _state_of(event: Event) -> str | None:
    """An event's fingerprint; for an aggregate, the digest of every state folded into it."""
    aggregated = event.get("aggregated")
    if isinstance(aggregated, dict) and aggregated.get("digest") is not None:
        return f"{aggregated['digest']} (digest of {event.get('count', 1)} draws)"
    return event.get("fingerprint")


def _aggregated(records: list[RankRecord], audit: int, groups: _Groups) -> list[Finding]:
    """Say that events of generators beyond the named ones were aggregated (an info)."""
    per_family: Counter[str] = Counter()
    ranks: list[int] = []
    events = 0
    for r in records:
        mine = [e for e in _in_audit(r, audit) if naming.is_aggregate(str(e.get("generator")))]
        if mine:
            ranks.append(int(r["rank"]))
        for e in mine:
            events += 1
            per_family[naming.family(str(e["generator"]))] += int(e.get("count", 1))
    if not events:
        return []
    families = "; ".join(f"{f}: {n:,} events" for f, n in sorted(per_family.items()))
    return [
        Finding(
            kind=fk.EVENTS_AGGREGATED,
            severity="info",
            message=f"More than {naming.NAMED_PER_FAMILY} generators of one family were used "
            f"in this audit: the events of the further ones ({families}) are aggregated per "
            f"call site into {events} event(s) named "
            f"'<family>{naming.BEYOND_MARK}{naming.NAMED_PER_FAMILY}', each with its count, "
            "the first and last state fingerprint and a digest of every state (compared "
            "across ranks like a fingerprint).",
            ranks=groups.ranks(ranks),
            remedy=None,
            audit=audit,
            details={"limit": naming.NAMED_PER_FAMILY, "events": dict(sorted(per_family.items()))},
        )
    ]


def _in_audit(record: RankRecord, audit: int) -> list[Event]:
    audit = int(record.get("audit_index", audit))
    return [e for e in record.get("events", []) if e.get("audit", audit) == audit]


def _sampler_finding(
    records: list[RankRecord],
    audit: int,
    event: Event,
    sampler: SamplerDict,
    fps: dict[int, str | None],
    outputs: dict[int, str | None],
    mismatch: Finding | None,
    groups: _Groups,
) -> Finding:
    generator = str(event["generator"])
    loader = sampler.get("loader") or "a DataLoader"
    user = event.get("user_call_site")
    via = f", reached from {_site(user)}" if user and user != event.get("call_site") else ""
    lines = [
        f"Sampler {sampler['chain']} of {loader} drew its epoch-0 order before iteration "
        f"began, from {generator}, whose state differs across ranks "
        f"(state fingerprints {_groups(fps)}).",
        f"The draw ({event['op']}) ran at {_site(event.get('call_site'))}{via}.",
    ]
    kind = _framework(records)
    if kind == framework.ACCELERATE:
        lines.append(
            "Accelerate synchronizes RNG only when iteration starts, so these indices are used "
            "unsynchronized: the ranks shard different permutations, and epoch 0 duplicates "
            "some samples and drops others. Nothing else will report this."
        )
    else:
        lines.append(
            "These indices are used as drawn: the ranks shard different permutations, and "
            "epoch 0 duplicates some samples and drops others. Nothing else will report this."
        )
    lines.extend(_origin(records, groups))
    if mismatch is not None:
        lines.append(f"First unequal draw before it: {mismatch.details.get('first', '')}.")
    return Finding(
        kind=fk.SAMPLER_DRAW_DIVERGENCE,
        severity=verdict.by_cause("drawn before the sync").severity,
        message="\n".join(lines),
        ranks=sorted(fps),
        generator=generator,
        call_site=event.get("call_site"),
        user_call_site=user,
        remedy=_sampler_remedy(kind, own=not _known_sampler(sampler["chain"])),
        audit=audit,
        details={
            "sampler": sampler["chain"],
            "loader": sampler.get("loader"),
            "fingerprints": {str(r): v for r, v in sorted(fps.items())},
            "output_digests": {str(r): v for r, v in sorted(outputs.items())},
            "op": event["op"],
        },
    )


def _consumption_key(e: Event) -> tuple[str, str, str, int]:
    cs = e.get("call_site")
    file, line = (cs.get("file"), cs.get("line", 0)) if cs else (None, 0)
    return (naming.family(str(e["generator"])), str(e["op"]), str(file), int(line))


def _consumption_mismatch(records: list[RankRecord], audit: int, groups: _Groups) -> Finding | None:
    counts: dict[int, Counter[tuple[str, str, str, int]]] = {}
    first_seen: dict[tuple[str, str, str, int], tuple[int, Event]] = {}
    for r in records:
        rank = int(r["rank"])
        counter: Counter[tuple[str, str, str, int]] = Counter()
        for e in _pre_iteration(r, audit):
            if e.get("kind") not in (DRAW, SEED):
                continue
            key = _consumption_key(e)
            counter[key] += int(e.get("count", 1))
            seq = int(e.get("seq", 0))
            if key not in first_seen or seq < first_seen[key][0]:
                first_seen[key] = (seq, e)
        counts[rank] = counter
    keys = set().union(*counts.values())
    differing = [k for k in keys if len({c.get(k, 0) for c in counts.values()}) > 1]
    if not differing:
        return None
    differing.sort(key=lambda k: first_seen[k][0])
    descriptions = []
    ranks = groups.ranks(counts)
    for key in differing[:3]:
        e = first_seen[key][1]
        per_rank = groups.expand({rank: f"x{c.get(key, 0)}" for rank, c in counts.items()})
        where = _site(e.get("call_site"))
        user = e.get("user_call_site")
        via = f" (from {_site(user)})" if user and user != e.get("call_site") else ""
        family = naming.family(str(e["generator"]))
        descriptions.append(f"{e['op']} on {family} at {where}{via}: {_groups(per_rank)}")
    first_event = first_seen[differing[0]][1]
    more = f" (and {len(differing) - 3} more)" if len(differing) > 3 else ""
    return Finding(
        kind=fk.CONSUMPTION_MISMATCH,
        severity="warning",
        message="Ranks drew randomness at different call sites or counts before iteration: "
        + "; ".join(descriptions)
        + more
        + ". From that draw on, generators that were equal across ranks are not.",
        ranks=ranks,
        generator=str(first_event["generator"]),
        call_site=first_event.get("call_site"),
        user_call_site=first_event.get("user_call_site"),
        remedy=CONSUMPTION_REMEDY,
        audit=audit,
        details={"first": descriptions[0], "sites": len(differing)},
    )


def _state_divergence(
    records: list[RankRecord], audit: int, consumption_differs: bool, groups: _Groups
) -> list[Finding]:
    exits = [r.get("states", {}).get("exit", {}) for r in records]
    names = sorted(set.intersection(*(set(s) for s in exits))) if exits else []
    out = []
    kind = _framework(records)
    for name in names:
        if naming.is_explicit(name):
            continue  # explicit generators: numbering is per rank; compared via samplers
        values = {int(r["rank"]): r.get("states", {}).get("exit", {}).get(name) for r in records}
        if len(set(values.values())) <= 1:
            continue
        values = groups.expand(values)
        at_entry = _entry_differs(records, name)
        unseen = _unseen_at_entry(records, name)
        severity = "warning" if (not at_entry and not unseen and consumption_differs) else "info"
        if unseen:
            origin = "Its library was loaded during the audit, seeded differently on each rank."
        elif at_entry:
            origin = "It already differed when the audit began (per-rank or missing seeding)."
        else:
            origin = "It was equal when the audit began: unequal draws inside the audit split it."
        out.append(
            Finding(
                kind=fk.STATE_DIVERGENCE,
                severity=severity,
                message=(
                    f"{name} differs across ranks at the end of the audit ({_groups(values)}). "
                    f"{origin} {_unsynchronized(kind)}: dropout masks and augmentations drawn "
                    "from it will differ per rank."
                ),
                ranks=sorted(values),
                generator=name,
                remedy=_state_remedy(kind),
                audit=audit,
                details={"fingerprints": {str(r): v for r, v in sorted(values.items())}},
            )
        )
    return out


def _unsynchronized(kind: str) -> str:
    if kind == framework.ACCELERATE:
        return (
            "Nothing configured synchronizes it (accelerate synchronizes only the sampler's "
            "generator by default, rng_types=['generator'])"
        )
    return "Nothing synchronizes it across ranks"
