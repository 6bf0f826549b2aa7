"""`make demo`, run once: it passes, ends with the HTML page, and the README quotes it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = "examples/demo.py"
QUOTE = re.compile(r"<!-- output: make demo -->\n```text\n(.*?)```\n", re.DOTALL)
LAST_LINE = re.compile(r"HTML report of the divergent run \(open it in a browser\): (\S+)")
FINGERPRINT = re.compile(r"\b[0-9a-f]{8}\b")  # generator state: differs every run
SEED = re.compile(r"\b\d{10,}\b")  # an unseeded rank's torch seed


def readme_quote() -> str:
    match = QUOTE.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert match, "README.md lost its <!-- output: make demo --> block"
    return match.group(1)


def quoted_in(quote: str, output: str) -> bool:
    """Whether ``quote`` is in ``output`` up to line wrapping, with ``...`` standing for any text
    and fingerprints and seeds (random in an unseeded run) for any value."""
    parts = []
    for piece in re.split(r"(\.\.\.|\s+)", quote.strip()):
        if piece == "...":
            parts.append(r".*?")
        elif piece.isspace():
            parts.append(r"\s+")
        elif piece:
            text = re.escape(piece)
            text = FINGERPRINT.sub(r"[0-9a-f]{8}", text)
            parts.append(SEED.sub(r"\\d+", text))
    return re.search("".join(parts), output, re.DOTALL) is not None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    reports = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, DEMO, str(reports)], cwd=ROOT, text=True, timeout=600,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, reports


def test_make_demo_runs_the_demo() -> None:
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("\ndemo:", 1)[1]
    assert recipe.splitlines()[1].strip() == f"$(PY) {DEMO}"


def test_the_demo_passes_and_ends_by_printing_where_the_html_page_is(
    demo: tuple[int, str, Path],
) -> None:
    returncode, output, reports = demo
    assert returncode == 0, output[-4000:]
    assert "demo OK" in output
    last = LAST_LINE.fullmatch(output.strip().splitlines()[-1])
    assert last, output[-2000:]
    page = Path(last.group(1))
    assert page == reports / "noseed" / "report.html"
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_the_readme_quotes_the_demo_error(demo: tuple[int, str, Path]) -> None:
    _, output, _ = demo
    said = "\n".join(line.removeprefix("  | ") for line in output.splitlines())
    quote = readme_quote()
    assert quoted_in(quote, said), f"README.md's quote is not what the demo printed:\n{said}"
    # what the comparison lets vary (fingerprints, seeds) and what it does not (a line number)
    assert quoted_in(quote.replace("rank 1: edd1fe26", "rank 1: 0123abcd"), said)
    assert not quoted_in(quote.replace("audited_prepare.py:51", "audited_prepare.py:50"), said)
