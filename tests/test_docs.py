"""The docs are true of the tree: module names, code blocks (run, or checked), links."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from rngaudit import config
from rngaudit.cli import _parser
from rngaudit.errors import ConfigError

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


# Code blocks: every fenced block of README.md and docs/*.md is read by its info string ----------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```([^\n]*)\n(.*?)^\1```$", re.M | re.S)
NOT_RUN = {"fragment", "your-script", "slow", "network", "gpu", "multi-node", "needs-ray"}
KINDS = {"", "text", "json", "sh", "python"}
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class Block(NamedTuple):
    doc: str
    line: int
    kind: str  # the info string's first word: the language
    why_not_run: str  # its second word: why the block is not run here ("" when it is run)
    body: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            words = match.group(2).split()
            body = "\n".join(ln.removeprefix(match.group(1)) for ln in match.group(3).splitlines())
            found.append(
                Block(
                    str(doc.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1,
                    words[0] if words else "", " ".join(words[1:]), body,
                )
            )  # fmt: skip
    return found


BLOCKS = _blocks()


def _commands(block: Block) -> list[list[str]]:
    """Each command line of a shell block, split into words, without comments."""
    return [shlex.split(line, comments=True) for line in block.body.splitlines() if line.strip()]


def test_every_block_says_what_it_is() -> None:
    unknown = [
        f"{b}: ```{b.kind} {b.why_not_run}"
        for b in BLOCKS
        if b.kind not in KINDS or (b.why_not_run and b.why_not_run not in NOT_RUN)
        or (b.why_not_run and b.kind not in ("sh", "python"))
    ]  # fmt: skip
    assert not unknown, f"info strings the docs test does not know ({KINDS}, {NOT_RUN}):\n" + (
        "\n".join(unknown)
    )
    assert {b.kind for b in BLOCKS} >= {"sh", "python"}  # the reader found blocks at all


def _rngaudit_names(tree: ast.AST) -> list[list[str]]:
    """The dotted rngaudit names a Python block uses (``rngaudit.audit``, imports from it)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rngaudit"):
            names += [[*str(node.module).split("."), alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name.split(".") for a in node.names if a.name.startswith("rngaudit")]
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            parts = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                parts.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "rngaudit":
                names.append(["rngaudit", *parts])
    return names


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "python"], ids=str)
def test_python_blocks_compile_and_name_what_exists(block: Block) -> None:
    tree = ast.parse(block.body, filename=str(block))
    modules = _package_modules()
    stale = [
        f"{'.'.join(n)}: {why}" for n in _rngaudit_names(tree) if (why := _resolve(n, modules))
    ]
    assert not stale, f"{block}: " + "; ".join(stale)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.kind == "python" and not b.why_not_run], ids=str
)
def test_python_programs_run(block: Block, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    proc = subprocess.run(
        [sys.executable, "-c", block.body], cwd=tmp_path, env=env, text=True, timeout=120,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{block}:\n{proc.stdout[-3000:]}"
    for said in re.findall(r"# prints: (.*)$", block.body, re.M):  # what the block says it prints
        assert said in proc.stdout.splitlines(), f"{block}: not printed: {said}\n{proc.stdout}"


def _check_words(words: list[str]) -> str | None:
    """Why a command line of the docs cannot be right as written, or None."""
    env = {}
    while words and (assignment := ASSIGNMENT.match(words[0])):
        env[assignment.group(1)] = assignment.group(2)
        words = words[1:]
    try:
        config.env_mode(env.get(config.ENV_MODE))
        config.env_epochs(env)
        if config.ENV_TIMEOUT in env:
            config.parse_timeout(env[config.ENV_TIMEOUT], config.ENV_TIMEOUT)
    except ConfigError as exc:
        return str(exc)
    known = {config.ENV_MODE, config.ENV_REPORT_DIR, config.ENV_TIMEOUT, config.ENV_EPOCHS}
    unknown = [name for name in env if name.startswith("RNGAUDIT") and name not in known]
    if unknown and unknown != [config.ENV_SAMPLE_KEY]:
        return f"no such variable: {unknown}"
    words = words[: words.index(">")] if ">" in words else words
    if words[:3] == [Path(sys.executable).name, "-m", "rngaudit"] or words[:3] == [
        "python", "-m", "rngaudit",
    ]:  # fmt: skip
        words = ["rngaudit", *words[3:]]
    if words[:1] == ["rngaudit"]:
        try:
            _parser().parse_args(words[1:])
        except SystemExit:
            return "rngaudit does not accept it"
    if words[:1] == ["make"]:
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        missing = [t for t in words[1:] if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
        if missing:
            return f"no make target {missing}"
    pins = [w for w in words if w.startswith("torch==")]
    if pins and f"pip install -q {pins[0]}" not in (ROOT / "Makefile").read_text("utf-8"):
        return f"{pins[0]} is not the Makefile's torch"
    paths = [w for w in words if "/" in w and not w.startswith((".venv/", "-")) and "=" not in w]
    if any(w.endswith((".py", ".md")) and not (ROOT / w).exists() for w in paths):
        return f"a file it names does not exist: {paths}"
    return None


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "sh"], ids=str)
def test_shell_commands_are_right_as_written(block: Block) -> None:
    wrong = [f"{' '.join(w)}: {why}" for w in _commands(block) if (why := _check_words(w))]
    assert not wrong, f"{block}:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.kind == "sh" and not b.why_not_run], ids=str
)
def test_shell_blocks_run(block: Block, tmp_path: Path) -> None:
    """Run in a scratch directory holding the report directory of a divergent 2-rank run."""
    shutil.copytree(ROOT / "tests" / "data" / "divergent", tmp_path / "rngaudit-report")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for line in block.body.splitlines():
        proc = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, text=True, timeout=120,
            capture_output=True, check=False,
        )  # fmt: skip
        # exit status 1 is findings (the run was divergent); 2 and above, unusable
        assert proc.returncode in (0, 1) and not proc.stderr, f"{block}: {line}\n{proc.stderr}"


def test_the_shell_checks_can_fail() -> None:
    assert _check_words(["RNGAUDIT=yes", "torchrun", "train.py"])
    assert _check_words(["RNGAUDIT_EPOCH=all", "python", "train.py"])
    assert _check_words(["rngaudit", "report", "--format", "pdf"])
    assert _check_words(["make", "demos"])
    assert _check_words(["pip", "install", "torch==2.12.0"])
    assert _check_words(["python", "examples/no_such_demo.py"])
    assert not _check_words(["RNGAUDIT=warn", "RNGAUDIT_EPOCHS=first", "rngaudit", "report"])


# Links: every relative link of README.md and docs/*.md names a file, and a heading in it -------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file."""
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.M):
        text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        anchors.add(text.replace(" ", "-"))
    return anchors


def test_links_name_files_and_headings_that_exist() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.name}: {target}: no such heading")
    assert not broken, "\n".join(broken)
