"""Tests for rngaudit.reports.html_page: pages from a real 2-rank run, checked in Chromium."""

from __future__ import annotations

import copy
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import browser
import pytest
from conftest import ROOT, run_python, torchrun

from rngaudit.audit_report import AuditReport
from rngaudit.cli import main
from rngaudit.reports.html_page import render_diff_html, render_html
from rngaudit.reports.reading import load_report_dir
from rngaudit.reports.run_diff import diff_reports

SCENARIOS = "tests/distributed/scenarios.py"
NO_BROWSER = browser.missing()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"{NO_BROWSER}")


@pytest.fixture(scope="module")
def divergent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report directory of a real 2-rank run: rank 0 draws once more after set_seed."""
    outdir = tmp_path_factory.mktemp("extra_draw_rank0")
    proc = torchrun(SCENARIOS, "extra_draw_rank0", str(outdir), timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return outdir / "report"


@pytest.fixture(scope="module")
def pages(divergent: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """HTML pages of that run: as it is, widened to 64 ranks, and compared with itself."""
    out = tmp_path_factory.mktemp("pages")
    report = load_report_dir(divergent)
    paths = {
        "report": render_html(report),
        "wide": render_html(widened(report, 64)),
        "diff": render_diff_html(diff_reports(report, load_report_dir(divergent), "a", "b")),
    }
    for name, text in paths.items():
        (out / f"{name}.html").write_text(text, encoding="utf-8")
    return {name: out / f"{name}.html" for name in paths}


def widened(report: AuditReport, size: int) -> AuditReport:
    """The real report as a world of ``size`` ranks: rank r holds rank r % 2's record."""
    wide = copy.deepcopy(report)
    wide.world_size = size
    records = sorted(report.ranks, key=lambda r: int(r["rank"]))
    wide.ranks = [{**copy.deepcopy(records[r % len(records)]), "rank": r} for r in range(size)]
    return wide


def test_page_is_self_contained_with_findings_first(pages: dict[str, Path]) -> None:
    page = pages["report"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in page  # the browser may fetch nothing
    assert "<script" not in page and "<link" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert page.index("sampler-draw-divergence") < page.index('class="timeline"')
    assert '<dt>fix</dt><dd class="fix">Seed every rank identically' in page
    assert "<code>BatchSamplerShard &gt; BatchSampler &gt; RandomSampler</code>" in page
    assert page.count('id="first-divergence"') == 1
    assert '<div class="row divergent" id="first-divergence">' in page
    assert "<div>rank 0</div><div>rank 1</div>" in page


def test_a_wide_world_shows_one_column_per_group_of_equal_ranks(pages: dict[str, Path]) -> None:
    page = pages["wide"].read_text(encoding="utf-8")
    evens = ", ".join(str(r) for r in range(0, 64, 2))
    odds = ", ".join(str(r) for r in range(1, 64, 2))
    assert f"<div>ranks {evens}</div><div>ranks {odds}</div></div>" in page
    assert "--cols: 2" in page and "--cols: 64" not in page


def test_report_format_html_and_run_html(
    divergent: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(divergent), "--format", "html"]) == 1
    assert capsys.readouterr().out == render_html(load_report_dir(divergent))

    report_dir = tmp_path / "run"
    proc = run_python(
        ["-m", "rngaudit", "run", "--html", "--report-dir", str(report_dir), "--",
         sys.executable, str(ROOT / "tests" / "envmode" / "seeded_diff.py")],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = report_dir / "report.html"
    assert f"rngaudit: HTML report: {page}\n" in proc.stderr
    assert page.read_text(encoding="utf-8") == render_html(load_report_dir(report_dir))


@pytest.fixture(scope="module")
def driver() -> Any:
    if NO_BROWSER:
        pytest.skip(NO_BROWSER)
    chrome = browser.start()
    yield chrome
    chrome.quit()


def load(driver: Any, page: Path) -> list[dict[str, Any]]:
    """Open ``page``; the console's errors and warnings while it loaded."""
    driver.get_log("browser")  # drop what an earlier page left
    driver.get(page.resolve().as_uri())
    return [entry for entry in driver.get_log("browser") if entry["level"] != "INFO"]


def _visible(driver: Any, element: Any) -> bool:
    box = driver.execute_script("return arguments[0].getBoundingClientRect().height", element)
    return bool(element.is_displayed()) and float(box) > 0


@needs_browser
@pytest.mark.parametrize("name", ["report", "wide", "diff"])
def test_page_loads_without_console_errors(driver: Any, pages: dict[str, Path], name: str) -> None:
    assert load(driver, pages[name]) == []
    assert driver.title.startswith("rngaudit")


@needs_browser
@pytest.mark.parametrize("name", ["report", "wide"])
def test_first_divergence_is_visible_and_highlighted(
    driver: Any, pages: dict[str, Path], name: str
) -> None:
    load(driver, pages[name])
    row = driver.find_element("id", "first-divergence")
    assert _visible(driver, row)
    assert "divergent" in row.get_attribute("class").split()
    background = row.value_of_css_property("background-color")
    plain = driver.find_element("css selector", ".row:not(.divergent):not(.head)")
    assert background not in ("rgba(0, 0, 0, 0)", plain.value_of_css_property("background-color"))
    marked = row.find_elements("css selector", ":scope > div.differs")
    assert len(marked) == 2  # both columns: neither value has a majority
    assert marked[0].value_of_css_property("background-color") != background


@needs_browser
def test_equal_stretches_fold_and_unfold(driver: Any, pages: dict[str, Path]) -> None:
    load(driver, pages["diff"])  # a run compared with itself: equal throughout, nothing marked
    assert driver.find_elements("id", "first-divergence") == []
    fold = driver.find_element("css selector", "details.fold")
    inner = fold.find_element("css selector", ".row")
    assert fold.get_attribute("open") is None and not _visible(driver, inner)
    fold.find_element("tag name", "summary").click()
    assert fold.get_attribute("open") is not None and _visible(driver, inner)


@needs_browser
def test_screenshot_shows_the_rendered_page(
    driver: Any, pages: dict[str, Path], tmp_path: Path
) -> None:
    def shot(page: Path) -> bytes:
        load(driver, page)
        png = tmp_path / f"{page.stem}.png"
        driver.save_screenshot(str(png))
        return png.read_bytes()

    report = shot(pages["report"])
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    empty = shot(blank)
    assert report[:8] == empty[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", report[16:24])  # the IHDR chunk
    assert width >= 600 and height >= 300, (width, height)
    # a page with text, colours and tables compresses far worse than a white window
    assert len(report) > 5 * len(empty), (len(report), len(empty))


def test_skip_reason_is_clear_without_a_browser() -> None:
    code = "import browser, shutil; shutil.which = lambda name: None; print(browser.missing())"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "tests"
    )
    assert proc.stdout.strip().startswith(("no Chromium installed", "selenium is not installed"))
