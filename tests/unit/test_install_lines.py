"""The lines the doctor and `factory request` print for hosts: what each installer needs to
reach the index (plain http by host name, https with a private CA), said once with the reason,
and the exact build pinned. Off loopback pip and PDM ignore a plain-http index they were not
told to trust; the integration test tests/integration/test_deployment.py pastes these lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.probe import Gpu, HostInfo
from factory.hosts.request import install_line
from factory.hosts.snippets import FORMATS, RUN, pip_command, render_snippet

URL = "http://index-host:8080/"
CHOICE = Choice(project="flash-attn", wheel="w.whl", variant="cu130-torch2.14-sm100", why=None,
                index_url=f"{URL}cu130-torch2.14-sm100/simple/",
                requirement="flash-attn==2.8.3.post2+cu130torch2.14sm100")
HOST = HostInfo(python="3.11", python_exe="/opt/venv/bin/python", python_source="--python",
                torch="2.14.1", torch_local="cu130", torch_cuda="13.0", torch_error=None,
                driver="580.95.05", gpus=(Gpu(name="NVIDIA B200", sm=100),), gpu_source="recorded",
                gpu_note=None, glibc=(2, 39), machine="x86_64")


@pytest.mark.parametrize(("url", "plain"), [
    ("http://index-host:8080/", True),
    ("http://10.0.0.5:8080/", True),
    ("http://reader:secret@index-host/", True),
    ("http://127.0.0.1:8080/", False),
    ("http://127.4.5.6/", False),
    ("http://localhost:8080/", False),
    ("http://[::1]:8080/", False),
    ("https://index-host/", False),
    ("file:///srv/index/store", False),
])
def test_plain_http_means_any_host_but_loopback(url: str, plain: bool) -> None:
    assert IndexAccess(url=url).plain_http is plain


def test_trusted_host_is_host_and_port_without_credentials() -> None:
    assert IndexAccess(url="http://reader:secret@index-host:8080/").host == "index-host:8080"
    assert IndexAccess(url="http://index-host/").host == "index-host"
    assert IndexAccess(url="http://[fd00::1]:8080/").host == "[fd00::1]:8080"


def test_pip_line_over_http_by_name_trusts_the_host_and_says_why() -> None:
    why, line = pip_command([CHOICE], IndexAccess(url=URL), "python3")
    assert why.startswith("# plain http to index-host:8080: pip uses an http index only on "
                          "localhost or 127.x unless told to trust it")
    assert line == ("python3 -m pip install --trusted-host index-host:8080 --extra-index-url "
                    "http://index-host:8080/cu130-torch2.14-sm100/simple/ "
                    "flash-attn==2.8.3.post2+cu130torch2.14sm100")


def test_pip_line_on_loopback_and_https_needs_nothing_else() -> None:
    for url in ("http://127.0.0.1:8080/", "https://index.example.com/"):
        (line,) = pip_command([CHOICE], IndexAccess(url=url), "python3")
        assert "--trusted-host" not in line and "--cert" not in line


def test_private_ca_goes_to_every_client(tmp_path: Path) -> None:
    ca = tmp_path / "bundle.pem"
    access = IndexAccess(url="https://index.example.com/", cert=ca)
    *_, line = pip_command([CHOICE], access, "python3")
    assert f"--cert {ca} " in line
    snippets = {fmt: render_snippet(fmt, [CHOICE], access, HOST) for fmt in FORMATS}
    assert f"\ncert = {ca}\n" in snippets["pip"]
    assert f"{RUN}export SSL_CERT_FILE={ca}\n" in snippets["uv"]
    assert f"{RUN}poetry config certificates.factory.cert {ca}\n" in snippets["poetry"]
    assert f'\nca_certs = "{ca}"\n' in snippets["pdm"]
    assert all("private CA" in text for text in snippets.values())
    # Over plain http a CA means nothing: not printed.
    plain = IndexAccess(url=URL, cert=ca)
    assert all(str(ca) not in render_snippet(fmt, [CHOICE], plain, HOST) for fmt in FORMATS)


def test_snippets_over_http_by_name() -> None:
    access = IndexAccess(url=URL)
    pip = render_snippet("pip", [CHOICE], access, HOST, warnings=["flash-attn: no GPU"])
    assert pip.startswith("# WARNING flash-attn: no GPU\n# pip.conf")
    assert "\ntrusted-host = index-host:8080\n" in pip
    assert pip.endswith(f"{RUN}/opt/venv/bin/python -m pip install "
                        "flash-attn==2.8.3.post2+cu130torch2.14sm100\n")
    pdm = render_snippet("pdm", [CHOICE], access, HOST)
    assert "\nverify_ssl = false\n" in pdm and "PDM uses an http index only on" in pdm
    # uv and Poetry take plain http as it is: nothing to add, nothing to explain.
    for fmt in ("uv", "poetry"):
        text = render_snippet(fmt, [CHOICE], access, HOST)
        assert "trust" not in text and "verify" not in text


def test_request_prints_the_doctors_line() -> None:
    line = install_line("http://index-host:8080", "cu130-torch2.14-sm100",
                        "flash_attn-2.8.3.post2+cu130torch2.14sm100-cp311-cp311-"
                        "manylinux_2_28_x86_64.whl")
    why, command = line.splitlines()
    assert why.startswith("# plain http to index-host:8080")
    assert command == pip_command([CHOICE], IndexAccess(url=URL), "python3")[-1]


def test_serve_prints_the_url_hosts_use() -> None:
    import socket

    from factory.commands.serve import public_url

    assert public_url("http", "0.0.0.0", 8080) == f"http://{socket.gethostname()}:8080/"
    assert public_url("https", "index-host", 8443) == "https://index-host:8443/"
    assert public_url("http", "::", 80) == f"http://{socket.gethostname()}:80/"
    assert public_url("http", "fd00::1", 8080) == "http://[fd00::1]:8080/"
