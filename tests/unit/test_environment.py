"""The FACTORY_* variables: one precedence for every value (command line > environment >
matrix.toml > default), every variable the workflows and scripts set is one the factory (or the
script it is for) reads, and `factory --help` lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ops_builds import REPO, factory_cli

from factory.environment import ENVIRONMENT
from factory.matrix.settings import Settings

NAMES = {v.name for v in ENVIRONMENT}


def test_the_environment_beats_the_matrix_and_relative_paths_start_at_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    table = {"store": "from-matrix", "memory-history": "h.json"}
    matrix_dir = tmp_path / "m"
    s = Settings.from_table(table, root=matrix_dir, environ={})
    assert s.store == str(matrix_dir / "from-matrix")  # the matrix's, from its own directory
    assert s.memory_history == matrix_dir / "h.json"
    s = Settings.from_table(table, root=matrix_dir, environ={
        "FACTORY_STORE": "env-store", "FACTORY_MEMORY_HISTORY": "/shared/h.json"})
    assert s.store == str(tmp_path / "env-store")
    assert s.memory_history == Path("/shared/h.json")
    assert Settings.from_table(table, root=matrix_dir, environ={
        "FACTORY_STORE": "s3://bucket/prefix"}).store == "s3://bucket/prefix"
    # Empty is unset: a workflow passing an unset repository variable through changes nothing.
    assert Settings.from_table(table, root=matrix_dir, environ={"FACTORY_STORE": ""}).store == (
        str(matrix_dir / "from-matrix"))


def _store_named(tmp_path: Path, *args: str, env: dict[str, str]) -> str:
    """The store `factory index verify` looked at (it refuses a store that does not exist)."""
    r = factory_cli("index", "verify", *args, env=env, cwd=tmp_path)
    assert r.returncode != 0
    m = re.match(r"ERROR store (\S+) does not exist", r.stderr)
    assert m, r.stderr
    return m.group(1)


def test_every_store_option_follows_the_one_precedence(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(
        'version = 1\n[settings]\nstore = "matrix-store"\n[axes]\ntorch = ["2.14.1"]\n'
        'cuda = ["13.0"]\narchs = [["10.0"]]\npython = ["3.11"]\n'
        '[packages.flash-attn]\nrecipe = "flash-attn"\nversions = ["2.8.3.post2"]\n')
    env = {"FACTORY_STORE": str(tmp_path / "env-store")}
    assert _store_named(tmp_path, "--store", str(tmp_path / "cli-store"), env=env) == str(
        tmp_path / "cli-store")
    assert _store_named(tmp_path, env=env) == str(tmp_path / "env-store")
    assert _store_named(tmp_path, env={"FACTORY_STORE": ""}) == str(tmp_path / "matrix-store")


def test_factory_matrix_names_the_matrix_and_the_option_beats_it(tmp_path: Path) -> None:
    text = ('version = 1\n[axes]\ntorch = ["2.14.1"]\ncuda = ["13.0"]\narchs = [["{}"]]\n'
            'python = ["3.11"]\n[packages.flash-attn]\nrecipe = "flash-attn"\n'
            'versions = ["2.8.3.post2"]\n')
    (tmp_path / "env.toml").write_text(text.format("9.0"))
    (tmp_path / "cli.toml").write_text(text.format("12.0"))
    env = {"FACTORY_MATRIX": str(tmp_path / "env.toml")}
    r = factory_cli("matrix", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "sm90-cp311" in r.stdout, r.stderr
    r = factory_cli("matrix", "--matrix", str(tmp_path / "cli.toml"), env=env, cwd=tmp_path)
    assert r.returncode == 0 and "sm120-cp311" in r.stdout, r.stderr


def test_help_lists_every_variable_with_the_precedence() -> None:
    r = factory_cli("--help")
    assert r.returncode == 0, r.stderr
    assert "environment (command line > environment > matrix.toml > default):" in r.stdout
    for name in NAMES:
        assert re.search(rf"^  {name}\s+\S", r.stdout, re.M), name


def _workflow_env(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {k for k in node.get("env", {}) if str(k).startswith("FACTORY_")}
        return found.union(*(_workflow_env(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_workflow_env(v) for v in node))
    return set()


def _workflow_runs(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["run"]] if isinstance(node.get("run"), str) else []
        return own + [r for v in node.values() for r in _workflow_runs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _workflow_runs(v)]
    return []


# `export X=...`, `X=... command`, `local X=...`: a shell assignment, not a comment's mention
_ASSIGNED = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|readonly\s+)?(FACTORY_[A-Z0-9_]+)=")


def _shell_sets(script: str) -> set[str]:
    lines = (re.sub(r"(?:^|\s)#.*$", "", line) for line in script.splitlines())
    return {m.group(1) for line in lines for m in _ASSIGNED.finditer(line)}


def _scripts() -> list[Path]:
    return sorted([*(REPO / "docker").glob("*.sh"), *(p for p in (REPO / ".ci").iterdir()
                                                       if p.is_file())])


def test_the_shell_assignments_are_found() -> None:
    script = ("# FACTORY_IN_A_COMMENT=1\nexport FACTORY_A=0\nFACTORY_B= FACTORY_C=x bash s.sh\n"
              "if true; then FACTORY_D=1 cmd; fi  # FACTORY_E=2\necho $FACTORY_F ${FACTORY_G:-x}")
    assert _shell_sets(script) == {"FACTORY_A", "FACTORY_B", "FACTORY_C", "FACTORY_D"}


def test_every_variable_the_workflows_and_scripts_set_is_read() -> None:
    """A FACTORY_* variable a workflow (its env: or a run: script) or a script of docker/ or .ci/
    sets is one the factory reads (ENVIRONMENT, listed by `factory --help`), or a knob of one of
    those scripts (docker/install-factory.sh's FACTORY_EXTRAS, read there as ${NAME...})."""
    scripts = "\n".join(p.read_text() for p in _scripts())
    read_by_a_script = set(re.findall(r"\$\{(FACTORY_[A-Z0-9_]+)", scripts))
    sources = [(p.name, _shell_sets(p.read_text())) for p in _scripts()]
    for path in sorted((REPO / ".github/workflows").glob("*.yml")):
        workflow = yaml.safe_load(path.read_text())
        runs = set().union(*(_shell_sets(r) for r in _workflow_runs(workflow)))
        sources.append((path.name, _workflow_env(workflow) | runs))
    assert any(name == "nightly.yml" and "FACTORY_CI_GROUPS" in s for name, s in sources)
    for name, set_there in sources:
        unread = set_there - NAMES - read_by_a_script
        assert not unread, f"{name} sets {sorted(unread)}, which nothing reads"


def test_every_variable_the_docs_name_is_read_somewhere() -> None:
    """A FACTORY_* name in README.md or docs/ is in the table above, or read by a script or the
    code that the docs describe (the install scripts' FACTORY_VENV, a recipe's variables)."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {n for p in docs for n in re.findall(r"FACTORY_[A-Z0-9_]+", p.read_text())}
    sources = [*(REPO / "factory").rglob("*.py"), *(REPO / "docker").glob("*.sh"),
               *(REPO / ".ci").iterdir(), *(REPO / "tests").rglob("*.py")]
    code = "\n".join(p.read_text() for p in sources if p.is_file())
    secrets = {n for n in named if n.startswith("FACTORY_AWS_") or n == "FACTORY_KEEP_BUILDS"}
    for name in sorted(named - NAMES - secrets):  # repository secrets/variables: GitHub's
        template = name.rsplit("_", 1)[0] + "_{"  # read through a template: FACTORY_SYSROOT_{var}
        assert re.search(rf"\b{name}\b", code) or template in code, (
            f"the docs name {name}, which nothing reads")
