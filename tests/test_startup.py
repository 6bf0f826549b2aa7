"""``RNGAUDIT``: a whole run audited with no code change, in real subprocesses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

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
    audits: Any = merged["audits"]
    labels = [a["label"] for a in audits]
    assert labels[0].startswith("Accelerator.prepare() at repro_prepare_prefetch.py:")
    assert "first DataLoader iteration" in labels
    # then the order check at the first batch of the sharded loader: every rank agreed; it
    # names the loader as the window's record does (one name per loader in a report)
    chain = "BatchSamplerShard > BatchSampler > RandomSampler"
    built = [
        loader["loader"]
        for rank in merged["ranks"]  # type: ignore[attr-defined]
        for loader in rank.get("loaders", [])
        if loader["sampler"] == chain
    ]
    assert built and set(built) == {"StatefulDataLoader#1"}, built
    assert labels[-1] == f"epoch 0 of StatefulDataLoader#1 ({chain})"


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
    states = tmp_path / "states"
    states.mkdir()
    reports = tmp_path / "reports"
    plain = run_python([script])
    audited = run_python([script], env={**env("1", reports), "WORKER_STATE_DIR": str(states)})
    assert plain.returncode == 0 and audited.returncode == 0, audited.stderr[-2000:]
    assert plain.stdout == audited.stdout and plain.stdout.strip()
    # workers wrote no report of their own
    assert sorted(p.name for p in reports.iterdir()) == ["rank-0.json", "report.json"]
    # each spawned worker armed at start (RNGAUDIT is inherited) and detached in its loop
    seen = [json.loads(p.read_text()) for p in states.iterdir()]
    assert len(seen) == 2 and all(s == {"armed": True, "detached": True} for s in seen), seen


# Start-up and environment hygiene (issue 11, items 11-13) ---------------------------------

PTH = Path(__file__).resolve().parent.parent / "rngaudit_startup.pth"
ROOT = PTH.parent


@pytest.mark.parametrize("broken", ["wrapt", "rngaudit-missing"])
def test_a_broken_install_prints_one_line_at_start(tmp_path: Path, broken: str) -> None:
    """The .pth line runs as site.py runs it; whatever fails to import, Python starts."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH.name).write_text(PTH.read_text())
    fake = tmp_path / "fake"
    (fake / "wrapt").mkdir(parents=True)
    (fake / "wrapt" / "__init__.py").write_text('raise RuntimeError("broken\\nwrapt")\n')
    path = [str(fake), str(ROOT)] if broken == "wrapt" else []
    code = f"import site; site.addsitedir({str(site_dir)!r}); print('started')"
    proc = run_python(
        ["-S", "-c", code],
        env={"RNGAUDIT": "1", "PYTHONPATH": os.pathsep.join(path)},
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout == "started\n"
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("rngaudit: cannot start (") and "running unaudited" in proc.stderr


def test_the_pth_line_does_nothing_when_off(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH.name).write_text(PTH.read_text())
    code = f"import site, sys; site.addsitedir({str(site_dir)!r}); print('rngaudit' in sys.modules)"
    proc = run_python(["-S", "-c", code], env={"RNGAUDIT": "0", "PYTHONPATH": str(ROOT)})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "False\n", "")


WITH_BLOCK = """
import torch, rngaudit
torch.manual_seed(0)
with rngaudit.audit() as a:
    x = torch.rand(3)
print(a.report.verdict, x.tolist())
"""


@pytest.mark.parametrize(
    ("name", "value"),
    [("RNGAUDIT_TIMEOUT", "inf"), ("RNGAUDIT_TIMEOUT", "soon"), ("RNGAUDIT_REPORT_DIR", "loop")],
)
def test_a_with_block_survives_a_malformed_environment(
    tmp_path: Path, name: str, value: str
) -> None:
    if value == "loop":
        (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
        value = str(tmp_path / "loop1" / "reports")
    proc = run_python(
        ["-c", WITH_BLOCK], env={name: value, "PYTHONWARNINGS": "default"}, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok [")
    assert "Traceback" not in proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "RNGAuditWarning" in line]
    assert len(warned) == 1 and f"{name}=" in warned[0], proc.stderr
    assert (tmp_path / "rngaudit-report" / "report.json").is_file()  # the default directory


def test_rngaudit_1_with_a_malformed_timeout_runs_audited_with_the_default(
    tmp_path: Path,
) -> None:
    proc = run_python(
        ["tests/envmode/one_loader.py"],  # iterates a loader: a rank, so it writes its report
        env={"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(tmp_path), "RNGAUDIT_TIMEOUT": "1e309"},
    )
    assert proc.returncode == 0 and proc.stdout == "8\n"
    assert proc.stderr.splitlines() == [
        "rngaudit: RNGAUDIT_TIMEOUT='1e309' must be a number of seconds above 0 and at most "
        "86400; using 120"
    ]
    assert load(tmp_path / "report.json")["verdict"] == "ok"


def test_a_huge_rngaudit_value_is_cut(tmp_path: Path) -> None:
    proc = run_python(["tests/envmode/no_loader.py"], env=env("x" * 100_000, tmp_path))
    assert proc.returncode == 0 and proc.stdout == "done\n"
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 300, proc.stderr[:300]
    assert "100000 characters" in proc.stderr


def test_first_iteration_on_another_thread_leaves_no_mode_on_any_thread(tmp_path: Path) -> None:
    script = "tests/envmode/thread_iteration.py"
    plain = run_python([script])
    audited = run_python([script], env=env("1", tmp_path))
    assert audited.returncode == 0, audited.stderr[-2000:]
    assert audited.stdout.splitlines()[1] == "thread stack 0 main stack 0"
    assert audited.stdout == plain.stdout  # same batches
    assert "rngaudit" not in audited.stderr
    merged = load(tmp_path / "report.json")
    assert merged["audits"][-1]["label"] == "first DataLoader iteration"  # type: ignore[index]


def test_the_pth_line_arms_a_healthy_install(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH.name).write_text(PTH.read_text())
    venv_site = next(p for p in sys.path if p.endswith("site-packages"))
    code = (
        f"import site; site.addsitedir({str(site_dir)!r}); "
        "import rngaudit.startup as s; print(s.CONTROLLER is not None)"
    )
    path = os.pathsep.join([str(ROOT), venv_site])  # on the path, its own .pth files unread
    proc = run_python(["-S", "-c", code], env={**env("1", tmp_path), "PYTHONPATH": path})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "True\n", "")
