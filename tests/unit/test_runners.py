"""What the runners do before their builds (start, prepare), so the build pipeline needs no
runner-specific branch."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX, write_example_matrix
from ops_builds import factory_cli

import factory
from factory import cli
from factory.build.job import check_cross
from factory.errors import ConfigError, EngineError
from factory.matrix.load import load_matrix
from factory.runners import RUNNERS, BuildJob, get_runner, runner_help, runner_kind
from factory.toolchain.cross import builder_platform

FACTORY = Path(factory.__file__).parent


def _job(tmp: Path, *, cuda_home: Path | None, image: str = "factory-base:bookworm") -> BuildJob:
    return BuildJob(cell_id="demo-0.1", python="3.11", image=image, src_dir=tmp / "src",
                    out_dir=tmp / "out", wheelhouse=tmp / "wh", cuda_home=cuda_home,
                    requirements=(), log_path=tmp / "build.log")


def test_docker_prepare_makes_the_builder_image_but_not_a_toolkit_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import factory.runners.docker as docker_runner

    made: list[str] = []
    monkeypatch.setattr(docker_runner, "ensure_builder_image", made.append)
    runner = get_runner("docker", client=object())
    runner.prepare(_job(tmp_path, cuda_home=tmp_path / "cuda"))
    assert made == ["factory-base:bookworm"]
    # an image that brings its own toolkit is the user's: used as it is, never made
    runner.prepare(_job(tmp_path, cuda_home=None, image="factory-cuda:12.8"))
    assert made == ["factory-base:bookworm"]


def test_docker_start_clears_stale_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    import factory.runners.docker as docker

    client = object()
    seen: list[object] = []
    monkeypatch.setattr(docker, "cleanup_stale", lambda c=None: seen.append(c) or [])
    get_runner("docker", client=client).start()
    assert seen == [client]


@pytest.mark.parametrize(("runner", "options", "needs"), [
    ("docker", {}, True),
    ("cibuildwheel", {}, True),
    ("local", {}, True),
    ("local", {"mode": "system-site"}, False),
    ("local", {"mode": "existing"}, False),
])
def test_a_wheelhouse_only_where_the_build_installs(
    runner: str, options: dict[str, str], needs: bool
) -> None:
    assert get_runner(runner, **options).needs_wheelhouse is needs


# -- the registry of runner kinds -----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_every_runner_kind_loads_its_class(name: str) -> None:
    cls = RUNNERS[name].load()
    assert cls.name == name  # type: ignore[attr-defined]
    assert get_runner(name).name == name


def _options(parser: argparse.ArgumentParser, command: str = "") -> Iterator[
        tuple[str, argparse.Action]]:
    """Every option of every subcommand of the real parser, as (command, action)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, nested in action.choices.items():
                yield from _options(nested, f"{command} {name}".strip())
        else:
            yield command, action


def test_the_cli_offers_exactly_the_registered_runners() -> None:
    """Every subcommand with a --runner (found in the parser, not listed here) takes the
    registry's kinds and says where each builds; every option a kind takes names that kind."""
    options = list(_options(cli.build_parser()))
    runners = {c: a for c, a in options if "--runner" in a.option_strings}
    assert {"build", "work"} <= set(runners)
    for command, action in runners.items():
        assert tuple(action.choices or ()) == tuple(RUNNERS), command
        assert action.help == runner_help()
        assert all(f"{k.name} ({k.where})" in runner_help() for k in RUNNERS.values())
    for command, action in options:
        if action.dest in ("uncapped", "python_env", "interpreter"):
            option = {"python_env": "mode"}.get(action.dest, action.dest)
            assert command in runners and action.help
            takes = [k.name for k in RUNNERS.values() if option in k.options]
            assert takes and action.help.startswith(f"{' and '.join(takes)} runner:"), command


@pytest.mark.parametrize("command", ["build", "work"])
def test_uncapped_is_refused_for_a_kind_that_does_not_take_it(tmp_path: Path,
                                                               command: str) -> None:
    refusing = [k.name for k in RUNNERS.values() if "uncapped" not in k.options]
    matrix = write_example_matrix(tmp_path / "m.toml", work_dir=tmp_path)
    args = ["--all", "--dry-run"] if command == "build" else ["--store", str(tmp_path / "s")]
    for name in refusing:
        r = factory_cli(command, *args, "--runner", name, "--uncapped", "--matrix", str(matrix))
        assert r.returncode == 2 and "to the local runner only" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


# Where a runner kind's name is not the runner: programs, docker's cgroup paths, a host name.
NOT_A_RUNNER = {("factory.process", "docker"), ("factory.process", "cibuildwheel"),
                ("factory.planning.cgroup", "docker"), ("factory.upstream.sources", "local")}


def test_no_module_outside_runners_names_a_runner_kind() -> None:
    """docs/ARCHITECTURE.md: a new runner is its module and one line in RUNNERS. Every other
    module reads the registry (choices, abilities, options, the default), never a kind's name."""
    named = []
    for path in sorted(FACTORY.rglob("*.py")):
        module = ".".join(path.relative_to(FACTORY.parent).with_suffix("").parts)
        if module.startswith("factory.runners"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and node.value in RUNNERS
                    and (module, node.value) not in NOT_A_RUNNER):
                named.append(f"{path.relative_to(FACTORY.parent)}:{node.lineno}: {node.value!r}")
    assert named == []


def test_an_unknown_runner_in_the_settings_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"\[settings\] runner 'podman' is not one of docker"):
        load_matrix(text=FLASH_ATTN_MATRIX.replace("[axes]",
                                                   '[settings]\nrunner = "podman"\n[axes]'))


def test_the_local_kind_takes_its_options() -> None:
    assert set(runner_kind("local").options) == {"mode", "uncapped", "interpreter"}


@pytest.mark.parametrize("name", sorted(RUNNERS))
def test_a_cell_for_another_cpu_needs_a_kind_that_cross_compiles(name: str) -> None:
    """The build refuses it before anything is fetched, naming the kinds that cross-compile."""
    other = "aarch64" if builder_platform() == "x86_64" else "x86_64"
    (pc,) = load_matrix(text=FLASH_ATTN_MATRIX.replace(
        "\n[packages.", f'\nplatform = ["{other}"]\n[packages.', 1)).cells
    kind = runner_kind(name)
    if kind.cross_compiles:
        check_cross(pc, kind)
        return
    able = [k for k in RUNNERS.values() if k.cross_compiles]
    with pytest.raises(EngineError, match=f"only for this builder's CPU .*, not {other}") as exc:
        check_cross(pc, kind)
    assert exc.value.tip == "cross-build the cell with " + " or ".join(
        f"--runner {k.name}" for k in able) and able
