"""The client matrix: pip, uv, Poetry and PDM against the index served by `factory serve`, a
static copy of the store (a plain file server, as S3 website hosting or nginx would serve it)
and an S3 store (moto on loopback, behind a website-style front that maps ``.../`` to
``.../index.html``).

One fake project, ``fa-demo 1.0``, is published as three builds that a resolver could confuse:
sm90 and sm100 for CUDA 13.0, and sm100 for CUDA 12.8, all for torch 2.14. For each host
(an H200 with torch+cu130, a B200 with torch+cu130, a B200 with torch+cu128) the doctor reads
the index and prints the URL and config (`factory doctor --format ...`); each client, configured
with exactly that snippet, must install the build for that host. Also: an exact pin on the
combined index, a yanked newest version (never chosen) and a file swapped after indexing (the
hash check refuses it). PyPI is played by a second local index holding a fake torch.
Resolution (pip --dry-run, uv lock, poetry lock, pdm lock) must fetch metadata files only.

Poetry and PDM are installed from PyPI into venvs once and kept under the test cache.
"""

from __future__ import annotations

import configparser
import logging
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import client_fixtures
import index_fixtures
import pytest
from client_fixtures import STAND_IN, TOOLS
from index_fixtures import installer_env, uv_bin
from index_wheels import make_wheel, variant_wheel

from factory.hosts.choose import Choice
from factory.hosts.doctor import diagnose
from factory.hosts.index_reader import IndexAccess
from factory.hosts.probe import Gpu, HostInfo
from factory.hosts.snippets import render_snippet
from factory.index.publish import publish, yank
from factory.index.server import running_server
from factory.matrix.manylinux import host_glibc
from factory.store import LocalStore, open_store

client_bins = client_fixtures.client_bins  # Poetry and PDM, installed once into the test cache
moto_endpoint = index_fixtures.moto_endpoint
pytestmark = pytest.mark.integration

TORCH = "2.14.1"
HOSTS = {
    "h200-cu130": (90, "13.0", "1.0+cu130torch2.14sm90"),
    "b200-cu130": (100, "13.0", "1.0+cu130torch2.14sm100"),
    "b200-cu128": (100, "12.8", "1.0+cu128torch2.14sm100"),
}
TAMPERED = "tp_demo-1.0-py3-none-any.whl"


# -- the indexes -----------------------------------------------------------------------------
def _wheels(tmp: Path) -> list[Path]:
    wheels = [
        variant_wheel(tmp, "fa-demo", "1.0", "2.14", cuda=cuda, archs=archs)
        for cuda, archs in (("13.0", "90"), ("13.0", "100"), ("12.8", "100"))
    ]
    wheels += [make_wheel(tmp, "yk-demo", v) for v in ("1.0", "1.1")]
    wheels.append(make_wheel(tmp, "tp-demo", "1.0"))
    return wheels


def _swapped(tmp: Path) -> bytes:
    """A valid wheel of the same name, with other bytes: only the hash can tell."""
    return make_wheel(
        tmp / "swap", "tp-demo", "1.0", extra_members={"tp_demo/evil.py": b"raise SystemExit\n"}
    ).read_bytes()


class _StaticFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _S3Website(BaseHTTPRequestHandler):
    """What S3 website hosting (or a CDN's index-document rule) does: '.../' -> '.../index.html'."""

    client: Any
    bucket: str
    prefix: str

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if path == "" or path.endswith("/"):
            path += "index.html"
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{path}")
            body, ctype = obj["Body"].read(), obj.get("ContentType", "application/octet-stream")
            status = 200
        except self.client.exceptions.NoSuchKey:
            body, ctype, status = b"not found\n", "text/plain", 404
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clients")


@pytest.fixture(scope="module")
def local_store(tmp: Path) -> LocalStore:
    store = LocalStore(tmp / "store")
    publish(store, _wheels(tmp / "w"))
    yank(store, "yk_demo-1.1-py3-none-any.whl", "broken on purpose")
    store.path(f"files/tp-demo/{TAMPERED}").write_bytes(_swapped(tmp))
    return store


@pytest.fixture(scope="module")
def pypi(tmp: Path) -> Iterator[str]:
    """PyPI's stand-in: the fake torch."""
    store = LocalStore(tmp / "pypi")
    publish(store, [make_wheel(tmp / "w", "torch", TORCH)])
    with running_server(store.root) as server:
        yield server.url + "simple/"


def _serve_in_thread(server: ThreadingHTTPServer) -> Iterator[str]:
    for url in index_fixtures.serve_in_thread(server):
        yield url + "/"


@pytest.fixture(scope="module")
def served(local_store: LocalStore) -> Iterator[str]:
    with running_server(local_store.root) as server:
        yield server.url


@pytest.fixture(scope="module")
def static(local_store: LocalStore, tmp: Path) -> Iterator[str]:
    copy = tmp / "static"
    shutil.copytree(local_store.root, copy, ignore=shutil.ignore_patterns(".*"))
    handler = partial(_StaticFiles, directory=str(copy))
    yield from _serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), handler))


@pytest.fixture(scope="module")
def s3(moto_endpoint: str, tmp: Path) -> Iterator[str]:
    import boto3

    env = {**index_fixtures.S3_ENV, "FACTORY_S3_ENDPOINT_URL": moto_endpoint}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="wheels")
        store = open_store("s3://wheels/pub")
        publish(store, _wheels(tmp / "w"))
        yank(store, "yk_demo-1.1-py3-none-any.whl", "broken on purpose")
        client.put_object(Bucket="wheels", Key=f"pub/files/tp-demo/{TAMPERED}", Body=_swapped(tmp))
        front = type(
            "Front", (_S3Website,), {"client": client, "bucket": "wheels", "prefix": "pub"}
        )
        yield from _serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), front))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- hosts and installs ----------------------------------------------------------------------
def _host(sm: int, cuda: str) -> HostInfo:
    """A host as the doctor reads it; given here instead of detected (no GPU in CI)."""
    return HostInfo(
        python=f"{sys.version_info[0]}.{sys.version_info[1]}",
        python_exe=sys.executable,
        python_source="--python",
        torch=TORCH,
        torch_local="cu" + cuda.replace(".", ""),
        torch_cuda=cuda,
        torch_error=None,
        driver="580.95.05",
        gpus=(Gpu(name=f"GPU sm_{sm}", sm=sm),),
        gpu_source="recorded",
        gpu_note=None,
        glibc=host_glibc(),
        machine="x86_64",
    )


ACCESS_REQUEST = re.compile(r'\] "[A-Z]+ (\S+) [^"]*" \d{3} ')


class Requests(logging.Handler):
    """The paths the embedded server answered, from its request log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.paths: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # the access log's Combined Log Format: host - user [when] "METHOD /path VERSION" ...
        m = ACCESS_REQUEST.search(record.getMessage())
        if m:
            self.paths.append(m.group(1))


@pytest.fixture
def requests() -> Iterator[Requests]:
    handler = Requests()
    log = logging.getLogger("factory.index.server")
    old = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def _project(work: Path, requirement: str, pypi: str, tool_sections: str) -> Path:
    work.mkdir(parents=True)
    (work / "pyproject.toml").write_text(
        "[project]\n"
        'name = "host-app"\nversion = "0.1.0"\n'
        f'requires-python = ">={sys.version_info[0]}.{sys.version_info[1]}"\n'
        f'dependencies = ["torch=={TORCH}", "{requirement}"]\n\n{tool_sections}\n'
    )
    return work


def install(
    tool: str, choice: Choice, work: Path, pypi: str, bins: dict[str, Path]
) -> tuple[subprocess.CompletedProcess[str], Path | None, list[str]]:
    """Configure the client with the doctor's snippet for this choice, resolve, install.

    Returns (the failing or last step, the environment's python, the resolve step's argv)."""
    env = installer_env(work.parent)
    name = choice.project
    req = choice.requirement or name
    assert choice.index_url is not None
    snippet = render_snippet(tool, [choice], IndexAccess(url=choice.index_url),
                             _host(100, "13.0"))
    if tool == "pip":
        work.mkdir(parents=True)
        # The snippet's settings as pip reads them (PIP_CONFIG_FILE stays os.devnull: a set
        # PIP_CONFIG_FILE would still load the machine's global pip.conf beside it).
        conf = configparser.ConfigParser()
        conf.read_string(snippet)
        env["PIP_EXTRA_INDEX_URL"] = conf["global"]["extra-index-url"]
        venv = work / ".venv"
        subprocess.run(
            [uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env
        )
        base = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "--no-cache-dir",
            "--index-url",
            pypi,
            req,
            f"torch=={TORCH}",
        ]
        steps = [[*base[:6], "--dry-run", *base[6:]], base]
    elif tool == "uv":
        # No UV_NO_CONFIG here: it drops the project's own `default = true` index (uv would go
        # to the real PyPI); user and system uv.toml are kept out through XDG instead.
        del env["UV_NO_CONFIG"]
        env.update(
            XDG_CONFIG_HOME=str(work.parent / "xdg"), XDG_CONFIG_DIRS=str(work.parent / "xdg")
        )
        _project(
            work,
            req,
            pypi,
            STAND_IN["uv"].format(pypi=pypi) + snippet,
        )
        steps = [[uv_bin(), "lock"], [uv_bin(), "sync", "--python", sys.executable]]
    elif tool == "poetry":
        _project(
            work,
            req,
            pypi,
            STAND_IN["poetry"].format(pypi=pypi) + snippet,
        )
        env.update(
            POETRY_VIRTUALENVS_IN_PROJECT="true",
            POETRY_CACHE_DIR=str(work / ".poetry"),
            POETRY_NO_INTERACTION="1",
        )
        subprocess.run(
            [str(bins["poetry"]), "env", "use", sys.executable],
            cwd=work,
            env=env,
            capture_output=True,
            check=True,
        )
        steps = [[str(bins["poetry"]), "lock"], [str(bins["poetry"]), "install"]]
    else:
        _project(
            work,
            req,
            pypi,
            STAND_IN["pdm"].format(pypi=pypi) + snippet,
        )
        # PDM installs into the venv its python belongs to (else into __pypackages__).
        subprocess.run(
            [uv_bin(), "venv", "-q", "--python", sys.executable, str(work / ".venv")],
            check=True,
            env=env,
        )
        env.update(
            PDM_CACHE_DIR=str(work / ".pdm-cache"),
            PDM_HOME=str(work / ".pdm-home"),
            PDM_CHECK_UPDATE="false",
            PDM_PYTHON=str(work / ".venv/bin/python"),
            PDM_NON_INTERACTIVE="1",
        )
        steps = [[str(bins["pdm"]), "lock"], [str(bins["pdm"]), "install"]]
    done = None
    for step in steps:
        done = _run(step, work, env)
        if done.returncode != 0:
            break
    assert done is not None
    python = work / ".venv" / "bin" / "python"
    return done, (python if python.exists() else None), steps[0]


def installed(python: Path | None, work: Path) -> dict[str, str]:
    if python is None:
        return {}
    out = subprocess.run(
        [uv_bin(), "pip", "freeze", "--python", str(python)],
        capture_output=True,
        text=True,
        env=installer_env(work.parent),
    ).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


def work_lock(work: Path) -> str:
    return "".join(p.read_text() for p in work.glob("*.lock"))


# Every mode on the embedded server; a subset on the static copy and on S3 keeps CI short.
CASES = [
    ("served", "per-variant:h200-cu130"),
    ("served", "per-variant:b200-cu130"),
    ("served", "per-variant:b200-cu128"),
    ("served", "combined"),
    ("served", "yank"),
    ("served", "hash"),
    ("static", "per-variant:h200-cu130"),
    ("static", "yank"),
    ("static", "hash"),
    ("s3", "per-variant:b200-cu128"),
    ("s3", "combined"),
    ("s3", "hash"),
]


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(("where", "mode"), CASES)
def test_client_matrix(
    request: pytest.FixtureRequest,
    tool: str,
    where: str,
    mode: str,
    pypi: str,
    client_bins: dict[str, Path],
    tmp_path: Path,
    requests: Requests,
) -> None:
    root = request.getfixturevalue(where)
    host_name = mode.split(":", 1)[1] if ":" in mode else "b200-cu130"
    sm, cuda, expected = HOSTS[host_name]
    if mode.startswith("per-variant") or mode == "combined":
        (choice,) = diagnose(_host(sm, cuda), root, ["fa-demo"]).choices
        assert choice.wheel is not None, choice.why
        if mode == "combined":  # the combined index, with the exact build pinned
            choice = Choice(
                project="fa-demo",
                wheel=choice.wheel,
                variant=None,
                why=None,
                index_url=root + "simple/",
                requirement=f"fa-demo=={expected}",
            )
        else:
            variant = expected.split("+")[1].replace("torch", "-torch").replace("sm", "-sm")
            assert choice.index_url == f"{root}{variant}/simple/"
    else:
        project = "yk-demo" if mode == "yank" else "tp-demo"
        choice = Choice(
            project=project,
            wheel=None,
            variant=None,
            why=None,
            index_url=root + "simple/",
            requirement=project,
        )
    done, python, resolve = install(tool, choice, tmp_path / "work", pypi, client_bins)
    have = installed(python, tmp_path)
    log = done.stdout + done.stderr
    if mode == "hash":
        assert done.returncode != 0 and "tp-demo" not in have, log
        return
    assert done.returncode == 0, log
    lock = work_lock(tmp_path / "work")
    assert "pypi.org" not in lock and "pythonhosted" not in lock  # nothing from the real PyPI
    if mode == "yank":
        assert have.get("yk-demo") == "1.0", log
        return
    assert have.get("fa-demo") == expected and have.get("torch") == TORCH, (have, python, log)
    if where == "served":
        # Resolving fetched metadata files only; the one wheel installed is the only .whl GET.
        wheels = [
            p for p in requests.paths if p.startswith("/files/fa-demo/") and p.endswith(".whl")
        ]
        assert len(wheels) <= 1 and all(expected.replace("+", "%2B") in p for p in wheels), (
            resolve,
            requests.paths,
        )
        assert any(p.endswith(".whl.metadata") for p in requests.paths) or tool == "pip"
