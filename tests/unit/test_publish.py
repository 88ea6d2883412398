"""Publishing and yanking: validation, idempotence, conflicts, crashes, concurrent publishers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from index_fixtures import cli
from index_wheels import make_wheel, variant_wheel

from factory.errors import WheelError
from factory.index.publish import inspect_wheel, publish
from factory.store import LocalStore


def _snapshot(root: Path) -> dict[str, bytes]:
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        if root.exists()
        else {}
    )


def _truncated(tmp: Path) -> Path:
    w = make_wheel(tmp / "t", "demo", "1.0")
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    return w


def _traversal(tmp: Path) -> Path:
    return make_wheel(tmp / "p", "demo", "1.0", extra_members={"../../etc/evil": b"x"})


BAD_WHEELS = {
    "name differs from METADATA": (
        lambda t: make_wheel(t / "n", "demo", "1.0", metadata_name="other"),
        "METADATA says",
    ),
    "version differs from METADATA": (
        lambda t: make_wheel(t / "v", "demo", "1.0", metadata_version="1.1"),
        "METADATA says",
    ),
    "no RECORD": (
        lambda t: make_wheel(t / "r", "demo", "1.0", skip_record=True),
        "RECORD is missing",
    ),
    "truncated zip": (_truncated, "not a readable zip"),
    "path traversal in the archive": (_traversal, "unsafe path"),
    "not a wheel name": (
        lambda t: make_wheel(t / "f", "demo", "1.0", filename="demo.zip"),
        "invalid wheel filename",
    ),
    "huge name": (
        lambda t: make_wheel(t / "h", "demo", "1.0", filename="d" * 220 + "-1.0-py3-none-any.whl"),
        "too long",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_WHEELS))
def test_bad_wheels_are_refused_and_change_nothing(case: str, tmp_path: Path) -> None:
    make, expected = BAD_WHEELS[case]
    wheel = make(tmp_path)
    good = make_wheel(tmp_path / "ok", "fine", "1.0")
    store_dir = tmp_path / "store"
    with pytest.raises(WheelError, match=expected):
        publish(LocalStore(store_dir), [good, wheel])  # checked before anything is written
    assert _snapshot(store_dir) == {}
    # The CLI says it in one line with the wheel error's exit code, no traceback.
    result = subprocess.run(
        cli("publish", "--store", str(store_dir), str(wheel)), capture_output=True, text=True
    )
    assert result.returncode == WheelError.exit_code
    assert result.stderr.startswith("ERROR ") and "Traceback" not in result.stderr
    assert _snapshot(store_dir) == {}


def test_inspect_reads_the_metadata(tmp_path: Path) -> None:
    wheel = variant_wheel(tmp_path, "flash-attn", "2.8.3", "2.14", requires_python=">=3.9")
    info = inspect_wheel(wheel)
    assert (info.project, info.version, info.variant) == (
        "flash-attn",
        "2.8.3+cu130torch2.14",
        "cu130-torch2.14",
    )
    assert info.requires_python == ">=3.9" and b"Requires-Dist: torch==2.14.*" in info.metadata
    assert inspect_wheel(wheel.read_bytes(), wheel.name) == info


def test_provenance_must_match_the_wheel(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0")
    wheel.with_name(wheel.name + ".provenance.json").write_text(
        json.dumps({"version": 1, "sha256": "0" * 64})
    )
    with pytest.raises(WheelError, match="does not match"):
        publish(LocalStore(tmp_path / "s"), [wheel])




@pytest.mark.parametrize("command", ["yank", "unyank"])
def test_yank_and_unyank_of_a_mistyped_store_say_it_does_not_exist(
    command: str, tmp_path: Path
) -> None:
    extra = ["--reason", "x"] if command == "yank" else []
    r = subprocess.run(
        cli(command, "--store", str(tmp_path / "no-such-store"), "demo-1.0-py3-none-any.whl",
            *extra),
        capture_output=True, text=True,
    )
    assert r.returncode == 11, r.stderr
    assert r.stderr.startswith(f"ERROR store {tmp_path / 'no-such-store'} does not exist"), r.stderr
    assert not (tmp_path / "no-such-store").exists()
