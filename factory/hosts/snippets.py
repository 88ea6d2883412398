"""What the doctor prints for installers: the pip command line, and the configuration for pip
(pip.conf), uv, Poetry and PDM. Each is meant to be pasted as printed.

Every line points the chosen projects at their per-variant index (one build per version, so no
resolver can pick another arch or CUDA) and keeps every other package where it was (PyPI). pip
merges indexes, so its line names the exact build (``==version+local``: PyPI cannot hold a local
version, so a newer upstream sdist never wins); uv, Poetry and PDM get the index as *explicit*
for those projects only, so a name we publish is never taken from PyPI (dependency confusion)
and PyPI's torch is never taken from us.

How each client reaches the index (``IndexAccess``): plain http to a host name is refused by pip
and PDM unless they are told to trust it (``--trusted-host``, ``verify_ssl = false``), with one
comment saying why; uv and Poetry take it as it is. https with a private CA: pip ``--cert``, uv
``SSL_CERT_FILE``, Poetry ``certificates.<source>.cert``, PDM ``ca_certs`` on the source.

Lines a person runs are printed as ``# run: COMMAND``; the doctor's warnings as ``# WARNING``.

uv's ``sources`` (which project comes from which explicit index) may only live in a project's
``pyproject.toml``; a ``uv.toml`` with them is refused, and an explicit index in ``uv.toml``
alone is never used by ``uv pip install``. So the uv snippet is the ``pyproject.toml`` form.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence

from factory.errors import UsageError
from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.probe import PYTHON_FROM_PATH, HostInfo

FORMATS = ("pip", "uv", "poetry", "pdm")
RUN = "# run: "  # the prefix of a command line in a snippet


def _why_trust(access: IndexAccess, client: str, fix: str) -> str:
    return (f"# plain http to {access.host}: {client} uses an http index only on localhost or "
            f"127.x unless told to trust it ({fix}); https needs none of this")


REPLACES_ROOTS = "it replaces the default roots: keep PyPI's in it"  # pip's and uv's bundle


def _why_cert(access: IndexAccess, client: str) -> str:
    assert access.cert is not None
    note = f" ({REPLACES_ROOTS})" if client in ("pip", "uv") else ""
    return f"# a private CA signed the index's certificate: {client} checks it with this{note}"


def ca_setting(form: str, ca: str, source: str = "factory") -> str:
    """How an installer is told the CA bundle ``ca`` of an https index a private CA signed, in
    each ``form`` the doctor prints (``source``: Poetry's name of the index); the finder page
    shows the same words."""
    forms = {
        "pip": f"--cert {shlex.quote(ca)}",
        "pip.conf": f"cert = {ca}",
        "uv": f"export SSL_CERT_FILE={shlex.quote(ca)}",
        "poetry": f"poetry config certificates.{source}.cert {shlex.quote(ca)}",
        "pdm": f"ca_certs = {_toml(ca)}",
    }
    return forms[form]


def pip_interpreter(host: HostInfo) -> str:
    """``python3`` when the doctor read the PATH's, else the interpreter it read: the pip line
    installs into the environment whose torch was read."""
    return "python3" if host.python_source == PYTHON_FROM_PATH else shlex.quote(host.python_exe)


def pip_command(choices: Sequence[Choice], access: IndexAccess, python: str) -> list[str]:
    """The comment lines that say why, then the one pip command for these choices, run by the
    interpreter ``python`` (its environment is where they install)."""
    urls = list(dict.fromkeys(c.index_url for c in choices if c.index_url))
    reqs = [c.requirement for c in choices if c.requirement]
    if not urls or not reqs:
        raise UsageError("no wheel fits this host: nothing to install")
    words = [python, "-m", "pip", "install"]  # each already quoted for the shell
    lines = []
    if access.plain_http:
        lines.append(_why_trust(access, "pip", "--trusted-host"))
        words.append(f"--trusted-host {shlex.quote(access.host)}")
    if access.private_ca:
        lines.append(_why_cert(access, "pip"))
        words.append(ca_setting("pip", str(access.private_ca)))
    words += [f"--extra-index-url {shlex.quote(url)}" for url in urls]
    return [*lines, " ".join([*words, *(shlex.quote(r) for r in reqs)])]


def _named(choices: Sequence[Choice]) -> list[tuple[str, str, list[Choice]]]:
    """(index name, URL, its choices): one index per distinct URL."""
    by_url: dict[str, list[Choice]] = {}
    for c in choices:
        if c.index_url and c.requirement:
            by_url.setdefault(c.index_url, []).append(c)
    out = []
    for url, group in by_url.items():
        variant = group[0].variant if len(by_url) > 1 else None
        name = "factory" + (f"-{re.sub(r'[^a-z0-9]+', '-', variant.lower())}" if variant else "")
        out.append((name, url, group))
    return out


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these characters


def _index_tables(
    header: str, indexes: list[tuple[str, str, list[Choice]]], extra: Callable[[list[Choice]], str]
) -> list[str]:
    """One TOML table per index: name, url and the installer's own keys (``extra``)."""
    lines = []
    for name, url, group in indexes:
        lines += [header, f"name = {_toml(name)}", f"url = {_toml(url)}", extra(group), ""]
    return lines


def _dependencies(indexes: list[tuple[str, str, list[Choice]]]) -> str:
    names = ", ".join(_toml(c.project) for _, _, g in indexes for c in g)
    return f"# and in [project] dependencies: {names}"


def _pip(indexes: list[tuple[str, str, list[Choice]]], access: IndexAccess,
         host: HostInfo) -> list[str]:
    lines = [
        "# pip.conf (in the venv, ~/.config/pip/pip.conf or /etc/pip.conf)",
        "[global]",
        f"extra-index-url = {' '.join(url for _, url, _ in indexes)}",
    ]
    if access.plain_http:
        lines += [_why_trust(access, "pip", "trusted-host"), f"trusted-host = {access.host}"]
    if access.private_ca:
        lines += [_why_cert(access, "pip"), ca_setting("pip.conf", str(access.private_ca))]
    reqs = " ".join(shlex.quote(c.requirement or "") for _, _, g in indexes for c in g)
    return [*lines, "", f"{RUN}{pip_interpreter(host)} -m pip install {reqs}"]


# uv and Poetry: (the index table, what makes it explicit, the table that names each project's
# index, its key there, the commands that use it)
_EXPLICIT = {
    "uv": ("[[tool.uv.index]]", "explicit = true", "[tool.uv.sources]", "index",
           "uv lock / uv sync"),
    "poetry": ("[[tool.poetry.source]]", 'priority = "explicit"', "[tool.poetry.dependencies]",
               "source", "poetry lock / poetry install"),
}


def _explicit(tool: str, indexes: list[tuple[str, str, list[Choice]]],
              access: IndexAccess) -> list[str]:
    header, explicit, table, key, commands = _EXPLICIT[tool]
    lines = [f"# pyproject.toml ({commands})"]
    lines += _index_tables(header, indexes, lambda _: explicit)
    lines.append(table)
    lines += [f"{c.project} = {{ {key} = {_toml(name)} }}" for name, _, g in indexes for c in g]
    lines.append(_dependencies(indexes))
    if access.private_ca:  # uv reads the bundle from the environment; Poetry per source
        lines.append(_why_cert(access, tool))
        ca = str(access.private_ca)
        if tool == "uv":
            lines.append(f"{RUN}{ca_setting('uv', ca)}")
        else:
            lines += [f"{RUN}{ca_setting('poetry', ca, name)}" for name, _, _ in indexes]
    return lines


def _uv(indexes: list[tuple[str, str, list[Choice]]], access: IndexAccess,
        host: HostInfo) -> list[str]:
    return _explicit("uv", indexes, access)


def _poetry(indexes: list[tuple[str, str, list[Choice]]], access: IndexAccess,
            host: HostInfo) -> list[str]:
    return _explicit("poetry", indexes, access)


def _pdm(indexes: list[tuple[str, str, list[Choice]]], access: IndexAccess,
         host: HostInfo) -> list[str]:
    def source(group: list[Choice]) -> str:
        keys = [f"include_packages = [{', '.join(_toml(c.project) for c in group)}]"]
        if access.plain_http:
            keys += [_why_trust(access, "PDM", "verify_ssl = false"), "verify_ssl = false"]
        if access.private_ca:
            keys += [_why_cert(access, "PDM"), ca_setting("pdm", str(access.private_ca))]
        return "\n".join(keys)

    lines = ["# pyproject.toml (pdm lock / pdm install)"]
    lines += _index_tables("[[tool.pdm.source]]", indexes, source)
    lines.append(_dependencies(indexes))
    return lines


_RENDER = {"pip": _pip, "uv": _uv, "poetry": _poetry, "pdm": _pdm}


def render_snippet(fmt: str, choices: Sequence[Choice], access: IndexAccess, host: HostInfo,
                   warnings: Sequence[str] = ()) -> str:
    """The snippet for one installer, the doctor's warnings first (as comments)."""
    render = _RENDER.get(fmt)
    if render is None:
        raise UsageError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    indexes = _named(choices)
    if not indexes:
        raise UsageError("no wheel fits this host: nothing to configure")
    lines = [f"# WARNING {w}" for w in warnings]
    lines += render(indexes, access, host)
    return "\n".join(lines).rstrip() + "\n"
