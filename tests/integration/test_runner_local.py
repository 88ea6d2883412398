"""The local runner: a cgroup-capped build on this host, no docker. These builds need no
compiler (pure-Python packages and a memory hog), so they are cheap."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from runner_fixtures import cgroups_or_skip, probe_job, probe_package

from factory.runners import get_runner
from factory.toolchain.wheelhouse import BUILD_FRONTEND_REQUIREMENT

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.download
def test_venv_is_made_once_and_the_install_is_skipped_on_a_retry(
    tmp_path: Path, wheelhouse_cp311: Path
) -> None:
    cgroups_or_skip()
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the session wheelhouse is for cp311")
    src = probe_package(tmp_path)
    job = dataclasses.replace(probe_job(tmp_path, src), wheelhouse=wheelhouse_cp311,
                              requirements=("packaging", BUILD_FRONTEND_REQUIREMENT),
                              python="3.11")
    runner = get_runner("local", mode="venv", interpreter=sys.executable)
    first = runner.run(job)
    assert first.exit_code == 0, first.log_path.read_text()[-3000:]
    assert "install_seconds" in first.report
    venv = job.venv_for("local")
    assert (venv / "bin" / "python").exists()
    assert list((venv / "lib").glob("python3.11/site-packages/packaging"))
    second = runner.run(job)  # an OOM retry: same venv, same requirements
    assert second.exit_code == 0 and "install_seconds" not in second.report
