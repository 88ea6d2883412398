"""The headline install, deployed as a team would: `factory serve` on a host reached by name (this
machine's host name: pip and PDM treat any name but localhost as a remote host, unlike the
127.0.0.1 the other tests use), over plain http and over https with a CA this test makes. For
each recorded GPU host (tests/data/doctor: B200, H200, GB200, RTX PRO 6000) and each client
(pip current, Debian 12's pip 23.0.1, uv, Poetry, PDM), in a clean environment (no pip.conf,
PIP_* or UV_* of this machine), exactly what `factory doctor` prints is pasted (the report's
pip line, and `--format pip|uv|poetry|pdm`), and the installed build is asserted: sm100 on the
B200, sm90 on the H200, the aarch64 sm100 build on the GB200, and "nothing fits" on the RTX PRO
6000 (sm_120). PyPI is played by a static index on loopback holding the fake torch and a NEWER
flash-attn sdist (upstream's next release), which must never be fetched.

This builder is x86_64: for the GB200 the pasted pip line is asked what it would install on an
aarch64 host (pip's own `--platform`), and uv, Poetry and PDM, which lock for every platform,
must lock the aarch64 build beside the x86_64 one.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.metadata
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import client_fixtures
import pytest
from client_fixtures import OLD_PIP, STAND_IN, TOOLS
from conftest import REPO, cache_root
from http_fixtures import factory_serve
from index_fixtures import uv_bin
from index_wheels import make_wheel, variant_wheel

from factory.hosts.snippets import RUN
from factory.index.publish import publish
from factory.store import LocalStore

pytestmark = [pytest.mark.integration, pytest.mark.download]
client_bins = client_fixtures.client_bins  # Poetry and PDM, installed once into the test cache

HOSTS_DIR = REPO / "tests" / "data" / "doctor"
PY = f"{sys.version_info[0]}{sys.version_info[1]}"
TORCH = "2.14.1"
FA = "2.8.3.post2"
NEWER_UPSTREAM = "2.9.0"  # on the PyPI stand-in as an sdist only
NAME = socket.gethostname()
# recorded host -> (nvidia-smi output, --machine, the local version it must get, CPU)
HOSTS = {
    "b200": ("b200.txt", None, f"{FA}+cu130torch2.14sm100", "x86_64"),
    "h200": ("h200.txt", None, f"{FA}+cu130torch2.14sm90", "x86_64"),
    "gb200": ("gb200.txt", "aarch64", f"{FA}+cu130torch2.14sm100", "aarch64"),
}
CLIENTS = ["pip", f"pip-{OLD_PIP}", "uv", "poetry", "pdm"]
SYSTEM_UV_TOML = Path("/etc/uv/uv.toml")  # uv reads it when XDG_CONFIG_DIRS holds no uv.toml


# -- the machines ----------------------------------------------------------------------------
def _cert_pair(tmp: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for this machine's name signed by it: (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "factory test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy")


@pytest.fixture(scope="module")
def tls(tmp: Path) -> tuple[Path, Path, Path]:
    """(cert, key, the bundle hosts are told): the bundle is the system's roots plus the private
    CA, as docs/DEPLOY.md says to make it (pip's --cert and uv's SSL_CERT_FILE replace the
    default roots, and PyPI still has to verify)."""
    ca, cert, key = _cert_pair(tmp)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    bundle = tmp / "bundle.pem"
    bundle.write_bytes((system.read_bytes() if system.is_file() else b"") + ca.read_bytes())
    return cert, key, bundle


@pytest.fixture(scope="module")
def store(tmp: Path) -> Path:
    """The factory's store: three builds of one flash-attn version that a resolver could
    confuse (sm90 and sm100 for x86_64, sm100 for aarch64), each pinning torch 2.14."""
    root = tmp / "store"
    wheels = [variant_wheel(tmp / "w", "flash-attn", FA, "2.14", archs=archs,
                            tag=f"cp{PY}-cp{PY}-manylinux_2_28_{cpu}")
              for archs, cpu in (("90", "x86_64"), ("100", "x86_64"), ("100", "aarch64"))]
    publish(LocalStore(root), wheels)
    return root


class _Files(SimpleHTTPRequestHandler):
    got: list[str]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        self.got.append(self.path)


def _sdist(dest: Path) -> Path:
    """Upstream's next flash-attn release, as an sdist whose build fails loudly."""
    name = f"flash_attn-{NEWER_UPSTREAM}"
    path = dest / f"{name}.tar.gz"
    members = {
        f"{name}/PKG-INFO": f"Metadata-Version: 2.1\nName: flash-attn\nVersion: {NEWER_UPSTREAM}\n",
        f"{name}/setup.py": "raise SystemExit('the upstream sdist was taken: a source build')\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for member, text in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def _page(files: list[Path]) -> str:
    import hashlib

    links = "".join(
        f'<a href="../../files/{f.name}#sha256={hashlib.sha256(f.read_bytes()).hexdigest()}">'
        f"{f.name}</a>\n" for f in files)
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"


@pytest.fixture(scope="module")
def pypi(tmp: Path) -> Iterator[tuple[str, list[str]]]:
    """PyPI's stand-in on loopback: the fake torch (it reports +cu130 and CUDA 13.0, as PyPI's
    torch 2.14.1 does) and a newer flash-attn sdist. Yields (its simple/ URL, the paths asked)."""
    root = tmp / "pypi"
    (root / "files").mkdir(parents=True)
    torch = make_wheel(root / "files", "torch", TORCH, extra_members={
        "torch/__init__.py": f'__version__ = "{TORCH}+cu130"\nfrom . import version\n'.encode(),
        "torch/version.py": b'cuda = "13.0"\n',
    })
    sdist = _sdist(root / "files")
    for project, files in (("torch", [torch]), ("flash-attn", [sdist])):
        (root / "simple" / project).mkdir(parents=True)
        (root / "simple" / project / "index.html").write_text(_page(files))
    (root / "simple" / "index.html").write_text(
        '<a href="torch/">torch</a>\n<a href="flash-attn/">flash-attn</a>\n')
    got: list[str] = []
    handler = type("Handler", (_Files,), {"got": got})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", got
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert not [p for p in got if p.endswith(".tar.gz")], f"the upstream sdist was fetched: {got}"


@contextlib.contextmanager
def _factory_serve(store: Path, *tls_args: str) -> Iterator[str]:
    """The real `factory serve` on this machine's name; yields the URL it prints."""
    with factory_serve(store, "--host", NAME, *tls_args) as url:
        assert urllib.parse.urlsplit(url).hostname == NAME
        yield url


@pytest.fixture(scope="module", params=["http", "https"])
def index(request: pytest.FixtureRequest, store: Path) -> Iterator[tuple[str, Path | None]]:
    """(the index URL by host name, the CA bundle the doctor is given: None over http)."""
    if request.param == "http":
        with _factory_serve(store) as url:
            yield url, None
        return
    cert, key, bundle = request.getfixturevalue("tls")
    with _factory_serve(store, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
        assert url.startswith("https://")
        yield url, bundle


# -- a host, a clean environment, the pasted lines -------------------------------------------
def _clean_env(tmp: Path, *bin_dirs: Path) -> dict[str, str]:
    """What a fresh login on a GPU host has: a PATH, a HOME, no configuration of this machine's
    for any client: XDG dirs of its own (the user's and /etc/xdg's pip.conf, uv.toml, Poetry's and
    PDM's config are never read; Poetry and PDM have no system-wide file) and no pip config file
    at all (pip reads /etc/pip.conf whatever XDG says, unless PIP_CONFIG_FILE is /dev/null). uv
    falls back to /etc/uv/uv.toml, and its switches that drop that file (UV_NO_CONFIG,
    UV_CONFIG_FILE) drop the pasted project's default index too: the uv case checks there is
    none instead. The PyPI stand-in and the index reach the clients through what the test
    passes: PIP_INDEX_URL, the pasted lines, the project's stand-in index."""
    home = tmp / "home"
    (home / ".config").mkdir(parents=True, exist_ok=True)
    (tmp / "xdg-dirs").mkdir(exist_ok=True)
    return {
        "PATH": ":".join([*map(str, bin_dirs), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CONFIG_DIRS": str(tmp / "xdg-dirs"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
    }


def _setup_env(tmp: Path) -> dict[str, str]:
    """For making the host venvs (not part of what is pasted): uv with a cache kept between runs,
    trusting the system's CA store to reach PyPI for pip itself, as this machine does."""
    env = {**_clean_env(tmp), "UV_CACHE_DIR": str(cache_root() / "uv-deploy-cache"),
           "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    if system.is_file():
        env["SSL_CERT_FILE"] = str(system)
    return env


def _pip_version(client: str) -> str:
    return client.split("-", 1)[1] if "-" in client else importlib.metadata.version("pip")


def _host_venv(tmp: Path, pypi: str, pip: str | None) -> Path:
    """A GPU host's environment: torch 2.14.1 from PyPI (the stand-in) and, for the pip clients,
    that pip. The doctor reads it (--python) and the pip lines install into it."""
    venv = tmp / "host"
    env = _setup_env(tmp)
    uv = uv_bin()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    if pip:
        subprocess.run([uv, "pip", "install", "-q", "--python", str(venv), f"pip=={pip}"],
                       check=True, env=env)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv), "--index-url", pypi,
                    f"torch=={TORCH}"], check=True, env=env)
    return venv


def _doctor(url: str, bundle: Path | None, host: str, venv: Path, *fmt: str
            ) -> subprocess.CompletedProcess[str]:
    smi, machine, _, _ = HOSTS.get(host, ("rtx-pro-6000.txt", None, None, None))
    args = ["doctor", "--index", url, "--nvidia-smi-output", str(HOSTS_DIR / smi),
            "--python", str(venv / "bin/python"), *fmt]
    if machine:
        args += ["--machine", machine]
    if bundle:
        args += ["--cert", str(bundle)]
    return subprocess.run([sys.executable, "-m", "factory", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _runs(snippet: str) -> list[str]:
    return [line[len(RUN):] for line in snippet.splitlines() if line.startswith(RUN)]


def _dependencies(snippet: str) -> list[str]:
    (line,) = [ln for ln in snippet.splitlines()
               if ln.startswith("# and in [project] dependencies:")]
    return json.loads("[" + line.split(":", 1)[1] + "]")


def _installed(python: Path, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([uv_bin(), "pip", "freeze", "--python", str(python)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


def _aarch64_dry_run(command: str, report: Path) -> str:
    """The pasted pip line, asked what it would install on an aarch64 host (this one is not)."""
    return (f"{command} --dry-run --report {report} --only-binary=:all: "
            f"--platform manylinux_2_28_aarch64 --target {report.parent / 'target'}")


def _report_wheel(report: Path) -> str:
    items = json.loads(report.read_text())["install"]
    names = [urllib.parse.unquote(i["download_info"]["url"].rsplit("/", 1)[1]) for i in items]
    (fa,) = [n for n in names if n.startswith("flash_attn-")]
    return fa


def _pip_case(client: str, text: str, fmt: str, venv: Path, tmp: Path, env: dict[str, str],
              cpu: str) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """Paste the pip line (the report's) or the pip.conf snippet; the flash-attn file it took."""
    if fmt == "report":
        lines = [ln.strip() for ln in text.splitlines()[text.splitlines().index(
            next(ln for ln in text.splitlines() if ln.startswith("flash-attn: "))) + 1:]]
        command = [ln for ln in lines if ln and not ln.startswith("#")][0]
    else:
        (command,) = _runs(text)
        # "pip.conf (in the venv, ...)": the snippet as the venv's own pip.conf. pip reads no
        # file at all with PIP_CONFIG_FILE=/dev/null, so here it reads /etc/pip.conf too (no
        # switch turns that one off alone); the snippet's keys win over it.
        (venv / "pip.conf").write_text(text)
        env = {k: v for k, v in env.items() if k != "PIP_CONFIG_FILE"}
    report = tmp / "report.json"
    if cpu == "aarch64":
        done = _bash(_aarch64_dry_run(command, report), tmp, env)
        return done, _report_wheel(report) if done.returncode == 0 else None
    done = _bash(command, tmp, env)
    have = _installed(venv / "bin/python", env).get("flash-attn")
    return done, have


def _project_case(client: str, text: str, venv: Path, tmp: Path, env: dict[str, str],
                  pypi: str, bins: dict[str, Path], cpu: str, want: str
                  ) -> tuple[subprocess.CompletedProcess[str], str | None]:
    """Paste the pyproject.toml snippet (and run its `# run:` lines), lock, install."""
    work = tmp / "project"
    work.mkdir()
    deps = [f"torch=={TORCH}", *_dependencies(text)]
    (work / "pyproject.toml").write_text(
        '[project]\nname = "host-app"\nversion = "0.1.0"\n'
        f'requires-python = ">={sys.version_info[0]}.{sys.version_info[1]}"\n'
        f"dependencies = {json.dumps(deps)}\n\n"
        + STAND_IN[client].format(pypi=pypi) + text)
    runs = _runs(text)
    if client == "uv":
        assert not SYSTEM_UV_TOML.exists(), (
            f"{SYSTEM_UV_TOML} would configure the pasted uv project (uv has no switch that "
            "drops it and keeps the project's own default index): move it away for this test")
        steps = ["uv lock", f"uv sync --python {sys.executable}"]
        env = {**env, "PATH": f"{Path(uv_bin()).parent}:{env['PATH']}"}
    elif client == "poetry":
        env = {**env, "POETRY_VIRTUALENVS_IN_PROJECT": "true", "POETRY_NO_INTERACTION": "1"}
        steps = [f"poetry env use {sys.executable} >/dev/null", "poetry lock", "poetry install"]
        env["PATH"] = f"{bins['poetry'].parent}:{env['PATH']}"
    else:
        subprocess.run([uv_bin(), "venv", "-q", "--python", sys.executable, str(work / ".venv")],
                       check=True, env=_setup_env(tmp))
        env = {**env, "PDM_PYTHON": str(work / ".venv/bin/python"), "PDM_CHECK_UPDATE": "false",
               "PDM_NON_INTERACTIVE": "1"}
        steps = ["pdm lock", "pdm install"]
        env["PATH"] = f"{bins['pdm'].parent}:{env['PATH']}"
    if cpu == "aarch64":  # lock only: the lock must hold the aarch64 build of the version
        steps = steps[:-1]
    done = _bash("\n".join([*runs, *steps]), work, env)
    if done.returncode != 0:
        return done, None
    lock = "".join(p.read_text() for p in work.glob("*.lock"))
    assert "pypi.org" not in lock and "pythonhosted" not in lock
    if cpu == "aarch64":
        aarch64 = re.findall(r"flash_attn-[^\"' ]+_aarch64\.whl", lock)
        x86 = re.findall(r"flash_attn-[^\"' ]+_x86_64\.whl", lock)
        assert x86 and all("sm100" in n for n in x86), lock
        return done, urllib.parse.unquote(aarch64[0]) if aarch64 else None
    return done, _installed(work / ".venv/bin/python", env).get("flash-attn")


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("host", list(HOSTS))
def test_the_printed_lines_install_the_hosts_build(
    index: tuple[str, Path | None], pypi: tuple[str, list[str]], client: str, host: str,
    client_bins: dict[str, Path], tmp_path: Path,
) -> None:
    url, bundle = index
    stand_in, _ = pypi
    _, _, want, cpu = HOSTS[host]
    is_pip = client.startswith("pip")
    venv = _host_venv(tmp_path, stand_in, _pip_version(client) if is_pip else None)
    env = _clean_env(tmp_path, venv / "bin")
    results = []
    for fmt in (["report", "pip"] if is_pip else [client]):
        r = _doctor(url, bundle, host, venv, *([] if fmt == "report" else ["--format", fmt]))
        assert r.returncode == 0, r.stdout + r.stderr
        text = r.stdout
        if url.startswith("http://"):  # by name: pip and PDM must be told, and say why
            if fmt in ("report", "pip", "pdm"):
                assert f"# plain http to {urllib.parse.urlsplit(url).netloc}:" in text, text
        else:
            assert "a private CA signed the index's certificate" in text, text
        case_dir = tmp_path / fmt
        case_dir.mkdir()
        if is_pip:
            if fmt == "pip":  # a fresh host venv: the report's line installed into the first
                shutil.rmtree(venv)
                venv = _host_venv(tmp_path, stand_in, _pip_version(client))
            # pip's default index is the host's PyPI: the stand-in plays it
            pip_env = {**env, "PIP_INDEX_URL": stand_in}
            done, got = _pip_case(client, text, fmt, venv, case_dir, pip_env, cpu)
        else:
            done, got = _project_case(client, text, venv, case_dir, env, stand_in, client_bins,
                                      cpu, want)
        log = f"{fmt}:\n{text}\n{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, log
        results.append((fmt, got))
        if cpu == "aarch64":
            assert got and got.startswith(f"flash_attn-{want}-") and got.endswith(
                "_aarch64.whl"), log
        else:
            assert got == want, log
    assert results


@pytest.mark.parametrize("fmt", ["report", "json", *TOOLS])
def test_nothing_fits_the_rtx_pro_6000_in_any_format(
    index: tuple[str, Path | None], pypi: tuple[str, list[str]], fmt: str, tmp_path: Path
) -> None:
    """sm_120 against sm_90/sm_100 builds: every format says so and exits 1, and prints nothing
    an installer could take."""
    url, bundle = index
    venv = _host_venv(tmp_path, pypi[0], None)
    extra = {"report": [], "json": ["--json"]}.get(fmt, ["--format", fmt])
    r = _doctor(url, bundle, "rtx-pro-6000", venv, *extra)
    assert r.returncode == 1, r.stdout + r.stderr
    why = ("the GPU is sm_120 (NVIDIA RTX PRO 6000 Blackwell Server Edition) but the index only "
           "has sm_90 and sm_100 builds of flash-attn for cu130-torch2.14")
    if fmt == "json":
        (result,) = json.loads(r.stdout)["results"]
        assert result["fits"] is False and result["install"] is None and result["why"] == why
    else:
        assert why in r.stdout, r.stdout
        assert "pip install" not in r.stdout and "/simple/" not in r.stdout


def test_serve_refuses_a_half_or_wrong_tls_setup(store: Path, tls: tuple[Path, Path, Path],
                                                 tmp_path: Path) -> None:
    cert, key, bundle = tls
    for args, message in (
        (["--tls-cert", str(cert)], "ERROR --tls-cert and --tls-key go together"),
        (["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(key)],
         f"ERROR cannot read {tmp_path / 'none.pem'}: no such file"),
        (["--tls-cert", str(bundle), "--tls-key", str(key)],
         f"ERROR cannot use the TLS certificate {bundle} with the key {key}"),
    ):
        r = subprocess.run([sys.executable, "-m", "factory", "serve", "--store", str(store),
                            "--port", "0", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and r.stderr.startswith(message), r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) <= 2


def test_https_from_a_private_ca_without_cert_says_what_to_pass(
    store: Path, tls: tuple[Path, Path, Path], pypi: tuple[str, list[str]], tmp_path: Path
) -> None:
    cert, key, _ = tls
    venv = _host_venv(tmp_path, pypi[0], None)
    with _factory_serve(store, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
        r = _doctor(url, None, "b200", venv)
    assert r.returncode == 11, r.stdout + r.stderr
    first, tip = r.stderr.splitlines()
    assert first.startswith(f"ERROR cannot verify the certificate of {url}simple/: ")
    assert tip == "TIP a private CA signed it? pass --cert FILE, the CA bundle that does"


def test_the_clean_environment_reads_no_pip_configuration(tmp_path: Path) -> None:
    """Not this machine's /etc/pip.conf either (a builder's may name local mirrors)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], cwd=tmp_path,
                       env=_clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # only what the environment says (":env:.config-file='/dev/null'"), no file's key
    assert [ln for ln in r.stdout.splitlines() if not ln.startswith(":env:")] == [], r.stdout
