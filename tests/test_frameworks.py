"""Where users train: accelerate launch, mp.spawn, Lightning, the Hugging Face Trainer.

Real 2-rank runs on CPU (gloo). Each rank logs the sample indices it trained on in epoch 0
(``tests/frameworks/truth.py``), so every row asserts the measured truth and the verdict.
Audited rows whose truth is corrupted run in ``warn`` mode so that training goes on and the
truth is logged; the verdict is read from the report. One launch per row (module fixtures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import run_python

pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytestmark = pytest.mark.timeout(300)

ACCELERATE = str(Path(sys.executable).parent / "accelerate")
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    report_dir: Path
    truth_dir: Path

    def report(self) -> dict[str, Any]:
        return json.loads((self.report_dir / "report.json").read_text())  # type: ignore[no-any-return]

    def files(self) -> list[str]:
        return sorted(p.name for p in self.report_dir.iterdir() if p.is_file())

    def truth(self) -> tuple[int, int, int]:
        """(distinct samples, duplicated samples, total) trained on by both ranks in epoch 0."""
        files = [self.truth_dir / f"rank-{r}.json" for r in (0, 1)]
        seen = [i for path in files for i in json.loads(path.read_text())]
        return len(set(seen)), len(seen) - len(set(seen)), len(seen)


def launch(tmp: Path, args: list[str], mode: str | None) -> Run:
    """Run ``args`` (audited in ``mode`` when given) with a fresh report and truth dir."""
    report, truth = tmp / "report", tmp / "truth"
    truth.mkdir(parents=True)
    env = {"TRUTH_DIR": str(truth), "HF_HUB_OFFLINE": "1", "RNGAUDIT_TIMEOUT": "60"}
    env["RNGAUDIT_REPORT_DIR"] = str(report)
    if mode is not None:
        env["RNGAUDIT"] = mode
    proc = run_python(args, env=env, timeout=280)
    return Run(proc.returncode, proc.stdout, proc.stderr, report, truth)


def errors(run: Run) -> list[str]:
    return [f["kind"] for f in run.report()["findings"] if f["severity"] == "error"]


def assert_one_run(run: Run) -> None:
    """Every file under the report directory is this run's: no rank wrote one before it knew
    its rank and the run's id (which a later write would have set aside into previous/ or
    taken for another run's), and no rank was told that another run writes there."""
    run_id = run.report()["run_id"]
    found = {
        str(p.relative_to(run.report_dir)): json.loads(p.read_text())
        for p in run.report_dir.rglob("*.json")
    }
    assert {name: doc["run_id"] for name, doc in found.items()} == dict.fromkeys(found, run_id)
    assert all(doc["rank"] == int(name[5:-5]) for name, doc in found.items() if "rank-" in name)
    assert [p.name for p in run.report_dir.iterdir() if p.is_dir()] == []
    assert "another run" not in run.stderr, run.stderr[-3000:]


def assert_clean(run: Run, finished: int = 2) -> None:
    """Finished on every rank, no error, one file per rank (the launcher wrote none)."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("finished") == finished, run.stdout[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    report = run.report()
    assert report["world_size"] == 2 and errors(run) == []
    assert run.files() == ["rank-0.json", "rank-1.json", "report.json"]
    assert_one_run(run)
    assert run.truth() == (32, 0, 32)  # intact: every sample once


# -- accelerate launch and mp.spawn: the stateful-loader bug, caught on every rank ----------


@pytest.fixture(scope="module")
def accelerate_launch(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("accelerate")
    return launch(
        tmp,
        ["-m", "rngaudit", "run", "--mode", "warn", "--report-dir", str(tmp / "report"), "--",
         ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2",
         "examples/repro_prepare_prefetch.py", "noseed"],
        None,
    )  # fmt: skip


def test_accelerate_launch_ranks_are_audited(accelerate_launch: Run) -> None:
    run = accelerate_launch
    line = next(x for x in run.stdout.splitlines() if "union=" in x)
    assert "union=96/96" not in line  # measured: corrupted
    assert run.returncode == 1, run.stderr[-3000:]  # rngaudit run: error findings
    assert "sampler-draw-divergence" in errors(run)
    assert run.report()["world_size"] == 2
    assert run.files() == ["rank-0.json", "rank-1.json", "report.json"]
    assert_one_run(run)


@pytest.fixture(scope="module", params=[None, "1"], ids=["unaudited", "RNGAUDIT=1"])
def mp_spawn_subset(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str | None, Run]:
    tmp = tmp_path_factory.mktemp("spawn_subset")
    return request.param, launch(tmp, ["tests/frameworks/mp_spawn_subset.py"], request.param)


def test_mp_spawn_per_rank_subsets_raise_before_the_first_step(
    mp_spawn_subset: tuple[str | None, Run],
) -> None:
    """Issue 33's row, once found only at destroy_process_group(): the truth (unaudited) is
    corrupted; audited, every rank raises at its loader's first iteration, before any step."""
    mode, run = mp_spawn_subset
    if mode is None:  # the truth
        assert run.returncode == 0, run.stderr[-3000:]
        distinct, duplicates, total = run.truth()
        assert total == 32 and distinct < 32 and duplicates > 0  # measured: corrupted
        return
    assert run.returncode != 0
    assert " step" not in run.stdout  # no training step on the corrupted data
    assert "[dataset-divergence]" in run.stderr, run.stderr[-3000:]
    assert "mp_spawn_subset.py" in run.stderr and "in worker" in run.stderr


@pytest.fixture(scope="module")
def mp_spawn(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("spawn")
    return launch(tmp, ["tests/frameworks/mp_spawn_train.py"], "warn")


def test_mp_spawn_children_are_armed(mp_spawn: Run) -> None:
    run = mp_spawn
    assert run.returncode == 0, run.stderr[-3000:]
    distinct, duplicates, total = run.truth()
    assert total == 32 and distinct < 32 and duplicates > 0  # measured: corrupted
    assert "sampler-draw-divergence" in errors(run)
    assert run.report()["world_size"] == 2
    assert run.files() == ["rank-0.json", "rank-1.json", "report.json"]
    assert_one_run(run)


# -- Lightning --------------------------------------------------------------------------------

LIGHTNING = "tests/frameworks/lightning_train.py"


@pytest.fixture(scope="module")
def lightning_ddp(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # started as `python train.py`: Lightning launches rank 1 and creates the group in fit()
    return launch(tmp_path_factory.mktemp("ddp"), [LIGHTNING, "ddp", "same"], "1")


def test_lightning_ddp_correct_run_finishes_clean(lightning_ddp: Run) -> None:
    assert_clean(lightning_ddp)  # both ranks run the script to its end


@pytest.fixture(scope="module")
def lightning_spawn(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("ddp_spawn")
    return launch(tmp, [LIGHTNING, "ddp_spawn", "same", "callback"], "1")


def test_lightning_ddp_spawn_ranks_write_their_files(lightning_spawn: Run) -> None:
    assert_clean(lightning_spawn, finished=1)


def test_lightning_callback_audits_setup_to_first_batch(lightning_spawn: Run) -> None:
    labels = [a["label"] for a in lightning_spawn.report()["audits"]]
    assert any(label.startswith("audit at ") for label in labels), labels


@pytest.fixture(scope="module")
def lightning_rank_seed(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # seed_everything(42 + rank): the injected DistributedSampler's seed is per rank;
    # a validation loader runs first (sanity check)
    tmp = tmp_path_factory.mktemp("rank_seed")
    return launch(tmp, [LIGHTNING, "ddp", "rank", "val"], "warn")


def test_lightning_rank_seed_truth_is_corrupted(lightning_rank_seed: Run) -> None:
    assert lightning_rank_seed.returncode == 0, lightning_rank_seed.stderr[-3000:]
    distinct, duplicates, total = lightning_rank_seed.truth()
    assert total == 32 and distinct < 32 and duplicates > 0


def test_lightning_rank_seed_with_validation_loader_is_an_error(lightning_rank_seed: Run) -> None:
    assert errors(lightning_rank_seed)
    # rank 1 (started by Lightning without RANK) wrote nothing before the group existed: no
    # file of its own early run id, as rank-0.json or set aside into previous/
    assert_one_run(lightning_rank_seed)


# -- Hugging Face Trainer ---------------------------------------------------------------------

HF = "tests/frameworks/hf_train.py"


@pytest.fixture(scope="module")
def hf_clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory.mktemp("hf"), [*TORCHRUN, HF, "callback"], "1")


def test_hf_trainer_correct_run_finishes_clean(hf_clean: Run) -> None:
    assert_clean(hf_clean)
    labels = [a["label"] for a in hf_clean.report()["audits"]]
    assert any(label.startswith("audit at ") for label in labels), labels  # the callback


HF_CORRUPTED = {
    "seed": ["seed=rank"],
    "data_seed": ["data_seed=rank"],
    "group_by_length": ["group_by_length", "seed=rank"],
    "evaluate_first": ["eval_first", "seed=rank"],
}


@pytest.fixture(scope="module", params=sorted(HF_CORRUPTED))
def hf_corrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp(f"hf_{request.param}")
    return launch(tmp, [*TORCHRUN, HF, *HF_CORRUPTED[request.param]], "warn")


def test_hf_trainer_per_rank_seed_truth_is_corrupted(hf_corrupted: Run) -> None:
    assert hf_corrupted.returncode == 0, hf_corrupted.stderr[-3000:]
    distinct, duplicates, total = hf_corrupted.truth()
    assert total == 32 and distinct < 32 and duplicates > 0


def test_hf_trainer_per_rank_seed_is_an_error(hf_corrupted: Run) -> None:
    assert errors(hf_corrupted)
