"""`factory doctor` on recorded hosts (tests/data/doctor/*.txt: nvidia-smi outputs) with a fake
torch on PYTHONPATH, against real index pages made by publishing fake builds into a store, read
as a directory and over HTTP. Always through the real CLI in a subprocess."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import doctor_fixtures
import pytest
from doctor_fixtures import FA, HOSTS, doctor, pip_line
from http_fixtures import factory_serve
from ops_builds import factory_cli

sm90_and_sm100 = doctor_fixtures.sm90_and_sm100  # shared with the unit tests of the same name
torch_dirs = doctor_fixtures.torch_dirs
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_http_index_gives_the_same_answer(sm90_and_sm100: Path, torch_dirs: dict[str, Path]) -> None:
    """Over HTTP from the project's own embedded server (`factory serve`)."""
    with _serve(sm90_and_sm100) as url:
        r = doctor(url + "/simple/", "rtx-pro-6000.txt", torch_dirs["2.14-cu130"])
        assert r.returncode == 1, r.stdout + r.stderr
        assert "only has sm_90 and sm_100 builds of flash-attn for cu130-torch2.14" in r.stdout
        r = doctor(url, "b200.txt", torch_dirs["2.14-cu130"])
        assert r.returncode == 0, r.stdout + r.stderr
        # 127.0.0.1 is loopback: pip needs no --trusted-host there (test_deployment.py: by name)
        assert pip_line(f"{url}/cu130-torch2.14-sm100/simple/", f"{FA}sm100") in r.stdout
        r = factory_cli("doctor", "--index", url + "/nothing-here", "--nvidia-smi-output",
                        str(HOSTS / "b200.txt"))
        assert r.returncode == 11 and r.stderr.startswith("ERROR no index at")


@contextlib.contextmanager
def _serve(store: Path) -> Iterator[str]:
    with factory_serve(store) as url:  # on 127.0.0.1, the default
        yield url.rstrip("/")


@pytest.mark.parametrize("host, sm", [("h200.txt", "sm90"), ("b200.txt", "sm100")])
def test_real_pip_installs_what_the_doctor_chose(
    sm90_and_sm100: Path, torch_dirs: dict[str, Path], tmp_path: Path, host: str, sm: str
) -> None:
    r = doctor(sm90_and_sm100, host, torch_dirs["2.14-cu130"], "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    (result,) = json.loads(r.stdout)["results"]
    assert f"torch2.14{sm}-" in result["wheel"]
    assert _pip_picks(result["install"], tmp_path) == result["wheel"]


def _pip_picks(install_line: str, tmp_path: Path) -> str:
    """The file real pip chooses for the doctor's line (offline: the index as the only index)."""
    _, _, rest = install_line.partition("--extra-index-url ")
    url, requirement = rest.split()
    assert requirement.startswith("flash-attn==2.8.3.post2+")  # the exact build
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--no-deps", "-q",
         "--index-url", url, requirement, "--report", str(report)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (item,) = json.loads(report.read_text())["install"]
    return urllib.parse.unquote(item["download_info"]["url"].rsplit("/", 1)[1])
