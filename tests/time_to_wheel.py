"""Time to wheel: what a nightly runs when a torch release appears on a PyPI stand-in on
loopback, with the real commands (``factory lock``, ``factory build --missing --publish``,
``factory index rebuild``), served by ``factory serve``, installed by pip into a clean venv and
imported. Shared by the integration test (which asserts what happened) and
benchmarks/time_to_wheel.py (which says how long it took).

The stand-in serves the wheelhouse the example cell builds from (torch 2.14.1 and its
requirements, the build requirements) and, once ``release()`` is called, torch 2.99.0: the
real 2.14.1 wheel re-versioned (``pypi_standin.fake_release``), so the new cell builds for real
and offline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from http_fixtures import factory_serve
from pypi_standin import StandIn, copy_tree_linked, fake_release

REPO = Path(__file__).resolve().parent.parent
NEW_TORCH = "2.99.0"
PACKAGE = "factory-example-ext"
NEW_CELL_ID = f"{PACKAGE}-0.1.0-torch{NEW_TORCH}-cu130-sm100-cp311"

MATRIX = """\
version = 1
[settings]
store = "{store}"
wheelhouse = "{wheelhouse}"
work-dir = "{work}"
venv-dir = "{venvs}"
[settings.compile-cache]
dir = "{compile_cache}"
[indexes]
pypi = "{pypi}simple/"
pytorch = "{pypi}whl/{{cuda_tag}}"
[axes]
torch = ["latest:2"]
cuda = ["default"]
archs = [["10.0"]]
python = ["torch"]
python-range = "==3.11.*"
platform = ["x86_64"]
[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "{source}"
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    name: str
    argv: tuple[str, ...]
    seconds: float
    returncode: int
    stdout: str
    stderr: str
    imported: str = ""  # install: what the import of the installed wheel printed

    def check(self) -> Step:
        if self.returncode != 0:
            raise AssertionError(f"{self.name} failed ({self.returncode}): "
                                 f"{self.stderr[-3000:] or self.stdout[-3000:]}")
        return self


@dataclasses.dataclass
class Setup:
    root: Path  # scratch: matrix, lock, store, wheelhouse
    standin: StandIn
    url: str  # the stand-in's root
    matrix: Path
    store: Path
    env: dict[str, str]

    def factory(self, name: str, *args: str, timeout: float = 3000) -> Step:
        argv = (sys.executable, "-m", "factory", *args)
        t0 = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=self.root,
                           timeout=timeout)
        return Step(name=name, argv=argv, seconds=time.monotonic() - t0,
                    returncode=r.returncode, stdout=r.stdout, stderr=r.stderr)

    def release(self, cache: Path) -> Path:
        """torch 2.99.0 appears on the stand-in (made once, kept in ``cache``)."""
        real = self.standin.find("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")
        assert real is not None, "the wheelhouse holds torch 2.14.1 for cp311"
        wheel = fake_release(real.path, NEW_TORCH, cache)
        self.standin.add(wheel, upload_time=_now())
        return wheel

    def nightly(self) -> list[Step]:
        """What the nightly runs, in order (one builder; the schedule is the unit tests')."""
        lock = self.factory("lock", "lock", "--matrix", str(self.matrix)).check()
        # the nightly passes each slot's share of its builder; this builder's share is 6 GiB
        build = self.factory("build", "build", "--missing", "--publish", "--cache",
                             "--memory", "6g", "--store", str(self.store),
                             "--matrix", str(self.matrix)).check()
        index = self.factory("index", "index", "rebuild", "--store", str(self.store)).check()
        return [lock, build, index]

    def served(self) -> contextlib.AbstractContextManager[str]:
        """``factory serve`` on the store, on a free loopback port: its root URL."""
        return factory_serve(self.store, "--host", "127.0.0.1")

    def install(self, index: str) -> Step:
        """A host with the new torch installs our wheel: pip installs torch 2.99.0 (from the
        stand-in) and the example (from the served index) into a clean venv, and the example
        imports there (loading its library registers its operators with torch: no GPU needed).
        stdout is pip's report, ``imported`` what the import printed."""
        report = self.root / "pip-report.json"
        venv = self.root / "host-venv"
        shutil.rmtree(venv, ignore_errors=True)
        python = str(venv / "bin" / "python")
        argv = (python, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                "--report", str(report),
                "--index-url", f"{self.url}simple/", "--extra-index-url", f"{index}simple/",
                f"torch=={NEW_TORCH}", PACKAGE)
        env = {k: v for k, v in self.env.items() if k not in ("PIP_INDEX_URL", "PYTHONPATH")}
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        imported = ""
        if r.returncode == 0:  # in the venv's own directory: nothing of the repo on the path
            r = subprocess.run([python, "-c", _IMPORT], capture_output=True, text=True, env=env,
                               cwd=venv, timeout=300)
            imported = r.stdout.strip()
        return Step(name="install", argv=argv, seconds=time.monotonic() - t0,
                    returncode=r.returncode, stdout=report.read_text() if report.exists()
                    else r.stdout, stderr=r.stderr, imported=imported)


# The installed example imports (its operators registered with the installed torch).
_IMPORT = """\
import importlib.metadata, torch, factory_example_ext as m
print(torch.__version__, importlib.metadata.version("factory-example-ext"), *m.__all__)
"""


def installed(step: Step) -> dict[str, str]:
    """name -> version from a pip --report."""
    doc = json.loads(step.stdout)
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in doc["install"]}


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def standin_setup(*, wheelhouse: Path, cache: Path, venvs: Path,
                  root: Path | None = None) -> Iterator[Setup]:
    """The stand-in serving ``wheelhouse/cp311`` (hard links, nothing copied), a matrix that
    tracks torch latest:2 for the example, an empty store; cleaned up after. The work dir sits
    beside ``cache`` (so the toolkit and sysroots beside it are the session's), with the new
    cell's build tree and the index answers of earlier runs removed first."""
    scratch = root or Path(tempfile.mkdtemp(prefix="time-to-wheel-"))
    work = cache.parent / "work-time-to-wheel"
    for stale in (work / NEW_CELL_ID, work / "upstream"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        standin = StandIn(hashes=_hashes(cache))
        for f in sorted((wheelhouse / "cp311").glob("*.whl")):
            standin.add(f)
        _save_hashes(cache, standin.hashes)
        wh = scratch / "wheelhouse"
        copy_tree_linked(wheelhouse / "cp311", wh / "cp311", skip=("download.log",))
        with standin.serve() as url:
            store = scratch / "store"
            matrix = scratch / "matrix.toml"
            matrix.write_text(MATRIX.format(
                store=store, wheelhouse=wh, work=work, venvs=venvs,
                compile_cache=cache.parent / "compile-cache", pypi=url,
                source=REPO / "tests" / "example_ext"))
            # pip as on a builder whose index is the stand-in: none of this machine's pip
            # configuration (its mirrors, and a constraint that caps torch at what its disk
            # holds, which a torch 2.99.0 would trip over)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("PIP_") and k != "FACTORY_FACTS"}
            env.update({"CI": "true", "PIP_INDEX_URL": f"{url}simple/",
                        "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                        "PYTHONPATH": str(REPO)})
            yield Setup(root=scratch, standin=standin, url=url, matrix=matrix, store=store,
                        env=env)
    finally:
        if root is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _hashes(cache: Path) -> dict[str, str]:
    try:
        data = json.loads((cache / "sha256.json").read_text())
        return {str(k): str(v) for k, v in data.items()}
    except (OSError, ValueError):
        return {}


def _save_hashes(cache: Path, hashes: dict[str, str]) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "sha256.json").write_text(json.dumps(hashes, indent=1, sort_keys=True))
