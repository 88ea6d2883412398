"""The strict wheel checks through the CLI (one line, the wheel error's exit code, nothing
stored) and on an S3 store (moto on loopback): nothing is written before every wheel passes."""

from __future__ import annotations

import base64
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import index_fixtures
import pytest
from bad_wheels import MIB, PIP_ACCEPTED, PIP_REFUSED, REFUSED, make_bomb
from index_fixtures import cli, installer_env, multipart_upload, write_htpasswd
from index_wheels import make_wheel

from factory.errors import WheelError
from factory.index.publish import publish
from factory.index.server import running_server
from factory.store import open_store

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec


@pytest.mark.integration
def test_cli_refusals_are_one_line_with_the_wheel_exit_code(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    for case in ("encrypted member", "compression method 99", "invalid platform tag"):
        wheel = REFUSED[case][0](tmp_path / case.replace(" ", "-"))
        result = subprocess.run(
            cli("publish", "--store", str(store_dir), str(wheel)), capture_output=True, text=True
        )
        assert result.returncode == WheelError.exit_code, (case, result.stderr)
        assert result.stderr.startswith("ERROR ") and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2  # ERROR and perhaps a TIP
    bomb = make_bomb(tmp_path / "bomb", 32 * MIB)
    result = subprocess.run(
        cli("publish", "--store", str(store_dir), "--max-unpacked", "8m", str(bomb)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == WheelError.exit_code and "unpacks to more than" in result.stderr
    assert not (store_dir / "files").exists()


@pytest.mark.integration
def test_s3_store_refuses_before_writing(s3_spec: str, tmp_path: Path) -> None:
    store = open_store(s3_spec)
    bad = REFUSED["filename tags differ from WHEEL"][0](tmp_path)
    with pytest.raises(WheelError):
        publish(store, [make_wheel(tmp_path / "ok", "fine", "1.0"), bad])
    assert list(store.list("")) == []
    assert publish(store, [make_wheel(tmp_path / "ok", "fine", "1.0")]).published
    assert store.strays() == []  # S3 writes are atomic: nothing half-written to report


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(PIP_REFUSED))
def test_pip_refuses_what_publish_and_upload_refuse(case: str, tmp_path: Path) -> None:
    """pip's own verdict on each wheel the checks refuse as pip would; then the same wheel
    through `factory publish` (exit 9, nothing stored) and a twine-style upload (400)."""
    make, words = REFUSED[case]
    wheel = make(tmp_path / "w")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
         str(tmp_path / "t"), str(wheel)],
        capture_output=True, text=True, env=installer_env(tmp_path), timeout=300,
    )
    said = pip.stdout + pip.stderr
    assert pip.returncode != 0, said
    assert "has an invalid wheel" in said or "is not compatible with this version of pip" in said
    assert "Traceback" not in said
    store_dir = tmp_path / "store"
    result = subprocess.run(cli("publish", "--store", str(store_dir), str(wheel)),
                            capture_output=True, text=True)
    assert result.returncode == WheelError.exit_code and words in result.stderr, result.stderr
    assert not (store_dir / "files").exists()
    htpasswd = write_htpasswd(tmp_path / "htpasswd", "u", "pw")
    with running_server(store_dir, htpasswd=htpasswd) as server:
        body = multipart_upload(wheel.name, wheel.read_bytes())
        request = urllib.request.Request(
            server.url, data=body, method="POST",
            headers={"Content-Type": "multipart/form-data; boundary=b0undary",
                     "Authorization": "Basic " + base64.b64encode(b"u:pw").decode()},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400 and words in refused.value.read().decode()
    assert not (store_dir / "files").exists()


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(PIP_ACCEPTED))
def test_pip_installs_what_the_checks_accept(case: str, tmp_path: Path) -> None:
    wheel = PIP_ACCEPTED[case](tmp_path / "w")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
         str(tmp_path / "t"), str(wheel)],
        capture_output=True, text=True, env=installer_env(tmp_path), timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    assert publish(open_store(str(tmp_path / "store")), [wheel]).published
