"""What the runners do before their builds (start, prepare), so the build pipeline needs no
runner-specific branch."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX, write_example_matrix
from ops_builds import factory_cli

from factory.build.job import check_cross
from factory.errors import ConfigError, EngineError
from factory.matrix.load import load_matrix
from factory.runners import RUNNERS, BuildJob, get_runner, runner_kind
from factory.toolchain.cross import builder_platform


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


def test_the_cli_offers_exactly_the_registered_runners() -> None:
    from factory import cli

    for command in ("build", "rebuild-check", "request"):
        parser = cli.build_parser()
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]
        runner = next(a for a in sub._actions if a.dest == "runner")
        assert tuple(runner.choices) == tuple(RUNNERS)


def test_an_unknown_runner_in_the_settings_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"\[settings\] runner 'podman' is not one of docker"):
        load_matrix(text=FLASH_ATTN_MATRIX.replace("[axes]",
                                                   '[settings]\nrunner = "podman"\n[axes]'))


def test_the_local_kind_takes_its_options_and_the_others_refuse_them(tmp_path: Path) -> None:
    assert set(runner_kind("local").options) == {"mode", "uncapped", "interpreter"}
    r = factory_cli("build", "--all", "--runner", "docker", "--uncapped", "--dry-run",
                    "--matrix", str(write_example_matrix(tmp_path / "m.toml", work_dir=tmp_path)))
    assert r.returncode != 0 and "apply to the local runner only" in r.stderr


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
