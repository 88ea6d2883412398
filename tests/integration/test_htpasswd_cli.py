"""htpasswd through ``factory serve`` (a weak file refused in one line), and the unit tests of
factory.index.htpasswd again under the previous bcrypt major (4.x) in a throwaway venv."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from index_fixtures import cli, uv_bin

from factory.errors import AuthError

# The example from the SHA-crypt specification (Drepper), default 5000 rounds.
SPEC_SETTING = "$6$saltstring"
SPEC_HASH = (
    "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOf"
    "aS35inz1"
)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.integration
def test_factory_serve_refuses_a_weak_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "htpasswd"
    path.write_text("carol:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n")
    (tmp_path / "store").mkdir()  # serve refuses a store that does not exist, before the file
    result = subprocess.run(
        cli("serve", "--store", str(tmp_path / "store"), "--port", "0", "--htpasswd", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == AuthError.exit_code
    assert result.stderr.startswith("ERROR ") and "'carol'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_under_the_previous_bcrypt_major(tmp_path: Path) -> None:
    """This module again, in a venv that sees this environment but has bcrypt 4.x."""

    if os.environ.get("FACTORY_BCRYPT_PREVIOUS"):
        pytest.skip("already the run under the previous major")
    venv = tmp_path / "venv"
    uv = uv_bin()
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    # This environment's packages, after the venv's own (a .pth line appends to sys.path), so
    # its bcrypt 4.x comes first. Not --system-site-packages: from inside a venv (the README's
    # .venv) that is the base interpreter's site-packages, which has no pytest and no factory deps.
    site = next((venv / "lib").glob("python3*/site-packages"))
    paths = sysconfig.get_paths()
    (site / "outer-environment.pth").write_text(
        "".join(f"{d}\n" for d in dict.fromkeys((paths["purelib"], paths["platlib"])))
    )
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "bcrypt>=4.1,<5"],
        capture_output=True,
        text=True,
    )
    if installed.returncode != 0:
        pytest.skip(f"cannot install bcrypt 4.x here: {installed.stderr.strip()[-200:]}")
    version = subprocess.run(
        [python, "-c", "import bcrypt; print(bcrypt.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version.startswith("4."), version
    tests = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "FACTORY_BCRYPT_PREVIOUS": "1",
        "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)]),
    }
    run = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(tests / "unit" / "test_htpasswd.py"),
            "-m",
            "not integration",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
