"""The strict wheel checks through the CLI (one line, the wheel error's exit code, nothing
stored) and on an S3 store (moto on loopback): nothing is written before every wheel passes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import index_fixtures
import pytest
from bad_wheels import MIB, REFUSED, make_bomb
from index_fixtures import cli
from index_wheels import make_wheel

from factory.errors import WheelError
from factory.index.publish import publish
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
