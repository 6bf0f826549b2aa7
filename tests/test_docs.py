"""The module map in docs/how-it-works.md names every module of the package."""

from __future__ import annotations

import ast
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


# Modules renamed by the layout of issue 24: prose naming them is stale.
FORMER_MODULES = {
    "records", "events", "record", "run_kind", "compare", "epoch_check", "epoch_rules",
    "report", "report_read", "report_write", "diff", "render", "render_diff", "render_html",
    "instrument_torch",
}  # fmt: skip
NOT_MODULES = {"collate_fn", "bit_generator"}  # attribute names in examples


def _package_modules() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for path in (ROOT / "rngaudit").rglob("*.py"):
        name = path.parent.name if path.stem == "__init__" else path.stem
        found.setdefault(name, []).append(path)
    return found


def _defined(path: Path) -> set[str]:
    """Every name a module binds (definitions, assignments, imports, attributes it sets)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def _resolve(parts: list[str], modules: dict[str, list[Path]]) -> str | None:
    """Why the dotted name ``parts`` (starting at a package module) names nothing, or None."""
    package = ROOT / "rngaudit"
    if parts[0] == "rngaudit":
        path, rest = package, parts[1:]
    else:
        paths = modules[parts[0]]
        if len(paths) > 1:
            return None  # ambiguous stem: not checked
        path, rest = paths[0], parts[1:]
        if path.name == "__init__.py":
            path = path.parent
    while rest and path.is_dir():
        inner = path / rest[0] if (path / rest[0]).is_dir() else path / f"{rest[0]}.py"
        if not inner.exists():
            break
        path, rest = inner, rest[1:]
    if not rest:
        return None
    module = path / "__init__.py" if path.is_dir() else path
    return None if rest[0] in _defined(module) else f"{module.relative_to(ROOT)} has no {rest[0]}"


def test_prose_names_only_modules_and_attributes_that_exist() -> None:
    modules = _package_modules()
    external = {"lightning"}  # also a package of its own (lightning.pytorch)
    stale = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in re.finditer(r"`([A-Za-z_][\w.]*?)(?:\(|`)", doc.read_text(encoding="utf-8")):
            dotted = match.group(1).rstrip(".")
            parts = dotted.split(".")
            if len(parts) < 2 or parts[-1] in ("py", "pth", "pkl", "json", "md", "txt", "html"):
                continue
            where = f"{doc.name}: `{dotted}`"
            if parts[0] in FORMER_MODULES:
                stale.append(f"{where} names a module that was renamed")
            elif parts[0] == "rngaudit" or (parts[0] in modules and parts[0] not in external):
                why = _resolve(parts, modules)
                if why:
                    stale.append(f"{where}: {why}")
            elif "_" in parts[0].strip("_") and parts[0] not in NOT_MODULES:
                stale.append(f"{where} is not a module of the package")
    assert not stale, "\n".join(stale)
