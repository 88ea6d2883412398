"""The host scripts' small promises: setup waits for the apt lock instead of failing at once,
and the install refuses an interpreter below requires-python in one line (the workflows use
the runner's python3). apt-get and the old python are stand-ins on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO

LOCKED = ("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)\n"
          "E: Unable to lock directory /var/lib/apt/lists/\n")


def _stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _apt_get(tmp_path: Path, locked_runs: int, *, other_error: bool = False,
             wait: str = "600") -> subprocess.CompletedProcess[str]:
    """apt_get update with an apt-get that finds the lock held ``locked_runs`` times."""
    count = tmp_path / "runs"
    count.write_text("0")
    fail = ('echo "E: Unable to locate package nope" >&2; exit 100' if other_error else
            f"if [ $n -le {locked_runs} ]; then printf '%s' '{LOCKED}' >&2; exit 100; fi")
    _stub(tmp_path / "bin", "apt-get",
          f'n=$(( $(cat "{count}") + 1 )); echo $n > "{count}"; echo "$*" > "{count}.args"\n'
          f"{fail}\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "APT_LOCK_POLL": "0.05",
           "APT_LOCK_WAIT": wait}
    return subprocess.run(["bash", "-c", "source docker/apt-wait.sh && apt_get update -qq"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_setup_waits_for_the_apt_lock(tmp_path: Path) -> None:
    r = _apt_get(tmp_path, locked_runs=2)
    assert r.returncode == 0, r.stderr
    waits = [ln for ln in r.stdout.splitlines() if "waiting for the apt lock" in ln]
    assert len(waits) == 2 and "held by process 4242 (apt-get)" in waits[0]
    assert (tmp_path / "runs").read_text().strip() == "3"
    # and dpkg's own lock is waited for by apt itself
    assert (tmp_path / "runs.args").read_text().split() == [
        "-o", "DPkg::Lock::Timeout=60", "update", "-qq"]


def test_other_apt_errors_and_a_lock_held_too_long_fail(tmp_path: Path) -> None:
    r = _apt_get(tmp_path, locked_runs=0, other_error=True)
    assert r.returncode == 1 and "Unable to locate package nope" in r.stderr
    assert (tmp_path / "runs").read_text().strip() == "1"
    r = _apt_get(tmp_path, locked_runs=99, wait="0")
    assert r.returncode == 1 and "Could not get lock" in r.stderr


def test_install_refuses_a_python_below_the_floor_in_one_line(tmp_path: Path) -> None:
    _stub(tmp_path / "bin", "python3", 'case "$1" in --version) echo "Python 3.9.2";; '
          '*) exit 1;; esac\n')
    env = {**os.environ, "FACTORY_PYTHON": str(tmp_path / "bin/python3"),
           "FACTORY_VENV": str(tmp_path / "venv"), "FACTORY_BIN_DIR": str(tmp_path / "links")}
    r = subprocess.run(["bash", "docker/install-factory.sh"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"ERROR {tmp_path / 'bin/python3'} is Python 3.9.2; the factory needs Python >= 3.10 "
        "(set FACTORY_PYTHON)"]
    assert not (tmp_path / "venv").exists()
