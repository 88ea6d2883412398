"""The installers the client and deployment tests drive: Poetry and PDM installed once into the
test cache, each client's project settings that put a PyPI stand-in in PyPI's place, and the pip
that Debian 12 ships."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cache_root

# The clients as users install them (PDM 2.29.4 breaks with hishel 2: PDM's own "locked"
# extra pins hishel 1.4).
CLIENTS = {
    "poetry": ["poetry==2.5.1"],
    "pdm": ["pdm==2.29.4", "hishel[httpx2]>=1.4,<2"],
}
TOOLS = ["pip", "uv", "poetry", "pdm"]
OLD_PIP = "23.0.1"  # Debian 12's python3-pip
# Each client's project settings that put PyPI's stand-in in PyPI's place.
STAND_IN = {
    "uv": """[tool.uv]
package = false

[[tool.uv.index]]
name = "pypi"
url = "{pypi}"
default = true

""",
    "poetry": """[tool.poetry]
package-mode = false

[[tool.poetry.source]]
name = "pypi-stand-in"
url = "{pypi}"
priority = "primary"

""",
    "pdm": """[tool.pdm]
distribution = false

[[tool.pdm.source]]
name = "pypi"
url = "{pypi}"

""",
}


@pytest.fixture(scope="session")
def client_bins() -> dict[str, Path]:
    """Poetry and PDM, each in its own venv under the test cache (installed once)."""
    out = {}
    for tool, requirements in CLIENTS.items():
        venv = cache_root() / "clients" / requirements[0].replace("==", "-")
        done = venv / ".complete"
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            install = subprocess.run(
                [str(venv / "bin/python"), "-m", "pip", "install", "-q", *requirements],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if install.returncode != 0:
                pytest.skip(f"cannot install {tool} from PyPI: {install.stderr[-300:]}")
            done.touch()
        out[tool] = venv / "bin" / tool
    return out
