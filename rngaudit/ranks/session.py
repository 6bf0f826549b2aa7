"""A process's audit session: concludes audits (exchange, compare) and keeps its report files."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rngaudit import forksafe, launcher, report_files, schema
from rngaudit.audit_report import SCHEMA_VERSION, AuditReport
from rngaudit.capture.rank_record import merge_deferred, rank_record, summarize_loaders
from rngaudit.capture.recorder import RECORDER, Window
from rngaudit.errors import (
    RNGAuditWarning,
)
from rngaudit.findings import Finding, verdict_of
from rngaudit.ranks import exchange, rules
from rngaudit.ranks import store as protocol
from rngaudit.ranks.policy import act

_private_random = random.Random(os.urandom(8))  # never the user's generators
_sessions: dict[Path, Session] = {}
_lock = forksafe.lock()
# Exchanges per audit identity (label) in this process, whatever the report directory: the
# store keys of two sessions audited at one line must differ (they share one store).
_occurrences: dict[str, int] = {}
log = logging.getLogger("rngaudit")


class _Target:
    """Where a session's files go: its report directory, or ``run-<id>/`` inside it once
    another run wrote there too (two jobs given one directory)."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.claimed = False  # this run set the directory's other runs aside and wrote there
        self.moved: Path | None = None

    def place(self, run_id: str, rank: int) -> Path:
        """The directory to write into now. At the top level, a file this run writes (its
        rank file, or ``report.json``, which rank 0 writes) naming another run, after this
        run set every other run aside, means another run is writing there at the same time:
        this run moves to ``run-<id>/`` (its whole report: every write holds all its audits),
        with one warning. Runs the writer's jobs one at a time (no lock needed)."""
        if self.moved is not None:
            return self.moved
        if not self.claimed:
            return self.top
        names = [report_files.rank_path(self.top, rank), report_files.merged_path(self.top)]
        other = next(
            (
                found
                for path in names
                if (found := report_files.run_id_of(path)) not in (None, run_id)
            ),
            None,
        )
        if other is None:
            return self.top
        self.moved = self.top / f"run-{run_id}"
        self.moved.mkdir(exist_ok=True)
        report_files.set_aside(self.moved, run_id)
        warnings.warn(
            f"rngaudit: another run (run id {other}) is writing its report into {self.top} "
            f"at the same time as this one (run id {run_id}); this run's report is written to "
            f"{self.moved} from now on, complete (give each job its own report_dir= or "
            "RNGAUDIT_REPORT_DIR)",
            RNGAuditWarning,
            stacklevel=2,
        )
        return self.moved


@dataclass
class Finished:
    """What :meth:`Session.finish` concluded."""

    report: AuditReport
    window: Window | None  # the next segment's window; None when the window was closed
    exit_states: dict[str, str | None]  # generator states at the end


@dataclass
class Closing:
    """How :meth:`Session.finish` closes an audit window, and whom it tells what."""

    timeout: float
    strict: bool
    close: bool  # end the window; otherwise keep it open and start its next segment
    exception: str | None = None  # what the audited block raised, for the rank record
    interrupted: bool = False  # this rank is leaving (KeyboardInterrupt): do not wait
    left: str | None = None  # why it is leaving (default: its exception)
    identity: str | None = None  # what pairs the ranks' audits (default: the label)
    background_write: bool = False  # write the files on rngaudit's writer thread
    acting: bool = True  # raise or warn as the report's mode says (:func:`act`)
    on_closed: Callable[[list[Any]], None] | None = None  # (loaders built) when the window ends
    on_concluded: Callable[[Finished | None], None] | None = None  # before acting
    local_findings: list[Finding] | None = None  # this rank's own, joining after acting
    spare_user_exception: bool = False  # the block raised: a failure to conclude is logged
    stacklevel: int = 3  # the caller whose line a warning names


def _new_run_id() -> str:
    """A fresh id per process; at the first exchange every rank adopts rank 0's, so the id
    names one launch (torchrun's ``TORCHELASTIC_RUN_ID`` is ``none`` unless set)."""
    return f"{_private_random.getrandbits(64):016x}"


class Session:
    """Everything audited into one report directory by this process."""

    def __init__(self, report_dir: Path, mode: str) -> None:
        self.report_dir = report_dir
        self.mode = mode
        self.run_id = _new_run_id()
        self.rank = launcher.rank()
        self.world_size = launcher.world_size()
        self.joined = False  # has exchanged through a process group: rank and world are known
        # The run id every rank of the group uses (agreed at joining or adopted at an
        # exchange): until then a process launched as one of several ranks writes nothing.
        self.agreed = False
        self.target = _Target(report_dir)
        self.pending: list[tuple[int, str, schema.RankRecord]] = []  # deferred: no group yet
        self._set_aside_for: str | None = None  # run id whose predecessors were moved away
        self.audits: list[schema.AuditDict] = []
        self.findings: list[Finding] = []
        self.records: dict[int, schema.RankRecord] = {}
        self._next_index = 0
        self._lock = forksafe.lock()
        self.resumes: list[str] = []  # "Accelerator.load_state() at train.py:40", this rank's

    def forked(self) -> None:
        """In a forked child that starts its own audit (a rank forked by ``notebook_launcher``
        or ``start_processes(start_method="fork")``): what the parent recorded is the parent's.
        Its rank and world size are read again when it next exchanges or writes."""
        _private_random.seed(os.urandom(8))  # the siblings inherited one state
        _occurrences.clear()
        self._lock = forksafe.lock()  # another thread may have held it at fork
        self.run_id = _new_run_id()
        self.rank = launcher.rank()
        self.world_size = launcher.world_size()
        self.joined = False
        self.agreed = False
        self.target = _Target(self.report_dir)
        self.pending = []
        self._set_aside_for = None
        self.audits, self.findings, self.records = [], [], {}
        self.resumes = []
        self._next_index = 0

    def identify(self) -> None:
        """This process's rank and world size: the process group's when one exists; before it
        joins one, the launcher's (``RANK`` / ``WORLD_SIZE``, which a forking launcher sets in
        the child after the fork)."""
        where = exchange.process_group()
        if where is not None:
            self.rank, self.world_size = where
            self.joined = True
            if not self.agreed and where[1] > 1:
                agreed = protocol.agree(protocol.run_id(self.report_dir), self.run_id)
                if agreed:
                    self.run_id, self.agreed = agreed, True
        elif not self.joined:
            self.rank = launcher.rank()
            self.world_size = launcher.world_size()

    def reserve(self) -> int:
        """The index of a new audit in this session."""
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def conclude(
        self, index: int, label: str, record: schema.RankRecord, how: Closing
    ) -> AuditReport:
        """Exchange ``record`` with the other ranks, compare, write the files.

        Ranks pair their audits by identity: ``how.identity`` (default: the label, the call site
        that opened the audit) and how many times this rank exchanged under it, so an audit
        opened on some ranks only pairs with nothing and shifts nothing after it. The ranks
        also exchange their mode: the report's ``mode`` is the strictest, which every rank acts
        on (``audits[-1]["strict"]`` when any rank is strict). ``how.interrupted``: this rank is
        leaving (KeyboardInterrupt): publish, tell the others, do not wait.

        When the launcher announced more than one rank (``WORLD_SIZE``) but no process group
        exists yet (Lightning creates it inside ``fit()``), the audit is deferred: its record
        joins the next audit concluded with a process group, and an empty report comes back.
        """
        where = exchange.process_group()
        if where is None and not self.joined and launcher.world_size() > 1:
            return self._defer(index, label, record)
        deferred: list[str] = []
        if self.pending:
            with self._lock:
                pending, self.pending = self.pending, []
            deferred = [lbl for _, lbl, _ in pending]
            record = merge_deferred([rec for _, _, rec in pending], record, index)
        self.identify()
        record = {**record, "rank": self.rank, "run_id": self.run_id, "audit_index": index}
        if exchange.distributed() is not None:  # lets compare() group equal ranks
            record["signature"] = rules.signature(record)
        declared = self.mode + ("+strict" if how.strict else "")
        result = self._exchange(record, label, declared, how)
        if where is not None:  # after destroy_process_group(): keep the world size known
            self.world_size = result.world_size
        exchanged = cast(list[schema.RankRecord], result.records)  # what the ranks published
        arrived = sorted(exchanged, key=lambda r: int(r["rank"]))
        if arrived and arrived[0].get("run_id"):
            self.run_id = str(arrived[0]["run_id"])  # adopt the lowest rank's run id
            self.agreed = True
        found = _decide(result, arrived, index, how.timeout)
        mode, acting_strict = rules.strictest(list(result.modes) or [declared], self.mode)
        entry: schema.AuditDict = {"index": index, "label": label, "verdict": verdict_of(found)}
        if len(result.modes) > 1:
            entry["mode"] = mode  # what every rank acts on
            entry["strict"] = acting_strict
        if deferred:
            entry["deferred"] = deferred  # audits that waited for the process group
        found = self._keep(found, entry, arrived, record, how.background_write)
        return AuditReport(
            findings=found,
            ranks=[as_filed(rec, index, self.run_id) for rec in arrived],
            world_size=result.world_size,
            run_id=self.run_id,
            mode=mode,
            audits=[self.audits[-1]],
        )

    def _defer(self, index: int, label: str, record: schema.RankRecord) -> AuditReport:
        """Keep an audit made before the process group exists for the next one concluded
        with it (its record joins that one's); an empty report comes back."""
        with self._lock:
            self.pending.append((index, label, record))
        return AuditReport(
            run_id=self.run_id,
            world_size=self.world_size,
            mode=self.mode,
            audits=[{"index": index, "label": label, "verdict": "ok", "deferred": True}],
        )

    def _exchange(
        self, record: schema.RankRecord, label: str, declared: str, how: Closing
    ) -> exchange.Exchanged:
        """Exchange the signed record under the audit's identity and occurrence."""
        name = how.identity or label
        with _lock:
            occurrence = _occurrences.get(name, 0)
            _occurrences[name] = occurrence + 1
        key = protocol.audit(name, occurrence) if exchange.distributed() else "local"
        info = {"label": label, "mode": declared, "raised": record.get("exception")}
        if how.interrupted:
            info["left"] = how.left or record.get("exception") or "KeyboardInterrupt"
        # rank 0 writes the merged report: it fetches every record (up to FETCH_ALL_MAX ranks)
        return exchange.exchange(
            record, key, how.timeout, info=info, leave=how.interrupted, report_all=self.rank == 0
        )

    def _keep(
        self,
        found: list[Finding],
        entry: schema.AuditDict,
        arrived: list[schema.RankRecord],
        record: schema.RankRecord,
        background: bool,
    ) -> list[Finding]:
        """File an audit's findings and records in the session and write its files; returns
        the findings kept (an info finding an earlier audit made is not repeated)."""
        index = entry["index"]
        with self._lock:
            found = [f for f in found if not self._repeats_info(f)]
            self._name_resume(found)
            for rec in arrived:
                self._accumulate(rec, index)
            if self.rank not in {int(r["rank"]) for r in arrived}:
                self._accumulate(record, index)  # arrived after the decision: still its file
            self.findings.extend(found)
            self.audits.append(entry)
            self.write(background=background)
        return found

    def finish(
        self, window: Window, label: str, entry: dict[str, str | None], how: Closing
    ) -> Finished | None:
        """The one close path of an audit window (``audit()`` and the whole-run audit):
        events -> loaders -> states -> rank record -> exchange -> compare -> write -> act.

        ``how.close``: end ``window`` (the states at its end close the record); otherwise keep it
        open (paused while this rank concludes) and start its next segment as a new audit,
        whose window comes back in :attr:`Finished.window`. ``on_closed(built)`` runs right
        after the window ends (also when reading it failed), ``on_concluded(finished)`` once the
        verdict is known (``None`` when concluding failed), before acting. ``acting``: raise or
        warn as the report's mode says (:func:`act`); ``local_findings`` (this rank's own, not
        part of the shared verdict) join the report after that. ``spare_user_exception``: the
        block raised, so a failure to conclude is logged and None returned (the user's
        exception propagates unchanged).
        """
        with contextlib.ExitStack() as kept_open:
            if not how.close:  # the window stays open, paused while this rank concludes
                kept_open.enter_context(RECORDER.paused())
            record, exit_states = _read_window(window, label, entry, how)
            try:
                report = self.conclude(window.index, label, record, how)
            except BaseException as failure:
                if how.on_concluded is not None:
                    how.on_concluded(None)
                if how.spare_user_exception and isinstance(failure, Exception):
                    log.warning("rngaudit: could not conclude the audit", exc_info=True)
                    return None
                raise
            segment = None if how.close else RECORDER.new_segment(window, self.reserve())
            done = Finished(report, segment, exit_states)
            if how.on_concluded is not None:
                how.on_concluded(done)
        try:
            if how.acting:
                acting_strict = bool(report.audits[-1].get("strict", how.strict))
                act(report, report.mode, acting_strict, stacklevel=how.stacklevel + 1)
        finally:
            report.findings.extend(how.local_findings or ())
        return done

    def _name_resume(self, found: list[Finding]) -> None:
        """Say where the run resumed in each warning or error: a torchrun restart attempt (the
        same on every rank of the attempt) and the checkpoint restores this rank made."""
        attempt = launcher.restart_attempt()
        if not attempt and not self.resumes:
            return
        parts = [f"torchrun restart attempt {attempt}"] if attempt else []
        parts += self.resumes
        for finding in found:
            if finding.severity == "info" or "resumed" in finding.details:
                continue
            finding.details["resumed"] = parts
            finding.message += (
                f" The run resumed before this ({'; '.join(parts)}): check that every rank "
                "restored the same epoch, sampler position and generator states."
            )

    def _repeats_info(self, finding: Finding) -> bool:
        """An info finding already made, word for word but the audit, by an earlier audit."""
        if finding.severity != "info":
            return False
        same = (finding.kind, finding.generator, str(finding.details))
        return any((f.kind, f.generator, str(f.details)) == same for f in self.findings)

    def add_check(
        self, label: str, found: list[Finding], ranks: Iterable[int] | None = None
    ) -> None:
        """A check made outside an audit window (the per-epoch order check). Its files are
        written on the writer thread (off the loader's path: about 1 ms an epoch) unless it
        found an error, which is on disk before it raises. ``ranks``: those that took part;
        one whose audit window has not concluded yet gets a bare record (no events, filled
        when its window concludes), so the report holds one record per rank that reached it."""
        with self._lock:
            for rank in sorted(set(ranks or ())):
                if rank not in self.records:
                    self.records[rank] = self._bare_record(rank)
            index = self.reserve()
            self._name_resume(found)
            for finding in found:
                finding.audit = index
            self.findings.extend(found)
            self.audits.append({"index": index, "label": label, "verdict": verdict_of(found)})
            self.write(background=not any(f.severity == "error" for f in found))

    def add_finding(self, finding: Finding) -> None:
        """A finding that arrives after its audit (DataLoader worker checks)."""
        with self._lock:
            if finding.details.get("path") is not None:  # a later check of the same path
                self.findings = [f for f in self.findings if f.key() != finding.key()]
            self.findings.append(finding)
            self.write()

    def _bare_record(self, rank: int) -> schema.RankRecord:
        """A rank that reached a check before any of its audits concluded: named, no events."""
        own = rank == self.rank
        return {
            "rank": rank,
            "pid": os.getpid() if own else None,
            "host": launcher.node() if own else None,
            "events": [],
            "loaders": [],
            "states": {},
            "run_id": self.run_id,
            "environment": None,
        }

    def _accumulate(self, rec: schema.RankRecord, index: int) -> None:
        filed = as_filed(rec, index, self.run_id)
        acc = self.records.setdefault(filed["rank"], {**filed, "events": [], "loaders": []})
        if acc.get("pid") is None and filed.get("pid") is not None:  # a bare record (a check
            acc["pid"], acc["host"] = filed["pid"], filed.get("host")  # came first) gets them
        acc["events"].extend(filed["events"])
        acc["loaders"].extend(filed["loaders"])
        for key in ("states", "run_id", "environment", "exception", "same_as"):
            if key in filed:
                acc[key] = filed[key]

    def write_known(self) -> bool:
        """Write what is filed (this rank named, with a bare record if none concluded): the
        last resort when concluding an audit failed. Never raises; True when written."""
        try:
            with self._lock:
                self.records.setdefault(self.rank, self._bare_record(self.rank))
            self.write()
            report_files.flush()
            return report_files.merged_path(self.target.moved or self.report_dir).exists() or (
                report_files.rank_path(self.target.moved or self.report_dir, self.rank).exists()
            )
        except Exception:
            log.debug("rngaudit: could not write what was filed", exc_info=True)
            return False

    def report(self) -> AuditReport:
        with self._lock:
            return AuditReport(
                findings=list(self.findings),
                ranks=[self.records[r] for r in sorted(self.records)],
                world_size=self.world_size,
                run_id=self.run_id,
                mode=self.mode,
                audits=list(self.audits),
            )

    def at_exit(self) -> None:
        """Say so when audits waited for a process group that never came."""
        if self.pending:
            labels = ", ".join(label for _, label, _ in self.pending)
            sys.stderr.write(
                f"rngaudit: {len(self.pending)} audit(s) ({labels}) waited for a process group "
                f"(WORLD_SIZE={launcher.world_size()}) that was never created: "
                "not compared\n"
            )
            self.pending = []

    def settled(self) -> bool:
        """Whether this process may write its rank file: it is alone (no process group of
        several ranks, none announced), or it joined the group and knows the run's id. A rank
        that Lightning starts learns its rank only when the group exists (it has no ``RANK``)."""
        where = exchange.process_group()
        if where is None and not self.joined:
            return launcher.world_size() <= 1
        if (where[1] if where is not None else self.world_size) <= 1:
            return True
        return self.agreed

    def write(self, background: bool = False) -> None:
        """Write this rank's file, and on rank 0 the merged report.

        ``background``: the files are written on rngaudit's writer thread, in order, after
        this returns (:func:`report_files.flush` waits for them). The first write of a run
        moves files an earlier run left in the directory to ``previous/`` (see
        :func:`report_files.set_aside`): a new run never destroys them.
        """
        with self._lock:
            self.identify()
            if not self.settled():
                return  # written once the rank and the run id are known (the next write)
            # What is written is this moment's report: its lists and each rank's record are
            # copied now, under the lock (what was filed is not changed later, only added
            # to); building the documents and encoding them is the job's (the writer's).
            merged = self.report()
            merged.ranks = [_frozen(record) for record in merged.ranks]
            own = next((r for r in merged.ranks if r["rank"] == self.rank), None)
            if own is None:
                own = {"rank": self.rank, "events": [], "states": {}}
            rank_doc: schema.RankFileDict = {
                "schema_version": SCHEMA_VERSION,
                "run_id": self.run_id,
                "world_size": self.world_size,
                "rank": self.rank,
                "mode": self.mode,
                "verdict": merged.verdict,
                "audits": merged.audits,
                "findings": [],  # (merged.findings', encoded by the job)
                "record": own,
            }
            report_dir, run_id, rank = self.report_dir, self.run_id, self.rank
            set_aside = self._set_aside_for != run_id
            self._set_aside_for = run_id
            target = self.target

            def job() -> None:
                rank_doc["findings"] = [f.to_dict() for f in merged.findings]
                rank_text = report_files.encode(rank_doc)
                merged_text = report_files.encode(merged.to_dict()) if rank == 0 else None
                if set_aside:
                    report_files.set_aside(report_dir, run_id)
                    target.claimed = True
                where = target.place(run_id, rank)
                report_files.write_text(report_files.rank_path(where, rank), rank_text)
                if merged_text is not None:
                    report_files.write_text(report_files.merged_path(where), merged_text)

            try:
                if not report_dir.is_dir():  # (a stat: mkdir's EEXIST costs ~0.2 ms here)
                    report_dir.mkdir(parents=True, exist_ok=True)  # fails now, not later
                if background:
                    report_files.WRITER.submit(job)
                else:
                    report_files.flush()  # earlier background writes first: files stay in order
                    job()
            except OSError as exc:  # the verdict still stands; the report stays in memory
                self._set_aside_for = None
                warnings.warn(
                    f"rngaudit: cannot write the report to {self.report_dir}: {exc.strerror or exc}"
                    " (set report_dir= or RNGAUDIT_REPORT_DIR to a writable directory)",
                    RNGAuditWarning,
                    stacklevel=2,
                )


def _frozen(record: schema.RankRecord) -> schema.RankRecord:
    """A filed record as it is now (its event and loader lists grow with later audits)."""
    return {**record, "events": list(record["events"]), "loaders": list(record["loaders"])}


def _read_window(
    window: Window, label: str, entry: dict[str, str | None], how: Closing
) -> tuple[schema.RankRecord, dict[str, str | None]]:
    """This rank's record of the window (or segment) and the generator states at its end.
    ``how.close``: the window ends here (``how.on_closed(built)`` runs right after, also when
    reading it failed); otherwise it stays open (paused by the caller)."""
    if how.close:
        built: list[Any] = []
        try:
            events = RECORDER.events_since(window)
            loaders = summarize_loaders(RECORDER, events)
            built = RECORDER.built_loaders()
        finally:
            exit_states = RECORDER.end(window)  # undoes every patch at the outermost
            if how.on_closed is not None:
                how.on_closed(built)
    else:
        events = RECORDER.events_since(window)
        loaders = summarize_loaders(RECORDER, events)
        RECORDER.forget_loaders()  # each segment lists the loaders built in it
        exit_states = RECORDER.snapshot()
    states = {"entry": entry, "exit": exit_states}
    record = rank_record(
        label, events, loaders, states, from_start=not how.close, exception=how.exception
    )
    return record, exit_states


def _decide(
    result: exchange.Exchanged, arrived: list[schema.RankRecord], index: int, timeout: float
) -> list[Finding]:
    """The findings of one exchanged audit: the protocol's (modes, labels, ranks that raised
    or left), then the rules' over the ranks that arrived."""
    # a rank whose block raised stopped drawing early: compare the others among themselves
    comparable = [r for r in arrived if int(r["rank"]) not in result.raised]
    found = rules.protocol(
        result.kind,
        result.audits,
        result.modes,
        result.raised,
        result.interrupted,
        index,
        why=result.why,
    )
    if result.kind in ("complete", "abandoned"):
        found += rules.compare(
            comparable, result.world_size, result.missing, index, timeout, result.arrived
        )
    return found


def as_filed(rec: schema.RankRecord, index: int, run_id: str) -> schema.RankRecord:
    """A rank's record of audit ``index`` in the shape the report files and ``AuditReport.ranks``
    keep (docs/report-format.md): what the exchange needed only (signature, label, framework,
    seeds, audit index) left out; its loaders tagged with the audit."""
    filed: schema.RankRecord = {
        "rank": int(rec["rank"]),
        "pid": rec.get("pid"),
        "host": rec.get("host"),
        "events": list(rec.get("events", [])),
        "loaders": [{**loader, "audit": index} for loader in rec.get("loaders", [])],
        "states": rec.get("states", {}),
        "run_id": run_id,
        "environment": rec.get("environment"),
    }
    if rec.get("exception"):  # what its block raised (kept: it is why it stopped)
        filed["exception"] = rec["exception"]
    if rec.get("same_as") is not None:  # not fetched: equal to that rank's (see its file)
        filed["same_as"] = rec["same_as"]
    return filed


def for_dir(report_dir: Path, mode: str) -> Session:
    """The session of this process for ``report_dir`` (created on first use)."""
    key = report_dir.resolve()
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = Session(key, mode)
        session.mode = mode
        return session
