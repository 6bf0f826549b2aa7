"""``RNGAUDIT``: a whole run audited with no code change, in real subprocesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_python, torchrun

pytestmark = pytest.mark.timeout(600)
REPRO = "examples/repro_prepare_prefetch.py"


def env(mode: str, report: Path) -> dict[str, str]:
    return {"RNGAUDIT": mode, "RNGAUDIT_REPORT_DIR": str(report), "RNGAUDIT_TIMEOUT": "60"}


def load(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def line_of(path: str, marker: str) -> int:
    for number, text in enumerate(Path(path).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(marker)


def test_unmodified_repro_fails_unseeded(tmp_path: Path) -> None:
    proc = torchrun(REPRO, "noseed", env=env("1", tmp_path))
    assert proc.returncode != 0
    assert "RNGDivergenceError" in proc.stderr
    assert "sampler-draw-divergence" in proc.stderr
    merged = load(tmp_path / "report.json")
    assert merged["verdict"] == "error" and merged["world_size"] == 2
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]  # type: ignore[attr-defined]
    # the launcher inherits RNGAUDIT but is not a rank: it wrote nothing over the ranks' files
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rank-0.json",
        "rank-1.json",
        "report.json",
    ]
    assert load(tmp_path / "rank-0.json")["world_size"] == 2
    run_id = load(tmp_path / "rank-0.json")["run_id"]
    assert run_id == load(tmp_path / "rank-1.json")["run_id"] == merged["run_id"]
    assert run_id not in ("", "none")  # torchrun's default TORCHELASTIC_RUN_ID is "none"


def test_unmodified_repro_passes_seeded(tmp_path: Path) -> None:
    proc = torchrun(REPRO, "seed", env=env("1", tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "union=96/96" in proc.stdout
    merged = load(tmp_path / "report.json")
    assert merged["verdict"] in ("ok", "warning")
    labels = [a["label"] for a in merged["audits"]]  # type: ignore[index]
    assert labels[0].startswith("Accelerator.prepare() at repro_prepare_prefetch.py:")
    assert "first DataLoader iteration" in labels
    # then the order check at the first batch of the sharded loader: every rank agreed
    chain = "BatchSamplerShard > BatchSampler > RandomSampler"
    assert labels[-1] == f"epoch 0 of BatchSamplerShard#1 ({chain})"


def test_stray_draw_on_rank0_is_named_and_warn_mode_finishes(tmp_path: Path) -> None:
    script = "tests/envmode/stray_draw.py"
    proc = torchrun(script, env={**env("warn", tmp_path), "PYTHONWARNINGS": "default"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "union=" in proc.stdout and "union=16/16" not in proc.stdout  # really corrupted
    merged = load(tmp_path / "report.json")
    assert merged["verdict"] == "error"
    by_kind = {f["kind"]: f for f in merged["findings"]}  # type: ignore[attr-defined]
    assert by_kind["sampler-draw-divergence"]["severity"] == "error"
    stray = by_kind["consumption-mismatch"]
    assert stray["call_site"]["file"].endswith(script)
    assert stray["call_site"]["line"] == line_of(script, "stray-draw")
    assert stray["ranks"] == [0, 1]
    assert f"stray_draw.py:{line_of(script, 'stray-draw')}" in stray["message"]
    assert "RNGAuditWarning" in proc.stderr


def test_unknown_value_prints_one_line_and_runs_unaudited(tmp_path: Path) -> None:
    proc = run_python(["tests/envmode/no_loader.py"], env=env("yes-please", tmp_path))
    assert proc.returncode == 0
    assert proc.stdout.strip() == "done"
    lines = [line for line in proc.stderr.splitlines() if "rngaudit" in line]
    assert len(lines) == 1 and "RNGAUDIT='yes-please'" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_process_that_is_not_a_rank_writes_nothing(tmp_path: Path) -> None:
    # no process group, no DataLoader: a helper script, pip, a launcher
    proc = run_python(["tests/envmode/no_loader.py"], env=env("1", tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done" and "rngaudit" not in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_ranks_without_loaders_compare_before_destroy_process_group(tmp_path: Path) -> None:
    script = "tests/envmode/group_no_loader.py"
    proc = torchrun(script, env=env("1", tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = load(tmp_path / "report.json")
    assert merged["world_size"] == 2  # recorded while the group existed
    assert merged["audits"][-1]["label"] == "destroy_process_group()"  # type: ignore[index]
    for rank in (0, 1):
        assert load(tmp_path / f"rank-{rank}.json")["world_size"] == 2
    stray = [f for f in merged["findings"] if f["kind"] == "consumption-mismatch"]  # type: ignore[attr-defined]
    assert stray and stray[0]["call_site"]["line"] == line_of(script, "rank-0-draw")


def test_a_new_run_moves_the_previous_run_aside(tmp_path: Path) -> None:
    script = "tests/envmode/one_loader.py"
    first = run_python([script], env=env("1", tmp_path))
    assert first.returncode == 0, first.stderr
    first_id = load(tmp_path / "report.json")["run_id"]
    second = run_python([script], env=env("1", tmp_path))
    assert second.returncode == 0, second.stderr
    second_id = load(tmp_path / "report.json")["run_id"]
    assert first_id != second_id
    assert load(tmp_path / "previous" / "report.json")["run_id"] == first_id
    assert load(tmp_path / "previous" / "rank-0.json")["run_id"] == first_id
    assert load(tmp_path / "rank-0.json")["run_id"] == second_id


def test_spawned_workers_are_not_perturbed(tmp_path: Path) -> None:
    script = "tests/envmode/spawn_workers.py"
    plain = run_python([script])
    audited = run_python([script], env=env("1", tmp_path))
    assert plain.returncode == 0 and audited.returncode == 0, audited.stderr[-2000:]
    assert plain.stdout == audited.stdout and plain.stdout.strip()
    # workers wrote no report of their own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json", "report.json"]
