"""Installer configuration for the builds the doctor chose: pip.conf, uv, Poetry and PDM.

Every snippet points the chosen projects at their per-variant index (one build per version, so
no resolver can pick another arch or CUDA) and keeps every other package where it was (PyPI).
uv, Poetry and PDM get the index as *explicit* for those projects only, so a name we publish is
never taken from PyPI (dependency confusion) and PyPI's torch is never taken from us.

uv's ``sources`` (which project comes from which explicit index) may only live in a project's
``pyproject.toml``; a ``uv.toml`` with them is refused, and an explicit index in ``uv.toml``
alone is never used by ``uv pip install``. So the uv snippet is the ``pyproject.toml`` form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from factory.errors import UsageError
from factory.hosts.doctor import Choice

FORMATS = ("pip", "uv", "poetry", "pdm")


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


def _pin(c: Choice) -> str | None:
    """'==VERSION' when the install line pins one, else None."""
    assert c.requirement is not None
    _, sep, version = c.requirement.partition("==")
    return f"=={version}" if sep else None


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these characters


def _index_tables(
    header: str, indexes: list[tuple[str, str, list[Choice]]], extra: Callable[[list[Choice]], str]
) -> list[str]:
    """One TOML table per index: name, url and the installer's own key (``extra``)."""
    lines = []
    for name, url, group in indexes:
        lines += [header, f"name = {_toml(name)}", f"url = {_toml(url)}", extra(group), ""]
    return lines


def render_snippet(fmt: str, choices: Sequence[Choice], *, torch: str | None = None) -> str:
    """The snippet for one installer; ``torch`` (the host's) goes on pip's install line."""
    indexes = _named(choices)
    if not indexes:
        raise UsageError("no wheel fits this host: nothing to configure")
    lines: list[str] = []
    if fmt == "pip":
        urls = " ".join(url for _, url, _ in indexes)
        reqs = " ".join(_toml(c.requirement or "") for _, _, g in indexes for c in g)
        lines += [
            "# pip.conf (in the venv, ~/.config/pip/pip.conf or /etc/pip.conf)",
            "[global]",
            f"extra-index-url = {urls}",
            "",
            f"# then: pip install {reqs} {_toml('torch==' + (torch or 'HOST-TORCH-VERSION'))}",
        ]
    elif fmt == "uv":
        lines.append("# pyproject.toml (uv add / uv lock / uv sync)")
        lines += _index_tables("[[tool.uv.index]]", indexes, lambda _: "explicit = true")
        lines.append("[tool.uv.sources]")
        lines += [f"{c.project} = {{ index = {_toml(name)} }}" for name, _, g in indexes for c in g]
    elif fmt == "poetry":
        lines.append("# pyproject.toml (poetry lock / poetry install)")
        lines += _index_tables("[[tool.poetry.source]]", indexes, lambda _: 'priority = "explicit"')
        lines.append("[tool.poetry.dependencies]")
        for name, _, group in indexes:
            for c in group:
                pin = _pin(c)
                version = f"version = {_toml(pin)}, " if pin else ""
                lines.append(f"{c.project} = {{ {version}source = {_toml(name)} }}")
    elif fmt == "pdm":
        lines.append("# pyproject.toml (pdm lock / pdm install)")
        lines += _index_tables(
            "[[tool.pdm.source]]",
            indexes,
            lambda group: f"include_packages = [{', '.join(_toml(c.project) for c in group)}]",
        )
        pins = [f"{c.project}{_pin(c)}" for _, _, g in indexes for c in g if _pin(c)]
        if pins:
            lines.append("# and pin in [project] dependencies: " + ", ".join(pins))
    else:
        raise UsageError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    return "\n".join(lines).rstrip() + "\n"
