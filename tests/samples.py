"""The sample reports under tests/data: where they are and the scenario lines they point to."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
SCENARIO = DATA / "sample_run.py"  # the 2-rank run tests/data/make_samples.py captures
CASES = ("divergent", "clean")


def scenario_line(code: str) -> int:
    """The line of sample_run.py that holds ``code`` (exactly once), as the reports name it."""
    lines = [
        number
        for number, line in enumerate(SCENARIO.read_text(encoding="utf-8").splitlines(), 1)
        if code in line
    ]
    assert len(lines) == 1, f"{code!r} is on lines {lines} of {SCENARIO}"
    return lines[0]


EXTRA_DRAW = scenario_line("torch.rand(1)")  # rank 0's extra draw (divergent only)
PREPARE = scenario_line("acc.prepare(")  # where the sampler draws, inside prepare()
AUDIT = scenario_line("rngaudit.audit(")  # the audited with-block


def check_golden(name: str, actual: str) -> None:
    """``actual`` equals tests/golden/NAME; ``RNGAUDIT_UPDATE_GOLDEN=1`` rewrites the file."""
    path = GOLDEN / name
    if os.environ.get("RNGAUDIT_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"{path} is missing: run with RNGAUDIT_UPDATE_GOLDEN=1"
    assert actual == path.read_text(encoding="utf-8")
