"""The command line's conventions that need real tools: the server's access log in Combined Log
Format, where a real pip and a real uv tell themselves apart by their user agents."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from index_wheels import make_wheel

from factory.index.publish import publish
from factory.index.server import running_server
from factory.store import LocalStore

pytestmark = pytest.mark.integration

CLF = re.compile(r'^(\S+) - (\S+) \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] '
                 r'"(GET|HEAD|POST) (\S+) HTTP/1\.[01]" (\d{3}) (\d+|-) "((?:[^"\\]|\\.)*)" '
                 r'"((?:[^"\\]|\\.)*)"$')


def test_the_access_log_tells_pip_from_uv(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                          ) -> None:
    store = LocalStore(tmp_path / "store")
    publish(store, [make_wheel(tmp_path / "w", "logged-pkg", "1.0")])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    caplog.set_level(logging.INFO, logger="factory.index.server")
    bin_dir = Path(sys.executable).parent
    with running_server(store.root) as server:
        index = server.url + "simple/"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                        "--isolated", "--index-url", index, "-d", str(tmp_path / "dl"),
                        "logged-pkg"], check=True, capture_output=True, env=env, timeout=300)
        subprocess.run([str(bin_dir / "uv"), "pip", "compile", "--no-cache", "--index-url",
                        index, "-"], input="logged-pkg\n", text=True, check=True,
                       capture_output=True, env=env, timeout=300)
    lines = [r.getMessage() for r in caplog.records if r.name == "factory.index.server"]
    parsed = [m for m in map(CLF.match, lines) if m]
    assert len(parsed) == len(lines) and parsed, lines  # every line is Combined Log Format
    agents = {m.group(8).split("/")[0] for m in parsed if m.group(4).startswith("/simple/")}
    assert {"pip", "uv"} <= agents, agents
    wheel = [m for m in parsed if m.group(4).endswith(".whl") and m.group(8).startswith("pip/")]
    assert wheel and wheel[0].group(5) == "200" and int(wheel[0].group(6)) > 0
