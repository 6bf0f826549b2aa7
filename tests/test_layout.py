"""The package's shape: its layers, no import cycle, no private name shared, short parameter
lists, the module map true to the tree, no merge conflict left."""

from __future__ import annotations

import ast
import importlib.resources
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rngaudit"
MAX_PARAMETERS = 8


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


def test_the_page_template_and_style_are_package_data() -> None:
    from rngaudit.audit_report import AuditReport
    from rngaudit.reports.html_page import render_html

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


# -- the layers ----------------------------------------------------------------------------
# Each layer may import itself and the layers it lists, nothing else (docs/how-it-works.md
# states the same table). A module's layer is its folder under rngaudit/; a top-level module's
# is its row in TOP. Every import counts: at the top of a module, inside a function (a lazy
# import), and under ``if TYPE_CHECKING:`` (a type named is a dependency too); the cycle test
# below leaves the TYPE_CHECKING ones out (they never run). Importing the root package
# (``from rngaudit import __version__``) is no arrow: every import of a submodule runs it.
KERNEL: tuple[str, ...] = ("errors", "config", "schema", "findings", "wording", "peek")
KERNEL += ("library_samplers", "forksafe", "verdict", "launcher", "audit_report", "report_files")
ENGINE = ("capture", "ranks", "epochs", "workers")
LAYERS: dict[str, tuple[str, ...]] = {
    "kernel": (),  # shared by both halves: errors, settings, shapes, findings, wording, the report
    "capture": ("kernel",),  # one rank's draws
    "ranks": ("kernel", "capture"),  # the cross-rank path
    "epochs": ("kernel", "capture", "ranks"),  # the order check at each epoch
    "workers": ("kernel", "capture", "ranks"),  # DataLoader worker streams
    "reports": ("kernel",),  # the offline half
    "entry": ("kernel", *ENGINE, "reports"),  # with_block, whole_run, startup
    "integrations": ("kernel", "entry"),  # framework callbacks, one window each
    "cli": ("kernel", "reports"),  # rngaudit report | diff | run: the offline half only
    "api": ("kernel", *ENGINE, "reports", "entry", "integrations", "cli"),  # rngaudit/__init__
}
TOP = {
    **dict.fromkeys(KERNEL, "kernel"),
    **dict.fromkeys(("with_block", "whole_run", "startup"), "entry"),
    **dict.fromkeys(("cli", "__main__"), "cli"),
    "__init__": "api",
}


@dataclass(frozen=True)
class Arrow:
    """One import in the package: ``source`` imports ``target`` (module names)."""

    source: str
    target: str
    line: int
    lazy: bool  # inside a function
    typing: bool  # under ``if TYPE_CHECKING:``


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    """``rngaudit.capture.naming`` -> ``capture``; a top-level module's row in TOP."""
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    return parts[1] if (PACKAGE / parts[1]).is_dir() else TOP[parts[1]]


def _target(name: str) -> str | None:
    """The package module an imported name is (the longest module prefix), None outside."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def _inside(tree: ast.AST, typing: bool) -> set[int]:
    """ids of the nodes inside a function (or, ``typing``, an ``if TYPE_CHECKING:``)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if typing:
            inside = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        else:
            inside = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if inside:
            found.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return found


def arrows(source: str, tree: ast.AST) -> Iterator[Arrow]:
    """Every import of a package module by ``source`` (whose syntax tree is ``tree``)."""
    lazy = _inside(tree, typing=False)
    typing = _inside(tree, typing=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                full if (full := f"{node.module}.{a.name}") in MODULES else node.module
                for a in node.names
            ]
        else:
            continue
        for name in names:
            target = _target(name)
            if target is not None and target not in ("rngaudit", source):
                yield Arrow(source, target, node.lineno, id(node) in lazy, id(node) in typing)


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


ARROWS = [a for m, p in MODULES.items() for a in arrows(m, _tree(p))]


def layer_violations(found: list[Arrow]) -> set[tuple[str, str]]:
    """(source, target) of every import the layer table does not allow."""
    return {
        (a.source, a.target)
        for a in found
        if layer(a.target) != layer(a.source) and layer(a.target) not in LAYERS[layer(a.source)]
    }


def test_every_module_has_a_layer_and_the_table_names_only_layers() -> None:
    assert {layer(m) for m in MODULES} == set(LAYERS)
    assert all(set(allowed) < set(LAYERS) for allowed in LAYERS.values())


def test_every_layer_imports_only_the_layers_it_may() -> None:
    found = layer_violations(ARROWS)
    assert not found, f"arrows up the layers (move the name to its owner): {sorted(found)}"


def test_the_layer_check_sees_lazy_and_typing_imports() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rngaudit.reports import model\n"
        "def f():\n    import rngaudit.epochs.sharding\n"
        "from rngaudit import errors, __version__\n"
    )
    found = list(arrows("rngaudit.capture.naming", tree))
    assert sorted((a.target, a.lazy, a.typing) for a in found) == [
        ("rngaudit.epochs.sharding", True, False),
        ("rngaudit.errors", False, False),
        ("rngaudit.reports.model", False, True),
    ]
    assert layer_violations(found) == {
        ("rngaudit.capture.naming", "rngaudit.reports.model"),
        ("rngaudit.capture.naming", "rngaudit.epochs.sharding"),
    }


# -- no import cycle -----------------------------------------------------------------------
def cycles(found: list[Arrow]) -> set[frozenset[str]]:
    """The modules that import each other round a loop (strongly connected, two or more),
    lazy imports included, TYPE_CHECKING ones not (they never run)."""
    graph: dict[str, set[str]] = {}
    for a in found:
        if not a.typing:
            graph.setdefault(a.source, set()).add(a.target)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: set[frozenset[str]] = set()

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                out.add(frozenset(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return out


def test_no_import_cycle() -> None:
    found = cycles(ARROWS)
    assert not found, f"import cycles: {sorted(map(sorted, found))}"


def test_the_cycle_check_sees_a_lazy_loop_and_not_a_typing_one() -> None:
    a, b, c = "rngaudit.a", "rngaudit.b", "rngaudit.c"
    lazy = [Arrow(a, b, 1, False, False), Arrow(b, a, 1, True, False)]
    typing = [Arrow(b, c, 1, False, False), Arrow(c, b, 1, False, True)]
    assert cycles(lazy + typing) == {frozenset({a, b})}


# -- no private name shared ----------------------------------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str, tree: ast.AST) -> set[tuple[str, str, str]]:
    """(user, owner, name) for each use of another module's ``_name``: imported by name, read
    as an attribute of an imported module, or a ``_module`` imported from outside its folder."""
    uses: set[tuple[str, str, str]] = set()
    bound: dict[str, str] = {}  # local name -> package module
    is_folder = (PACKAGE / "/".join(source.split(".")[1:])).is_dir()
    folder = source if is_folder else source.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            owner = _target(node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES:
                    bound[a.asname or a.name] = full
                    if _private(a.name) and node.module != folder:
                        uses.add((source, node.module, a.name))
                elif owner is not None and owner != source and _private(a.name):
                    uses.add((source, owner, a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = bound.get(node.value.id)
            if owner is not None and owner != source and _private(node.attr):
                uses.add((source, owner, node.attr))
    return uses


PRIVATE_USES = {use for m, p in MODULES.items() for use in private_uses(m, _tree(p))}


def test_no_module_uses_another_modules_private_name() -> None:
    found = sorted(PRIVATE_USES)
    assert not found, f"another module's _name used (make it public where owned): {found}"


def test_the_private_check_sees_each_way_of_reaching_a_name() -> None:
    tree = ast.parse(
        "from rngaudit.ranks import exchange\n"
        "from rngaudit.ranks.exchange import _store\n"
        "import rngaudit.capture.sketch as sk\n"
        "from rngaudit.integrations import _window\n"
        "exchange._delete(); sk._pack(); exchange.store(); exchange.__name__\n"
    )
    assert private_uses("rngaudit.capture.naming", tree) == {
        ("rngaudit.capture.naming", "rngaudit.ranks.exchange", "_store"),
        ("rngaudit.capture.naming", "rngaudit.ranks.exchange", "_delete"),
        ("rngaudit.capture.naming", "rngaudit.capture.sketch", "_pack"),
        ("rngaudit.capture.naming", "rngaudit.integrations", "_window"),
    }
    assert private_uses("rngaudit.integrations.lightning", ast.parse(
        "from rngaudit.integrations import _window\n")) == set()  # fmt: skip


# -- the module map ------------------------------------------------------------------------
DOC = PACKAGE.parent / "docs" / "how-it-works.md"


def map_names(text: str) -> set[str]:
    """The modules and files the module map of docs/how-it-works.md names, as dotted paths:
    ``capture/`` a folder, ``  naming   ...`` a module in it, ``    torch_ops ...`` one in
    its subfolder; wrapped descriptions (indented further) are not names."""
    block = text.split("Each module has one job:", 1)[1].split("```", 2)[1]
    names: set[str] = set()
    folder: list[str] = []
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 4:
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        depth = indent // 2
        for name in (n.strip() for n in head.split(",")):
            if name.endswith("/"):
                if depth == 0:
                    folder = [] if name == "rngaudit/" else [name[:-1]]
                else:
                    folder = [*folder[:depth], name[:-1]]
                if name != "rngaudit/":
                    names.add(".".join(["rngaudit", *folder]))
            else:
                names.add(".".join(["rngaudit", *folder[:depth], name]))
    return names


def test_the_module_map_names_exactly_the_modules_in_the_tree() -> None:
    tree = {m if m != "rngaudit" else "rngaudit.__init__" for m in MODULES}
    data = {
        _module_name(p).rsplit(".", 1)[0] + "." + p.name
        for p in PACKAGE.rglob("*")
        if p.suffix in (".html", ".css")
    }
    named = map_names(DOC.read_text(encoding="utf-8"))
    assert named == tree | data, (sorted(named - tree - data), sorted((tree | data) - named))


def test_the_map_reader_reads_folders_modules_and_wrapped_lines() -> None:
    text = (
        "Each module has one job:\n\n```\nrngaudit/   top\n  __init__   api\n"
        "  cli, __main__  x\ncapture/   c\n  naming   n\n                  wrapped\n"
        "  instrument/   i\n    torch_ops  t\nranks/   r\n  exchange  e\n```\n"
    )
    assert map_names(text) == {
        "rngaudit.__init__", "rngaudit.cli", "rngaudit.__main__", "rngaudit.capture",
        "rngaudit.capture.naming", "rngaudit.capture.instrument",
        "rngaudit.capture.instrument.torch_ops", "rngaudit.ranks", "rngaudit.ranks.exchange",
    }  # fmt: skip


def test_the_docs_state_the_layer_table() -> None:
    text = DOC.read_text(encoding="utf-8").split("\n## The layers", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|$", text, flags=re.M))
    stated = {name: tuple(re.findall(r"`(\w+)`", allowed)) for name, allowed in rows.items()}
    assert stated == LAYERS


MAX_CLASS_LINES = 420  # issue 36: no class a whole subsystem (EpochGuard was 1,283 lines)


def test_no_class_is_a_whole_subsystem() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    ]
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"
