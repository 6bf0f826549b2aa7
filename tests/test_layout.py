"""The package's shape: short parameter lists, the offline half apart, no merge conflict left."""

from __future__ import annotations

import ast
import importlib.resources
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rngaudit"
MAX_PARAMETERS = 8
ENGINE = ("capture", "ranks", "epochs", "workers")


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def test_no_function_takes_more_than_eight_parameters() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({_parameters(node)})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _parameters(node) > MAX_PARAMETERS
    ]
    assert not long, f"functions with more than {MAX_PARAMETERS} parameters: {long}"


def test_the_parameter_count_sees_a_long_list() -> None:
    tree = ast.parse("def f(self, a, b, /, c, *d, e, f, g, h, **i): pass")
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef) and _parameters(func) == 9


def test_the_offline_half_imports_nothing_of_the_engine() -> None:
    offline = [*sorted((PACKAGE / "reports").glob("*.py")), PACKAGE / "cli.py"]
    offenders = []
    for path in offline:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "rngaudit" and len(parts) > 1 and parts[1] in ENGINE:
                    offenders.append(f"{path.name}: {name}")
                if name in ("rngaudit.with_block", "rngaudit.whole_run", "rngaudit.startup"):
                    offenders.append(f"{path.name}: {name}")
    assert not offenders, offenders


def test_the_page_template_and_style_are_package_data() -> None:
    from rngaudit.reports.html_page import render_html
    from rngaudit.reports.model import AuditReport

    files = importlib.resources.files("rngaudit.reports")
    page = files.joinpath("page.html").read_text(encoding="utf-8")
    assert [page.count(p) for p in ("{title}", "{style}", "{body}")] == [1, 1, 1]
    style = files.joinpath("page.css").read_text(encoding="utf-8")
    html = render_html(AuditReport(run_id="{body}"))  # a placeholder in the data stays data
    assert f"<style>\n{style}</style>" in html and "{title}" not in html
    assert html.startswith("<!DOCTYPE html>") and html.endswith("</body>\n</html>\n")


def test_no_module_name_is_the_start_of_another() -> None:
    """No look-alikes such as record / records / recorder or report / report_read."""
    names = {
        path.parent.name if path.stem == "__init__" else path.stem
        for path in PACKAGE.rglob("*.py")
        if path.stem != "__main__"
    }
    pairs = sorted((a, b) for a in names for b in names if a != b and b.startswith(a))
    assert not pairs, pairs


_MARKERS = ("<" * 7 + " ", "=" * 7 + "\n", ">" * 7 + " ")


def _text_files() -> list[Path]:
    """The repository's tracked text files (git's list: the work tree's .venv is not walked)."""
    root = PACKAGE.parent
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    kinds = (".py", ".md", ".toml", ".txt", ".cfg", ".html", ".css", ".json", "Makefile")
    return [root / name for name in listed if name.endswith(kinds) and (root / name).is_file()]


def test_no_file_holds_a_merge_conflict() -> None:
    conflicted = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        if any(line.startswith(m) or line == m for line in lines for m in _MARKERS):
            conflicted.append(str(path.relative_to(PACKAGE.parent)))
    assert not conflicted, f"merge-conflict markers left in: {conflicted}"
