"""The module map in docs/how-it-works.md names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_map() -> str:
    text = (ROOT / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    match = re.search(r"```\n(.*?)```", text, re.S)
    assert match, "docs/how-it-works.md lost its module map"
    return match.group(1)


def test_the_module_map_names_every_module_and_no_other() -> None:
    words = set(re.findall(r"[A-Za-z_]+", _module_map()))
    package = ROOT / "rngaudit"
    modules = {p.stem for p in package.rglob("*.py") if p.stem != "__init__"} | {
        p.name for p in package.iterdir() if (p / "__init__.py").exists()
    }
    missing = sorted(modules - words)
    assert not missing, f"docs/how-it-works.md's module map does not name {missing}"
    # snake_case words in the map are module names: a renamed module must be renamed there too
    named = {w for w in words if w.islower() and "_" in w.strip("_")}
    stale = sorted(named - modules)
    assert not stale, f"the module map names modules that do not exist: {stale}"
