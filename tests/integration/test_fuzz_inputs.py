"""Bad input, property-based: malformed matrix.toml files, malformed wheels and random command
lines. Each must end in one ``ERROR`` line on stderr (optionally one ``TIP`` line), a non-zero
exit code that is not the internal-error code, no traceback, and an unchanged store.

Most examples go through ``factory.cli.main(argv)`` in this process (fast); a handful through a
real ``python -m factory``. Examples are derandomized (the same ones every CI run) and bounded
so the file runs in well under a minute; ``FACTORY_FUZZ_SCALE=N`` runs N times as many,
with fresh random ones, when hunting for bugs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cli_fixtures
import pytest
from cli_fixtures import assert_one_line_error, store_digest
from index_fixtures import cli

workspace = cli_fixtures.workspace  # shared with the unit tests of the same name
SCALE = int(os.environ.get("FACTORY_FUZZ_SCALE", "1"))


# -- the same, through a real process -------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["publish", "demo-1.0-py3-none-any.whl"],  # no such file
        ["verify", "--no-import", "garbage.whl"],
        ["matrix", "--matrix", "bad-matrix.toml"],
        ["plan", "not-a-cell"],
        ["index", "verify", "--store", "gs://bucket"],
        ["publish", "x" * 300 + ".whl"],
    ],
)
def test_a_real_process_fails_in_one_line(workspace: Path, argv: list[str]) -> None:
    (workspace / "garbage.whl").write_bytes(b"\x00\xffnot a zip")
    (workspace / "bad-matrix.toml").write_bytes(b'[settings]\nstore = "\xff"\n')
    before = store_digest(workspace)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FACTORY_DEBUG", None)
    proc = subprocess.run(cli(*argv), cwd=workspace, capture_output=True, text=True, env=env,
                          timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, argv)
    assert store_digest(workspace) == before
    assert sys.executable  # the child ran under this interpreter (cli() uses it)
