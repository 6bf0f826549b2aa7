"""Real 2-rank torchrun scenarios: the audit's verdict must match the epoch-0 partition measured.

Two launches run every scenario in tests/distributed/scenarios.py in turn: audited, and (the
deterministic ones) without rngaudit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "distributed" / "scenarios.py"
NPROC = 2
RUN_TIMEOUT_S = 400
# RNGAUDIT_MATRIX_NO_AUDIT=1: run the scenarios without rngaudit and check only the partition.
NO_AUDIT = os.environ.get("RNGAUDIT_MATRIX_NO_AUDIT", "") not in ("", "0")

# Expectations are stated here, independently of the scenario script.
MUST_RAISE = [
    "repro_noseed",
    "set_seed_device_specific",
    "extra_draw_rank0",
    "extra_draw_rank0_seedable",
]
MUST_STAY_CLEAN = [
    "repro_seed",
    "stateful_unseeded_workers0",
    "not_stateful_unseeded_workers2",
    "plain_ddp_distributed_sampler",
]
ALL = MUST_RAISE + MUST_STAY_CLEAN
# Seeded (or DistributedSampler) set-ups: the same items on every launch, audited or not.
DETERMINISTIC = [
    "set_seed_device_specific",
    "extra_draw_rank0",
    "extra_draw_rank0_seedable",
    "repro_seed",
    "plain_ddp_distributed_sampler",
]

needs_audit = pytest.mark.skipif(NO_AUDIT, reason="RNGAUDIT_MATRIX_NO_AUDIT is set")


@dataclass
class Run:
    scenario: str
    outdir: Path
    returncode: int
    output: str
    seconds: float
    results: dict[int, dict[str, Any]] = field(default_factory=dict)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])

    def checked(self) -> dict[int, dict[str, Any]]:
        """Per-rank results, after asserting that the launch itself succeeded."""
        assert self.returncode == 0, (
            f"{self.scenario}: torchrun exited {self.returncode} after {self.seconds:.0f} s\n"
            f"{self.tail()}"
        )
        missing = [r for r in range(NPROC) if r not in self.results]
        assert not missing, f"{self.scenario}: no result file for ranks {missing}\n{self.tail()}"
        return self.results


def _launch(scenarios: list[str], outdir: Path, audit: bool) -> dict[str, Run]:
    """One torchrun launch running ``scenarios`` in turn; results in ``outdir/<scenario>/``."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={NPROC}", str(SCRIPT), ",".join(scenarios), str(outdir),
    ]  # fmt: skip
    if not audit:
        cmd.append("--no-audit")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RNGAUDIT", None)  # the scenarios audit explicitly; no start-up hook on top
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM lets torchrun stop its ranks (each in its own session); then force.
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        output += f"\n[test] killed after {RUN_TIMEOUT_S} s"
    seconds = time.perf_counter() - t0
    runs = {}
    for scenario in scenarios:
        run = Run(scenario, outdir / scenario, proc.returncode, output, seconds)
        for rank in range(NPROC):
            path = run.outdir / f"result-rank{rank}.json"
            if path.is_file():
                run.results[rank] = json.loads(path.read_text())
        runs[scenario] = run
    return runs


@pytest.fixture(scope="module")
def run_scenario(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two torchrun launches in all, shared by every test: every scenario audited, in turn, and
    the deterministic ones without rngaudit (each scenario starts from a fresh process's RNG)."""
    cache: dict[bool, dict[str, Run]] = {}

    def get(scenario: str, audit: bool = not NO_AUDIT) -> Run:
        if audit not in cache:
            names = ALL if audit or NO_AUDIT else DETERMINISTIC
            outdir = tmp_path_factory.mktemp("matrix" + ("" if audit else "-noaudit"))
            cache[audit] = _launch(names, outdir, audit)
        return cache[audit][scenario]

    return get


# --------------------------------------------------------------------------- (a) reality


@pytest.mark.parametrize("scenario", ALL)
def test_partition_is_what_the_scenario_claims(run_scenario: Any, scenario: str) -> None:
    results = run_scenario(scenario).checked()
    partitions = [results[r]["partition"] for r in range(NPROC)]
    assert all(p == partitions[0] for p in partitions), "ranks measured different partitions"
    p = partitions[0]
    summary = f"union={p['union']}/{p['n']} missing={p['missing']} duplicates={p['duplicates']}"
    assert sum(p["per_rank_counts"]) == p["n"], summary  # every rank got its full share
    if scenario in MUST_RAISE:
        assert p["missing"] > 0 and p["duplicates"] > 0, f"expected corruption: {summary}"
    else:
        assert (p["union"], p["missing"], p["duplicates"]) == (p["n"], 0, 0), summary


# --------------------------------------------------------------------------- (b) verdict


def _findings(result: dict[str, Any]) -> list[dict[str, Any]]:
    report = result["audit"]["report"]
    assert report is not None, f"rank {result['rank']}: a.report is not set"
    return list(report["findings"])


@needs_audit
@pytest.mark.parametrize("scenario", MUST_RAISE)
def test_harmful_divergence_raises_on_every_rank(run_scenario: Any, scenario: str) -> None:
    results = run_scenario(scenario).checked()
    for rank, res in results.items():
        audit = res["audit"]
        assert audit["raised"], f"rank {rank} did not raise"
        assert audit["error_type"] == "RNGDivergenceError", f"rank {rank}: {audit['error_type']}"
        assert audit["report"]["verdict"] == "error", f"rank {rank}: {audit['report']}"
        kinds = {(f["kind"], f["severity"]) for f in _findings(res)}
        assert ("sampler-draw-divergence", "error") in kinds, f"rank {rank}: {kinds}"


@needs_audit
@pytest.mark.parametrize("scenario", MUST_STAY_CLEAN)
def test_clean_setup_does_not_raise(run_scenario: Any, scenario: str) -> None:
    results = run_scenario(scenario).checked()
    for rank, res in results.items():
        audit = res["audit"]
        assert not audit["raised"], (
            f"rank {rank} raised {audit['error_type']}: {audit['error_message']}"
        )
        errors = [f for f in _findings(res) if f["severity"] == "error"]
        assert not errors, f"rank {rank}: error findings on a clean set-up: {errors}"
        assert audit["report"]["verdict"] in ("ok", "warning"), audit["report"]


# --------------------------------------------------------------------------- (c) agreement


@needs_audit
@pytest.mark.parametrize("scenario", ALL)
def test_verdict_agrees_with_measured_partition(run_scenario: Any, scenario: str) -> None:
    """The key property: rngaudit raises exactly when the data partition is really corrupted."""
    results = run_scenario(scenario).checked()
    for rank, res in results.items():
        p = res["partition"]
        corrupted = p["missing"] > 0 or p["duplicates"] > 0
        assert res["audit"]["raised"] == corrupted, (
            f"rank {rank}: raised={res['audit']['raised']} ({res['audit']['error_type']}) but "
            f"union={p['union']}/{p['n']} missing={p['missing']} duplicates={p['duplicates']}"
        )


@needs_audit
@pytest.mark.parametrize("scenario", DETERMINISTIC)
def test_audit_does_not_change_what_it_observes(run_scenario: Any, scenario: str) -> None:
    """Auditing must not draw from or reseed any generator: same items per rank as unaudited."""
    audited = run_scenario(scenario).checked()[0]["partition"]["per_rank_items"]
    plain = run_scenario(scenario, audit=False).checked()[0]["partition"]["per_rank_items"]
    assert audited == plain


# --------------------------------------------------------------------------- (d) report files


@needs_audit
@pytest.mark.parametrize("scenario", ALL)
def test_report_files_written(run_scenario: Any, scenario: str) -> None:
    run = run_scenario(scenario)
    run.checked()
    report_dir = run.outdir / "report"
    names = [*(f"rank-{r}.json" for r in range(NPROC)), "report.json"]
    absent = [n for n in names if not (report_dir / n).is_file()]
    present = sorted(p.name for p in report_dir.iterdir()) if report_dir.is_dir() else None
    assert not absent, f"missing {absent} in {report_dir} (present: {present})"
    merged = json.loads((report_dir / "report.json").read_text())
    expected = ("error",) if scenario in MUST_RAISE else ("ok", "warning")
    assert merged["verdict"] in expected, merged.get("findings")
    assert merged["verdict"] == run.results[0]["audit"]["report"]["verdict"]
