"""accelerate's own distributed test scripts (shipped in its wheel) pass audited as unaudited.

``tests/frameworks/accelerate_scripts.py`` runs ``test_distributed_data_loop.py`` (minus its
GPU-only join tests) and ``test_script.py``'s ``main()`` at world 2 on CPU (gloo). Their own
assertions are the truth: every sample once per epoch (even_batches padding included), the
same items for the same seed, different items for another data seed. Measured: the
unaudited run passes every step; under ``RNGAUDIT=1`` 8 of them died with a partition-overlap
error (accelerate's even_batches padding counted as duplication). Both runs must pass every
step, and the audited one must find no error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import torchrun

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(400)

SCRIPT = "tests/frameworks/accelerate_scripts.py"
STEPS = [
    "data_loop even_batches and join",
    "data_loop shuffle=False",
    "data_loop shuffle=True",
    "data_loop batch_sampler",
    "data_loop sampler is a BatchSampler",
    "data_loop stateful_dataloader",
    "data_loop stateful_dataloader_save_state",
    "test_script main",
]


@pytest.fixture(scope="module", params=[None, "1"], ids=["unaudited", "RNGAUDIT=1"])
def scripts_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str | None, int, str, str, Path]:
    tmp = tmp_path_factory.mktemp("accelerate_scripts")
    env = {"ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "RNGAUDIT_TIMEOUT": "60",
           "PYTHONWARNINGS": "default",  # the join test asserts a warning
           "RNGAUDIT_REPORT_DIR": str(tmp / "report"), "STEPS_DIR": str(tmp)}  # fmt: skip
    if request.param is not None:
        env["RNGAUDIT"] = request.param
    proc = torchrun(SCRIPT, env=env, timeout=380, cwd=None)
    steps = "".join(
        f"{r}: {line}\n"
        for r in (0, 1)
        if (tmp / f"rank-{r}.txt").exists()
        for line in (tmp / f"rank-{r}.txt").read_text().splitlines()
    )
    return request.param, proc.returncode, steps, proc.stderr, tmp / "report"


def test_every_step_passes_on_every_rank(
    scripts_run: tuple[str | None, int, str, str, Path],
) -> None:
    _, returncode, steps, stderr, _ = scripts_run
    assert returncode == 0, stderr[-4000:]
    assert steps == "".join(f"{r}: {step}\n" for r in (0, 1) for step in STEPS), stderr[-3000:]
    assert "RNGDivergenceError" not in stderr


def test_audited_run_finds_no_error(scripts_run: tuple[str | None, int, str, str, Path]) -> None:
    mode, _, _, stderr, report_dir = scripts_run
    if mode is None:
        assert not report_dir.exists()  # unaudited: rngaudit wrote nothing
        return
    report = json.loads((report_dir / "report.json").read_text())
    assert report["world_size"] == 2
    bad = [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    assert bad == [], (bad, stderr[-3000:])
