"""The order check of loaders a known class shards: at an epoch's first batch and at its end.

At the first batch of each epoch of a sharded loader, before the batch is returned, the ranks
exchange what they are about to shard (the dataset's index mapping, the DistributedSampler's
seed/epoch, the teed order) and every rank raises on a difference
(:func:`~rngaudit.epochs.order_rules.compare`); at the epoch's end they exchange the samples
each was handed (:func:`~rngaudit.epochs.order_rules.partition_overlap`).
"""

from __future__ import annotations

import logging
import sys
import types
import weakref
from typing import Any, cast

from rngaudit import library_samplers, peek, schema, verdict
from rngaudit.epochs import order_rules, partition, rendezvous, sharding, suspended, unsharded
from rngaudit.epochs.judging import Judge, ranks_of
from rngaudit.epochs.registry import LoaderState, Registry, ShardedEpoch, Watch
from rngaudit.epochs.surgery import Surgery, arm_modules, draw_summary
from rngaudit.findings import Finding
from rngaudit.ranks import data_parallel, exchange, peers

log = logging.getLogger("rngaudit")


class ShardedCheck:
    """The exchanges and verdicts of the loaders a known class shards."""

    def __init__(self, registry: Registry, surgery: Surgery, judge: Judge) -> None:
        self.registry = registry
        self.surgery = surgery
        self.judge = judge  # what rendezvous hands a followed epoch's verdict to

    def first_batch(self, iterator: Any, batch: Any = None) -> None:
        """An epoch's first batch of a sharded loader: the ranks compare what they shard."""
        try:
            nodes = library_samplers.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if shard is None:  # an iterable dataset that splits one stream between ranks
                shard = sharding.stream_shard(peek.attr(iterator, "_dataset"))
                if shard is None:
                    return
                nodes = [shard]
            with self.registry.lock:
                watch = self.registry.watch_for(shard)
                if watch is None:
                    return
                state = self.registry.state(shard)
                if not watch.every_epoch and state.checks > 0:
                    return
                record = self._record(iterator, nodes, shard, state)
            record.update(peers.first_fields(shard, batch))  # type: ignore[typeddict-item]
        except Exception:  # the auditor must never break the loader
            log.warning("rngaudit: could not prepare the order check", exc_info=True)
            return
        planned = (peek.attr(iterator, "__dict__") or {}).pop("_rngaudit_planned", None)
        found = self._compare(record, watch, state, planned, sharding.allowance(shard))
        del planned  # the epoch's list, kept only for this check
        if any(f.details.get("shares") == "unread" for f in found):
            self._follow_drawn(iterator, shard, state, record, watch)
        with self.registry.lock:
            state.checks += 1
            state.previous = record
            if not watch.every_epoch and self.registry.pending.get(shard) is watch:
                del self.registry.pending[shard]
                self.surgery.release()
        watch.act(found, f"epoch {record['epoch']} of {record['loader']}")

    def _follow_drawn(
        self,
        iterator: Any,
        shard: Any,
        state: LoaderState,
        record: schema.EpochRecord,
        watch: Watch,
    ) -> None:
        """A DistributedSampler subclass drew its epoch from state that differs across ranks
        and yields it lazily (its shares could not be read ahead, a warning): under the one
        data-parallel module of the whole world, what each rank was handed is compared at its
        training forwards 2, 4, 8, ... of the epoch (:func:`~rngaudit.epochs.rendezvous.follow`),
        each before the next step; the epoch's end is the check without one. Every rank takes
        this branch (the finding came from the same records); never raises."""
        try:
            tape = (peek.attr(iterator, "__dict__") or {}).get("_rngaudit_tape")
            where = exchange.distributed()
            if tape is None or tape.closed or where is None or not tape.known:
                return
            arm_modules()
            modules = data_parallel.modules()
            replicas = peek.integer(peek.attr(shard, "num_replicas"), -1)
            if len(modules) != 1 or replicas != where[1]:
                return  # which module's steps every rank takes is not known: the epoch's end
            if data_parallel.group_of(modules[0]) != list(range(where[1])):
                return
            epoch = unsharded.Epoch(
                shard_key(state), record["epoch"], state.label, record["chain"], watch
            )
            torch = sys.modules.get("torch")
            item = rendezvous.Started(
                epoch,
                weakref.ref(tape),
                {
                    "training": bool(torch.is_grad_enabled()) if torch is not None else False,
                    "sharded_by": f"{type(shard).__name__} (a DistributedSampler subclass)",
                },
                self.judge,
            )
            rendezvous.follow(item, modules[0], forwards=0)
        except Exception:
            log.debug("rngaudit: could not follow the epoch as it is drawn", exc_info=True)

    def _record(
        self, iterator: Any, nodes: list[Any], shard: Any, state: LoaderState
    ) -> schema.EpochRecord:
        record: schema.EpochRecord = {
            "loader": state.label,
            "epoch": state.checks,
            "chain": library_samplers.chain_name(nodes),
            "shuffling": sharding.is_shuffling(nodes),
            "dataset": (
                sharding.describe_stream(shard)
                if shard is nodes[0] and sharding.stream_shard(shard) is not None
                else sharding.describe_dataset(peek.attr(iterator, "_dataset"))
            ),
            "content": sharding.describe_content(peek.attr(iterator, "_dataset")),
            "sampler_state": None,
            # batches this epoch had yielded when its first batch came back (1, or more after a
            # resume: a StatefulDataLoader restored mid-epoch)
            "position": peek.integer(peek.attr(iterator, "_num_yielded"), -1),
            "order": [],
            "draws": [],
        }
        shares = sharding.stream_shares(shard) if shard is nodes[0] else None
        if shares is not None:  # a stream split by shards: which shards this rank reads
            record["shares"] = shares
        if sharding.is_distributed_sampler(shard):
            record["sampler_state"] = sharding.distributed_sampler_state(shard)
            # what its __iter__ drew for this epoch's first index batch (a subclass's own order)
            record["draws"] = list(iterator.__dict__.get("_rngaudit_draws") or [])
        else:
            record["order"] = list(state.tape.batches)
            record["draws"] = list(state.tape.draws)
        return record

    def _compare(
        self,
        record: schema.EpochRecord,
        watch: Watch,
        state: LoaderState,
        planned: Any = None,
        allowed: verdict.Sharding = verdict.UNKNOWN,
    ) -> list[Finding]:
        record["dataset_draws"] = split_draws(watch.session)
        exchanged = self._swap(
            cast(dict[str, Any], record), f"epoch/{state.index}/{state.checks}", watch, "order"
        )
        if exchanged is None:
            return []
        try:
            found = order_rules.compare(
                cast(list[schema.EpochRecord], exchanged[0]), exchanged[1], watch.settings.timeout
            )
        except Exception:
            log.warning("rngaudit: the order check could not compare", exc_info=True)
            return []
        found += peers.check_first(exchanged[0], record["loader"], record["chain"])
        if order_rules.shares_decide(found):
            found = self._measure_planned(found, record, watch, state, planned, allowed)
        repeat = order_rules.repeated(record, state.previous)
        if repeat is not None:
            found.append(repeat)
        label = f"epoch {record['epoch']} of {record['loader']} ({record['chain']})"
        label += peers.label(exchanged[0])  # the layout its peers were held to, if stated
        try:
            watch.session.add_check(label, found, ranks_of(exchanged[0]))
        except Exception:
            log.warning("rngaudit: could not write the order check's report", exc_info=True)
        return found

    def epoch_end(self, context: ShardedEpoch, tape: partition.Tape) -> None:
        """The ranks compare the samples each was handed this epoch; every rank raises on an
        overlap beyond padding."""
        watch, shard, chain, epoch = context.watch, context.shard, context.chain, context.epoch
        found: list[Finding] = []
        rendezvous.unfollow(tape)
        with self.registry.lock:
            state = self.registry.state(shard)
        label = f"partition of epoch {epoch} of {state.label} ({chain})"
        if (shard_key(state), epoch) in rendezvous.DECIDED:
            self.surgery.release()  # found as it was drawn, on every rank: not judged again
            return
        try:
            record: dict[str, Any] = {
                "loader": state.label,
                "epoch": epoch,
                "chain": chain,
                "partition": tape.summary(),
                **peers.end_fields(shard),
            }
            result = self._swap(record, f"partition/{state.index}/{epoch}", watch, "partition")
            if result is not None:
                summaries = {int(r["rank"]): r["partition"] for r in result[0] if "partition" in r}
                summaries, stated = peers.as_replicas(summaries, result[0])  # across replicas
                if stated is not None:
                    label += f" across {stated.describe()}"
                finding = order_rules.partition_overlap(
                    summaries, state.label, chain, epoch, sharding.allowance(shard)
                )
                if finding is not None:
                    found.append(finding)
                    watch.session.add_check(label, found, ranks_of(result[0]))
                elif stated is not None:  # the report says which replicas were judged
                    watch.session.add_check(label, found, ranks_of(result[0]))
        except Exception:
            log.warning("rngaudit: the partition check could not compare", exc_info=True)
        finally:
            self.surgery.release()
        watch.act(found, label)

    def _measure_planned(
        self,
        found: list[Finding],
        record: schema.EpochRecord,
        watch: Watch,
        state: LoaderState,
        planned: Any,
        allowed: verdict.Sharding,
    ) -> list[Finding]:
        """The sampler drew its order from state that differs across ranks while its seed and
        epoch agree: the harm is decided by what the ranks are about to be handed. Each rank's
        whole epoch, read from the list its sampler's ``__iter__`` returned (no draw), is
        exchanged (every rank takes this branch: the rules saw the same records); see
        :func:`~rngaudit.epochs.order_rules.planned_overlap` for the verdict."""
        mine = {
            "loader": record["loader"],
            "epoch": record["epoch"],
            "planned": planned_summary(planned) or {"known": False},
        }
        result = self._swap(mine, f"planned/{state.index}/{state.checks}", watch, "order")
        rows = result[0] if result is not None else []
        summaries = {int(r["rank"]): r["planned"] for r in rows if "planned" in r}
        complete = len(rows) == len(summaries) > 1
        return order_rules.planned_overlap(summaries, found, complete, allowed)

    def _swap(
        self, record: dict[str, Any], key: str, watch: Watch, what: str
    ) -> tuple[list[dict[str, Any]], list[int]] | None:
        """Exchange ``record`` under ``key``: every rank's record (groups expanded) and the
        ranks that did not arrive, or None. The signature covers everything the rules read but
        the rank: equal ranks form one group, and each rank fetches one record per group
        (O(groups), not O(world), per rank and check)."""
        comparable = {k: v for k, v in record.items() if k not in ("rank", "signature")}
        record["signature"] = exchange.signature(comparable)
        where = exchange.distributed()
        record["rank"] = where[0] if where is not None else 0
        info = {"label": f"{what} check of {record['loader']}", "mode": watch.settings.mode}
        try:
            result = exchange.exchange(record, key, watch.settings.timeout, info=info)
        except Exception:
            log.warning("rngaudit: the %s check could not exchange", what, exc_info=True)
            return None
        return cast(list[dict[str, Any]], expand_groups(result.records)), list(result.missing)

    # -- the check -----------------------------------------------------------------------------


def shard_key(state: LoaderState) -> str:
    """The cross-rank key of a loader a known class shards, as an epoch compared as it is
    drawn names it (:meth:`ShardedCheck._follow_drawn`)."""
    return f"shard/{state.index}"


def planned(
    source: Any, tape: partition.Tape | None, index_sampler: Any = None
) -> tuple[Any, Any] | None:
    """This rank's whole epoch as its sampler's ``__iter__`` returned it, read without a draw
    or a ``next``: the sequence a builtin iterator walks (``__reduce__`` hands it over), found
    as the index iterator itself, the iterator a generator ``__iter__`` delegates to with
    ``yield from`` (its sequence's length must be the sampler's: the whole epoch, not one of
    several segments), or either as ``BatchSampler.__iter__``'s ``sampler_iter``, with
    ``tape`` (whose maps take it to root samples); None when the sampler yields lazily (a
    generator that yields item by item: what its loop body hands out is its own) or the epoch
    cannot be mapped. Only the sequence is kept here (no copy): it is summarised by
    :func:`planned_summary` if the check needs it (draws alone differ)."""
    try:
        if tape is None or not tape.known:
            return None
        sampler = index_sampler
        it = source
        if isinstance(source, types.GeneratorType) and suspended.delegate(source) is None:
            frame = source.gi_frame
            it = frame.f_locals.get("sampler_iter") if frame is not None else None
            sampler = peek.attr(index_sampler, "sampler")
        inner = suspended.delegate(it)
        found = suspended.sequence(inner) if inner is not None else None
        if found is None:
            return None  # exhausted, or of another kind
        items = found[0]
        if inner is not it and peek.size(sampler) != len(items):
            return None  # one segment of a generator's epoch, or a length it does not tell
        return items, tape
    except Exception:
        log.debug("rngaudit: could not read the epoch the sampler returned", exc_info=True)
        return None


def planned_summary(planned: Any) -> dict[str, Any] | None:
    """The root samples of the epoch :func:`planned` kept, as a tape summarises them."""
    try:
        if not isinstance(planned, tuple):
            return None
        items, tape = planned
        values = suspended.ints(items)
        if values is None:
            return None
        epoch = partition.Tape(tape.maps, tape.root_size)
        epoch.take_indices(values, 1)
        summary = epoch.summary()
        return dict(summary, levels=tape.levels) if summary.get("known") else None
    except Exception:
        log.debug("rngaudit: could not read the epoch the sampler returned", exc_info=True)
        return None


def expand_groups(exchanged: list[dict[str, Any]]) -> list[schema.EpochRecord]:
    """Every rank's epoch record: a rank not fetched (``same_as``: equal to that rank's record,
    signature and all) gets a copy of it under its own rank; one whose group's record could
    not be read (a late reader after the owners cleared it) is left out."""
    full = {int(r["rank"]): r for r in exchanged if "same_as" not in r}
    out: list[dict[str, Any]] = []
    for r in exchanged:
        if "same_as" not in r:
            out.append(r)
        elif r.get("same_as") in full:
            out.append(dict(full[int(r["same_as"])], rank=int(r["rank"])))
    return cast(list[schema.EpochRecord], out)  # the ranks' own records, decoded from JSON


def split_draws(session: Any) -> list[schema.SamplerDraw]:
    """The first recorded draw that built a dataset split (random_split), to name in a finding."""
    own = getattr(session, "records", {}).get(getattr(session, "rank", 0), {})
    for event in own.get("events", []):
        if any(site.get("function") == "random_split" for site in event.get("chain", [])):
            return [draw_summary(event)]
    return []
