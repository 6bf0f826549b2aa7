"""The verdicts on published epochs: the deciders called, the findings filed and acted on."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from rngaudit import findings as fk
from rngaudit.epochs import handed, keyed, order_rules, partition, rendezvous, unsharded
from rngaudit.errors import RNGAuditError
from rngaudit.findings import Finding
from rngaudit.ranks import exchange, overlap

log = logging.getLogger("rngaudit")


class Judge:
    """Judges the epochs every rank published (at an epoch's end, later, or at a training
    forward: :class:`~rngaudit.epochs.rendezvous.Verdicts`); the same on every rank."""

    def __init__(self) -> None:
        # loaders an epoch of which partitioned the data -> (the samples it handed beyond the
        # distinct ones: the sharder's padding, the samples every rank took in all)
        self.partitioned: dict[str, tuple[int, int]] = {}

    def judge_first(self, epoch: unsharded.Epoch, published: dict[int, dict[str, Any]]) -> bool:
        """The verdict on an observed epoch at its first training step, from every rank of the
        data-parallel group (the same on each): the whole epoch each rank's sampler holds.
        True when the epoch is to be compared again at later training forwards (a loader that
        partitioned before, read lazily, whose first batches do not overlap)."""
        if any(p.get("keyed") for p in published.values()):
            self._judge_keyed_first(epoch, published)
            return False
        found: list[Finding] = []
        again = False
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            unlike = order_rules.unlike_content(published)
            summaries = {r: p.get("ahead") or {} for r, p in published.items()}
            if one_loader(summaries):
                finding, exact = order_rules.observed_overlap(
                    summaries, epoch.label, epoch.chain, epoch.epoch,
                    self._padded(epoch.key, summaries), True, ahead=True,
                )  # fmt: skip
                if exact:
                    self._partitioned(epoch.key, summaries)
            elif epoch.key in self.partitioned:  # read lazily: its first batches are evidence
                finding = order_rules.first_batches_overlap(
                    first_batches(published), epoch.label, epoch.chain, epoch.epoch
                )
                again = finding is None and not unlike
            else:
                return False
            if finding is not None and unlike:
                finding = order_rules.content_differs(finding)
            if finding is not None:
                found = _decided_early(epoch, label, finding, published)
        except Exception:
            log.warning("rngaudit: the first-step comparison could not compare", exc_info=True)
        epoch.watch.act(found, label)
        return again

    def _partitioned(self, key: str, summaries: dict[int, dict[str, Any]]) -> None:
        """An epoch of loader ``key`` partitioned the data exactly: kept with its padding."""
        seen, taken = overlap.measure(summaries), _taken(summaries)
        if seen is not None and taken >= 0:  # a pad is taken twice: by two ranks or by one
            self.partitioned[key] = (max(0, taken - int(seen["union"])), taken)

    def _padded(self, key: str, summaries: dict[int, dict[str, Any]]) -> int | None:
        """None unless an earlier epoch of loader ``key`` partitioned the data exactly; then
        the padding its sharder hands out, as that epoch showed (a sharder pads by as many
        samples each epoch of the same length), or -1 when it was of another length."""
        if key not in self.partitioned:
            return None
        padded, taken = self.partitioned[key]
        return padded if taken == _taken(summaries) else -1

    def judge_so_far(
        self,
        epoch: unsharded.Epoch,
        published: dict[int, dict[str, Any]],
        forwards: int,
        sharded_by: str | None = None,
    ) -> bool:
        """The verdict on a lazily read epoch of a loader that partitioned before (or that
        ``sharded_by``, a DistributedSampler subclass, shards from draws that differ), from what
        every rank of the group had been handed by its ``forwards``-th training forward of it
        (the same on each rank); True when decided (a finding: raised or warned)."""
        found: list[Finding] = []
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            finding = order_rules.first_batches_overlap(
                published, epoch.label, epoch.chain, epoch.epoch, forwards, sharded_by
            )
            if finding is not None:
                found = _decided_early(epoch, label, finding, published)
        except Exception:
            log.warning("rngaudit: the observed partition could not compare", exc_info=True)
        epoch.watch.act(found, label)
        return bool(found)

    def warn_first(
        self, epoch: unsharded.Epoch, missing: list[int], arrived: list[int], timeout: float
    ) -> None:
        """Ranks of the data-parallel group did not reach the training forward: a warning."""
        finding = fk.rank_missing(
            missing, arrived,
            where="reach the first training step of an observed epoch", timeout=timeout,
            unseen="the epochs they were about to train on", severity="warning",
            remedy="Nothing to fix if only some ranks train this module; the epoch is still "
            "compared when every rank has drawn it.",
            details={"loader": epoch.label, "epoch": epoch.epoch, "check": "first-step"},
        )  # fmt: skip
        label = f"first training step of epoch {epoch.epoch} of {epoch.label}"
        with contextlib.suppress(Exception):
            epoch.watch.session.add_check(label, [finding], arrived)
        epoch.watch.act([finding], label)

    def judge_all(self, ready: list[tuple[unsharded.Epoch, list[dict[str, Any]]]]) -> None:
        """Judge every epoch, oldest first, each one's findings filed in the report; the
        first error is raised once all are judged (an earlier epoch's error never leaves a
        later one uncompared and unreported)."""
        first: RNGAuditError | None = None
        for epoch, got in ready:
            try:
                self.judge(epoch, got)
            except RNGAuditError as exc:
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def judge(self, epoch: unsharded.Epoch, published: list[dict[str, Any]]) -> None:
        """The verdict on one observed epoch, from every rank's summary (the same on every
        rank): raised or warned as the watch's mode says."""
        if any(r.get("keyed") for r in published):
            self._judge_keyed(epoch, published)
            return
        found: list[Finding] = []
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            summaries = {int(r["rank"]): r for r in published}
            if (epoch.key, epoch.epoch) in rendezvous.DECIDED:
                return  # judged, with a finding, before its first training step
            left = any(s.get("partial") for s in summaries.values())
            if not one_loader(summaries, left):
                if left:
                    log.info("rngaudit: epoch %d of %s was left early and not compared (what "
                             "a rank took is unknown)", epoch.epoch, epoch.label)  # fmt: skip
                return
            unlike = order_rules.unlike_content(summaries)
            # a data-parallel signal only when every rank published one; the overlap is then
            # judged within this rank's data-parallel group
            data_parallel, summaries = _within_group(summaries)
            finding, exact = order_rules.observed_overlap(
                summaries, epoch.label, epoch.chain, epoch.epoch,
                self._padded(epoch.key, summaries), data_parallel,
                left=handed.phrase(summaries) if left else None,
            )  # fmt: skip
            if exact and not left:  # a partial epoch is no evidence that the loader partitions
                self._partitioned(epoch.key, summaries)
            if finding is not None and unlike:
                finding = order_rules.content_differs(finding)
            if finding is not None:
                found.append(finding)
                epoch.watch.session.add_check(label, found, ranks_of(published))
        except Exception:
            log.warning("rngaudit: the observed partition could not compare", exc_info=True)
        epoch.watch.act(found, label)

    def _judge_keyed_first(
        self, epoch: unsharded.Epoch, published: dict[int, dict[str, Any]]
    ) -> None:
        """The data-parallel group's first batches of a keyed epoch, at the module's first
        training forward on it: an id two ranks' first batches share is an error (no padding
        comes first), raised before the step."""
        found: list[Finding] = []
        label = f"first batches of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            if not all(p.get("keyed") for p in published.values()):
                return
            firsts = {r: p.get("first_ids") or {} for r, p in published.items()}
            name = str(published[min(published)].get("key_name"))
            finding = keyed.verdict(firsts, epoch.label, name, epoch.epoch, 0, True, [], True)
            if finding is not None:
                found.append(finding)
                rendezvous.DECIDED.add((epoch.key, epoch.epoch))
                epoch.watch.session.add_check(label, found, published)
        except Exception:
            log.warning("rngaudit: the keyed first-step comparison failed", exc_info=True)
        epoch.watch.act(found, label)

    def _judge_keyed(self, epoch: unsharded.Epoch, published: list[dict[str, Any]]) -> None:
        """The verdict on one keyed epoch (the same on every rank): raised or warned."""
        found: list[Finding] = []
        label = f"keyed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            if (epoch.key, epoch.epoch) in rendezvous.DECIDED:
                return  # judged, with a finding, before its first training step
            summaries = {int(r["rank"]): r for r in published}
            if not all(s.get("keyed") for s in summaries.values()):
                return
            data_parallel, summaries = _within_group(summaries)
            mine = summaries.get(exchange.current_rank(), {})
            partial = sorted(r for r, s in summaries.items() if s.get("partial"))
            finding = keyed.verdict(
                summaries, epoch.label, str(mine.get("key_name")), epoch.epoch,
                mine.get("batch_size"), data_parallel, partial,
            )  # fmt: skip
            if finding is not None:
                found.append(finding)
                epoch.watch.session.add_check(label, found, ranks_of(published))
        except Exception:
            log.warning("rngaudit: the keyed partition could not compare", exc_info=True)
        epoch.watch.act(found, label)


def _taken(summaries: dict[int, dict[str, Any]]) -> int:
    """The samples every rank took in all (-1 when some rank's count is unknown)."""
    counts = [s.get("taken") for s in summaries.values()]
    return sum(c for c in counts if type(c) is int) if all(type(c) is int for c in counts) else -1


def ranks_of(records: Any) -> list[int]:
    """The ranks of exchanged records (those that took part in a check)."""
    return [int(r["rank"]) for r in records if isinstance(r, dict) and "rank" in r]


def _decided_early(
    epoch: unsharded.Epoch, label: str, finding: Finding, published: dict[int, Any]
) -> list[Finding]:
    """A finding on an epoch before its end: filed in the report, and the epoch's end does not
    judge it again."""
    rendezvous.DECIDED.add((epoch.key, epoch.epoch))
    epoch.watch.session.add_check(label, [finding], published)
    return [finding]


def _within_group(summaries: dict[int, dict[str, Any]]) -> tuple[bool, dict[int, dict[str, Any]]]:
    """Whether every rank published a data-parallel signal, and the summaries of this rank's
    data-parallel group (all of them when there is no signal or one group)."""
    data_parallel = all(s.get("data_parallel") for s in summaries.values())
    mine = exchange.current_rank()
    groups = summaries.get(mine, {}).get("data_parallel") or []
    group = next((g for g in groups if mine in g), None)
    if data_parallel and group is not None and 1 < len(group) < len(summaries):
        summaries = {r: s for r, s in summaries.items() if r in group}
    return data_parallel, summaries


def first_batches(published: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each rank's first batch as a partition summary (unknown where it was not read)."""
    out: dict[int, dict[str, Any]] = {}
    for rank, record in published.items():
        first, size = record.get("first"), record.get("root_size")
        out[rank] = {"known": False}
        if isinstance(first, list) and isinstance(size, int) and first:
            tape = partition.Tape([], size)
            tape.take([first])
            out[rank] = tape.summary()
    return out


def one_loader(summaries: dict[int, dict[str, Any]], left: bool = False) -> bool:
    """Whether the ranks' published epochs are one loader's: the same root dataset (identity
    and size), as many index batches on every rank (a data-parallel loop steps together);
    ``left``: an epoch some rank left early, whose length, where every rank knows it, is the
    same on every rank. Ranks whose sampler shards itself or that read datasets of their own
    cut from one root (per-rank Subsets) may take different numbers of batches (a split of n
    samples gives some ranks one more)."""
    if len(summaries) < 2 or not all(s.get("known") for s in summaries.values()):
        return False
    same = all(
        len({str(s.get(k)) for s in summaries.values()}) == 1 for k in ("identity", "root_size")
    )
    split = all(s.get("shards_self") is True for s in summaries.values())
    if split or overlap.cut_from(summaries) is not None:  # meant to be split: lengths differ
        return same
    if not left:
        return same and len({str(s.get("batches")) for s in summaries.values()}) == 1
    lengths = {
        s.get("length") if s.get("partial") else s.get("batches") for s in summaries.values()
    }
    return same and (None in lengths or len(lengths) == 1)
