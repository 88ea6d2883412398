"""The house in its documented order (docs/ARCHITECTURE.md): an ast walk over every import in
factory/, also those inside functions and under ``if``, and the runner registry's targets
(``RunnerKind(target="module:Class")``, imported by ``RunnerKind.load``). No import circle
(importing ``a.b`` also runs ``a/__init__.py``: that counts too), no import that climbs a stage
except the listed ones, factory imports at module top, no module over 600 lines."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

from factory.runners import RUNNERS

REPO = Path(__file__).resolve().parents[2]
FACTORY = REPO / "factory"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"

# The stages in the order the data flows; the bottom layer under them, commands on top.
BOTTOM = {"errors", "logger", "actions", "process", "units", "engine", "links", "store", "data",
          "environment", "tomlread", "tarsafe"}
# reports (the pictures) beside planning: it draws matrix and planning data; build uses it
STAGES = {"upstream": 1, "matrix": 2, "recipes": 2, "toolchain": 3, "planning": 4, "reports": 4,
          "build": 5, "runners": 5, "wheels": 6, "index": 7, "hosts": 8, "engines": 8}
TOP = {"commands", "cli", "__main__", "ci"}
# The imports that climb, each named in ARCHITECTURE.md's "Exceptions that remain": importer ->
# the modules it may import from a stage to its right.
CLIMBS = {
    "factory.build.pipeline": {
        "factory.wheels.finalize", "factory.wheels.verify", "factory.wheels.floor",
        "factory.wheels.provenance", "factory.index.publish",
    },
    "factory.matrix.load": {
        "factory.toolchain.resolve", "factory.toolchain.sdist", "factory.runners",
    },
    "factory.matrix.settings": {"factory.runners"},
    "factory.index.finder": {
        "factory.hosts.choose", "factory.hosts.index_reader", "factory.hosts.probe",
        "factory.hosts.snippets",
    },
}
# At most this many imports of factory modules inside functions, each for a module that pulls in
# an optional heavy dependency, with a comment saying so on its line.
MAX_FUNCTION_LEVEL = 20
MAX_LINES = 600
# Over 600 lines until the helper who changes each splits it; the entry goes when its module is
# split.
TOO_LONG_FOR_NOW: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    in_function: bool
    text: str


def _modules() -> dict[str, Path]:
    out = {}
    for path in FACTORY.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> set[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    found = {_resolve(n) for n in names if n.split(".")[0] == "factory"}
    return {t for t in found if t and t != module}


def _kind_target(node: ast.AST) -> str | None:
    """The module a ``RunnerKind(..., target="module:Class")`` names: an import when it loads."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RunnerKind"):
        return None
    target = next((k.value for k in node.keywords if k.arg == "target"), None)
    if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
        return None
    return target.value.partition(":")[0]


def _imports() -> list[Import]:
    out = []
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)

        def walk(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(module, child, path.name == "__init__.py"):
                        out.append(Import(module, target, child.lineno, in_function,
                                          lines[child.lineno - 1]))
                loaded = _kind_target(child)
                if loaded is not None:
                    out.append(Import(module, loaded, child.lineno, in_function,
                                      lines[child.lineno - 1]))
                walk(child, inside)

        walk(tree, False)
    return out


IMPORTS = _imports()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        graph[imp.importer].add(imp.target)
        # the packages above the target run first, unless the importer is inside them
        parent = imp.target.rpartition(".")[0]
        while parent not in ("", "factory"):
            if not (imp.importer == parent or imp.importer.startswith(parent + ".")):
                graph[imp.importer].add(parent)
            parent = parent.rpartition(".")[0]
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # factory/__init__.py
    name = parts[1]
    if name in BOTTOM:
        return 0
    if name in TOP:
        return 99
    return STAGES[name]


def test_every_module_has_a_floor() -> None:
    unknown = {m.split(".")[1] for m in MODULES if "." in m} - BOTTOM - TOP - set(STAGES)
    assert not unknown, f"put {sorted(unknown)} on a floor (BOTTOM, STAGES or TOP) and in the doc"


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_the_runner_registry_targets_count_as_imports() -> None:
    """Each kind's class is imported when a build asks for it: an edge like any other, and the
    only import by name in factory/ (RunnerKind.load's import_module)."""
    loaded = {imp.target for imp in IMPORTS if imp.importer == "factory.runners"}
    assert {kind.target.partition(":")[0] for kind in RUNNERS.values()} <= loaded
    by_name = [f"{m}:{n.lineno}" for m, p in MODULES.items() if ".inside" not in m
               for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Attribute) and n.attr == "import_module"]
    assert len(by_name) == 1 and by_name[0].startswith("factory.runners:"), by_name


def test_the_circle_finder_finds_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_follow_the_stages_but_for_the_listed_exceptions() -> None:
    climbing = sorted(
        f"{imp.importer} -> {imp.target} (line {imp.line})"
        for imp in IMPORTS
        if _floor(imp.target) > _floor(imp.importer)
        and imp.target not in CLIMBS.get(imp.importer, set())
    )
    assert climbing == [], "import a stage to the left, or move the shared thing down"


def test_the_exceptions_are_all_used_and_all_in_the_doc() -> None:
    used = {(imp.importer, imp.target) for imp in IMPORTS}
    doc = ARCHITECTURE.read_text()
    exceptions = doc[doc.index("**Exceptions that remain**"):]
    for importer, targets in CLIMBS.items():
        assert f"`{importer.removeprefix('factory.').replace('.', '/')}.py`" in exceptions
        for target in targets:
            assert (importer, target) in used, f"{importer} no longer imports {target}: drop it"
            path = MODULES[target].relative_to(FACTORY).as_posix()
            assert f"`{path}`" in exceptions, f"{path} is not in ARCHITECTURE.md's exceptions"


def test_factory_imports_sit_at_module_top() -> None:
    inside = [imp for imp in IMPORTS if imp.in_function]
    assert len(inside) <= MAX_FUNCTION_LEVEL
    bare = [f"{i.importer}:{i.line}" for i in inside if "#" not in i.text]
    assert bare == [], "an import inside a function needs a comment: the heavy dependency"


def _commented(lines: list[str], line: int) -> bool:
    """A comment on the import's line, or above the block of imports it is in."""
    if "#" in lines[line - 1]:
        return True
    for text in reversed(lines[: line - 1]):
        text = text.strip()
        if text.startswith("#"):
            return True
        if text and not text.startswith(("import ", "from ")):
            return False
    return False


def test_imports_inside_functions_are_heavy_dependencies_said_so() -> None:
    """The standard library loads at module top; an import inside a function is a heavy or
    optional third-party module (docker, boto3, pyelftools, ...), with a comment saying so."""
    found = []
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()

        def walk(node: ast.AST, in_function: bool, lines: list[str] = lines,
                 module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    name = (child.names[0].name if isinstance(child, ast.Import)
                            else child.module or "")
                    if name.split(".")[0] in sys.stdlib_module_names:
                        found.append(f"{module}:{child.lineno}: {name} (stdlib: at module top)")
                    elif not _commented(lines, child.lineno):
                        found.append(f"{module}:{child.lineno}: {name} (no comment)")
                walk(child, in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        walk(ast.parse(text), False)
    assert found == []


def test_no_module_over_600_lines() -> None:
    long = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines())
            for p in MODULES.values()}
    over = sorted(f"{p} ({n})" for p, n in long.items() if n > MAX_LINES
                  and p not in TOO_LONG_FOR_NOW)
    assert over == [], "split it by concern"
    split = sorted(p for p in TOO_LONG_FOR_NOW if long.get(p, 0) <= MAX_LINES)
    assert split == [], "split: take it off TOO_LONG_FOR_NOW"


@pytest.mark.parametrize("name", ["runner", "store backend", "recipe"])
def test_the_doc_says_what_adding_a_kind_touches(name: str) -> None:
    doc = ARCHITECTURE.read_text()
    table = doc[doc.index("## Adding a runner, a store backend, a recipe"):]
    row = next(line for line in table.splitlines() if line.startswith(f"| a {name}"))
    files = {word.strip("`") for word in row.split() if word.startswith("`") and
             word.rstrip("`,.;)").endswith(".py")}
    if name == "recipe":  # a recipe is data: one TOML file, no code
        assert files == set() and "recipes/<name>.toml" in row, row
    else:
        assert 1 <= len(files) <= 2, row


# -- the tests' own house ------------------------------------------------------------------------
TESTS = REPO / "tests"


TIERS = ("unit", "integration")


def test_every_test_file_is_in_a_tier() -> None:
    """Every test_*.py anywhere under tests/ sits in tests/unit or tests/integration."""
    outside = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")
                     if p.relative_to(TESTS).parts[0] not in TIERS)
    assert outside == []
    assert len(list((TESTS / "unit").rglob("test_*.py"))) > 50  # the walk finds the tiers


def _imported(node: ast.AST) -> list[str]:
    """The modules an import names: ``from m import a`` names m and m.a (a may be a module);
    a relative one is spelled with its dots."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = "." * node.level + (node.module or "")
    return [base, *(f"{base.rstrip('.')}.{a.name}" if node.module else f"{base}{a.name}"
                    for a in node.names)]


def _names_a_test_module(name: str) -> bool:
    parts = name.lstrip(".").split(".")
    return parts[0] in TIERS or any(p.startswith("test_") for p in parts)


def test_tests_take_shared_helpers_from_fixture_modules() -> None:
    """No module under tests/ imports a test module (of its tier or the other) or a tier
    package: what two share lives in a fixture module in tests/."""
    found = [f"{path.relative_to(TESTS)}:{node.lineno}: {name}"
             for path in sorted(TESTS.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             for name in _imported(node) if _names_a_test_module(name)]
    assert found == []


def test_the_test_import_check_sees_every_spelling() -> None:
    spellings = ["import test_cli", "from test_cli import x", "from unit import test_cli",
                 "from integration.test_server import y", "from .test_cli import z",
                 "from . import test_cli", "import unit"]
    for text in spellings:
        (node,) = ast.parse(text).body
        assert any(_names_a_test_module(n) for n in _imported(node)), text
    (fixture,) = ast.parse("from index_fixtures import moto_server").body
    assert not any(_names_a_test_module(n) for n in _imported(fixture))


def test_the_doc_names_every_fixture_module() -> None:
    doc = ARCHITECTURE.read_text()
    tests_part = doc[doc.index("## Tests"):]
    missing = [p.name for p in sorted(TESTS.glob("*.py")) if f"`{p.name}`" not in tests_part]
    assert missing == []


def test_only_tomlread_imports_tomllib() -> None:
    """Python 3.10 (the declared floor, Ubuntu 22.04's python3) has no tomllib: every module and
    test reads TOML through factory.tomlread, which falls back to tomli there."""
    direct = []
    for path in [*(REPO / "factory").rglob("*.py"), *(REPO / "tests").rglob("*.py"),
                 *(REPO / "benchmarks").rglob("*.py")]:
        if path == REPO / "factory" / "tomlread.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if "tomllib" in names:
                direct.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert direct == []
