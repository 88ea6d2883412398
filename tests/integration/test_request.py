"""`factory matrix --missing` and `factory request`: a store with some cells published lists
exactly the rest; a published cell is answered from the store with no build; a missing one is
built (the build function is faked here, except in the docker end-to-end test) and published."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest


from ops_builds import factory_cli

SPEC = "flash-attn==2.8.3.post2"


def _isolated_matrix(tmp_path: Path) -> Path:
    """The bundled extension's cell with its own work directory, so a build another test or
    person runs for the same cell cannot share its tree; the slow shared parts (wheelhouse,
    CUDA toolkit) are reused from the test cache."""
    from conftest import cache_root, write_example_matrix

    cache = tmp_path / "cache"
    cache.mkdir()
    if (cache_root() / "toolkits").is_dir():
        (cache / "toolkits").symlink_to(cache_root() / "toolkits")
    return write_example_matrix(tmp_path / "matrix.toml", work_dir=cache / "work")


# The end-to-end build's recipe, declared only in its matrix as docs/RECIPES.md shows a team
# doing (the generic recipe's build requirements: the same venv and wheelhouse). Its fixed
# variable shows in the build: setuptools adds CPPFLAGS to every host compile.
TEAM_RECIPE = """
[recipes.team-ext]
revision = "1"
about = "the bundled example as a team's private extension"
build-requires = ["setuptools", "wheel", "ninja", "packaging"]
memory-model = "torch-extension"
[recipes.team-ext.knobs]
local-version = "FACTORY_LOCAL_VERSION"
force-build = "TEAM_EXT_FORCE_BUILD=1"
[recipes.team-ext.env]
CPPFLAGS = "-DTEAM_EXT_FAST_MATH=1"
"""


def _team_matrix(tmp_path: Path) -> Path:
    """The isolated matrix with the example built by TEAM_RECIPE instead of a shipped recipe."""
    path = _isolated_matrix(tmp_path)
    text = path.read_text()
    assert 'recipe = "torch-extension"' in text
    path.write_text(text.replace('recipe = "torch-extension"', 'recipe = "team-ext"')
                    + TEAM_RECIPE)
    return path


def _docker_ready() -> str | None:
    from conftest import cache_root

    if shutil.which("docker") is None:
        return "no docker"
    if subprocess.run(["docker", "image", "inspect", "factory-base:bookworm"], capture_output=True).returncode:
        return "no factory-base:bookworm image (docker/setup-host.sh makes it)"
    if not (cache_root() / "wheelhouse" / "cp311").is_dir():
        return "no wheelhouse for cp311 (docker/setup-host.sh prepares it)"
    return None


@pytest.mark.docker
@pytest.mark.slow
def test_request_end_to_end_with_the_bundled_extension(tmp_path: Path) -> None:
    """A real build in docker (about 1.5 min of nvcc on 2 idle cores) through a recipe declared
    only in the matrix, published, then answered from the store by a second request that builds
    nothing."""
    reason = _docker_ready()
    if reason:
        pytest.skip(reason)
    store = tmp_path / "store"
    args = ["request", "factory-example-ext==0.1.0", "--torch", "2.14.1", "--cuda", "13.0",
            "--arch", "10.0", "--python", "3.11", "--store", str(store),
            "--out", str(tmp_path / "dist"), "--matrix", str(_team_matrix(tmp_path))]
    looked = factory_cli(*args, "--check", timeout=300)  # only looks: nothing is built
    assert looked.returncode == 1 and "not published" in looked.stderr
    args.append("--yes")  # no terminal to ask on
    first = factory_cli(*args, timeout=3000)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "built and published" in first.stderr
    line = first.stdout.strip()
    assert line.endswith("/cu130-torch2.14-sm100/simple/ factory-example-ext==0.1.0+cu130torch2.14sm100")
    second = factory_cli(*args, timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == line and "already published, nothing to build" in second.stderr
    shown = factory_cli("show", "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311",
                        "--store", str(store), "--json")
    assert shown.returncode == 0, shown.stderr
    (manifest,) = json.loads(shown.stdout)["manifests"]
    assert manifest["attempts"] and manifest["plan"]["max_jobs"] >= 1
    # built by the matrix's own recipe: named in the provenance, its variable in the compile
    assert manifest["recipe"]["name"] == "team-ext"
    cell = tmp_path / "cache" / "work" / "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
    (log,) = (cell / "logs").glob("*-attempt-1.log")
    (host,) = [ln for ln in log.read_text().splitlines()
               if ln.startswith("[") and "csrc/bindings.cpp" in ln and " -c " in ln]
    assert " -DTEAM_EXT_FAST_MATH=1 " in f"{host} ", host
