"""What the bad-input tests of both tiers share: a workspace with a valid matrix and a store holding
one published wheel, a digest of that store (unchanged by a refused command), and the judge of a
one-line error."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from index_wheels import variant_wheel

from factory.cli import main
from factory.index.publish import publish
from factory.store import LocalStore

INTERNAL_ERROR = 70  # cli.main's code for an exception that is not a FactoryError: a bug


def store_digest(root: Path) -> str:
    """Every path, mode and byte under the store (lock files and all)."""
    h = hashlib.sha256()
    for p in sorted((root / "store").rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(oct(p.lstat().st_mode).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def assert_one_line_error(code: int, stderr: str, argv: list[str]) -> None:
    lines = stderr.splitlines()
    assert code != 0, f"{argv!r} succeeded"
    assert "Traceback" not in stderr, stderr
    assert code != INTERNAL_ERROR, f"{argv!r}: {stderr}"
    assert lines and lines[0].startswith("ERROR "), f"{argv!r}: {stderr!r}"
    # one line per problem (a matrix reports all of its problems), then at most one TIP
    errors = [line for line in lines if line.startswith("ERROR ")]
    assert lines[: len(errors)] == errors and len(lines) - len(errors) <= 1, stderr
    assert len(lines) == len(errors) or lines[-1].startswith("TIP "), stderr


# -- the workspace: a directory with a valid matrix and a store holding one published wheel ------
BASE_MATRIX: dict[str, Any] = {
    "version": 1,
    "settings": {"store": "store", "runner": "docker", "memory": "auto"},
    "axes": {"torch": ["2.14.1"], "cuda": ["13.0"], "archs": [["10.0"]], "python": ["3.11"]},
    "packages": {"demo-ext": {"recipe": "torch-extension", "versions": ["0.1.0"]}},
    "include": [
        {"package": "demo-ext", "torch": "2.14.1", "cuda": "13.0", "archs": ["12.0"],
         "python": "3.12"},
    ],
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "matrix.toml").write_text(tomli_w.dumps(BASE_MATRIX))
    publish(LocalStore(root / "store"), [variant_wheel(root / "published", "demo-ext", "0.1.0",
                                                       "2.14")])
    assert main(["matrix", "--matrix", str(root / "matrix.toml")]) == 0  # the base is valid
    return root
