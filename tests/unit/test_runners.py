"""What the runners do before their builds (start, prepare), so the build pipeline needs no
runner-specific branch."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.runners import BuildJob, get_runner


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
