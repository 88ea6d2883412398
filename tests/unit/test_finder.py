"""The finder page's pieces that need no browser: GPU product names to sm, sort keys, and the
install lines taken from the doctor's formatter (tests/integration/test_finder.py has the
browser)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from packaging.version import Version

from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.snippets import ca_setting, pip_command, render_snippet
from factory.index.finder import (
    CA_FORMS,
    PATH_TOKEN,
    PROJECT_TOKEN,
    ROOT_TOKEN,
    TRUST_HOST_TOKEN,
    TRUST_ROOT_TOKEN,
    VERSION_TOKEN,
    _key_of,
    _page_host,
    finder_html,
    install_templates,
)
from factory.matrix.gpus import gpu_sms, runs_on, sm_of


def test_products_map_to_their_sm() -> None:
    assert sm_of("B200") == sm_of("gb200") == 100
    assert sm_of("rtx pro 6000") == sm_of("RTX-PRO-6000") == sm_of("rtxpro6000") == 120
    assert sm_of("H100") == sm_of("h200") == 90 and sm_of("RTX 5090") == 120
    assert sm_of("no such gpu") is None
    assert all(30 <= sm <= 200 for sm in gpu_sms().values())


def test_a_build_runs_on_its_major_at_the_same_or_a_higher_minor() -> None:
    assert runs_on(100, 103) and runs_on(120, 121) and not runs_on(100, 120)
    assert not runs_on(103, 100) and not runs_on(90, 100)
    sm100 = {name for name, sm in gpu_sms().items() if runs_on(100, sm)}
    sm120 = {name for name, sm in gpu_sms().items() if runs_on(120, sm)}
    assert "B300" in sm100 and "RTX PRO 6000" not in sm100
    assert "GB10" in sm120 and "DGX Spark" in sm120


def test_version_keys_sort_as_versions() -> None:
    versions = ["2.8.3.post2+cu130torch2.14sm100", "2.10.0", "2.8.3", "2.9.0rc1", "2.9.0",
                "1.0a1", "2.9.0b2"]
    by_key = sorted(versions, key=lambda v: _key_of(Version(v)))
    assert by_key == sorted(versions, key=Version)


def test_the_templates_are_the_doctors_lines_with_placeholders() -> None:
    templates = install_templates()
    assert set(templates) == {"plain", "trust"}
    for kind, root in (("plain", ROOT_TOKEN), ("trust", TRUST_ROOT_TOKEN)):
        lines = templates[kind]
        assert set(lines) == {"pip", "uv", "poetry", "pdm"}
        url = root + PATH_TOKEN
        choice = Choice(project=PROJECT_TOKEN, wheel="x.whl", variant=None, why=None,
                        index_url=url, requirement=f"{PROJECT_TOKEN}=={VERSION_TOKEN}")
        assert lines["pip"] == "\n".join(pip_command([choice], IndexAccess(url=root), "python3"))
        for fmt in ("uv", "poetry", "pdm"):
            assert url in lines[fmt] and PROJECT_TOKEN in lines[fmt]
    # plain http by host name: pip trusts the host (the page puts its own in), PDM too
    assert f"--trusted-host {TRUST_HOST_TOKEN}" in templates["trust"]["pip"]
    assert "verify_ssl = false" in templates["trust"]["pdm"]
    assert "--trusted-host" not in templates["plain"]["pip"]


def test_the_page_says_how_each_installer_is_told_a_private_ca_in_the_doctors_words() -> None:
    (note,) = re.findall(r'<p id="ca-note">(.*?)</p>', finder_html([]).decode())
    access = IndexAccess(url="https://index.example/", cert=Path("FILE"))
    choice = Choice(project="p", wheel="x.whl", variant=None, why=None,
                    index_url="https://index.example/v/simple/", requirement="p==1")
    doctor = {fmt: render_snippet(fmt, [choice], access, _page_host())
              for fmt in ("pip", "uv", "poetry", "pdm")}
    doctor["pip.conf"] = doctor.pop("pip")
    doctor["pip"] = pip_command([choice], access, "python3")[-1]
    assert [form for _, form in CA_FORMS] == ["pip", "pip.conf", "uv", "poetry", "pdm"]
    for label, form in CA_FORMS:
        words = ca_setting(form, "FILE")
        assert f"{label} <code>{html.escape(words)}</code>" in note
        assert words in doctor[form], (form, doctor[form])
    assert "factory doctor --cert FILE" in note and "keep PyPI" in note
