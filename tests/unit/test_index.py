"""Index pages: content, per-variant trees, rebuild from the store, verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from index_wheels import make_wheel, publish_demo, variant_wheel

from factory.index import rebuild_index, verify_index
from factory.index.pages import project_html, project_json
from factory.index.publish import publish
from factory.links import parse_anchors
from factory.store import LocalStore, WheelEntry


def _entry(**overrides: object) -> WheelEntry:
    values: dict[str, object] = dict(
        filename="flash_attn-2.8.3+cu130torch2.14-cp311-cp311-linux_x86_64.whl",
        project="flash-attn",
        version="2.8.3+cu130torch2.14",
        sha256="a" * 64,
        size=10,
        metadata_sha256="b" * 64,
        requires_python=">=3.9,<4",
        variant="cu130-torch2.14",
        uploaded="2026-11-29T00:00:00.000000Z",
    )
    values.update(overrides)
    return WheelEntry(**values)  # type: ignore[arg-type]


def test_html_page_carries_every_attribute_escaped() -> None:
    page = project_html("flash-attn", [_entry(yanked='bad "build" <x>')], None).decode()
    assert (
        'href="../../files/flash-attn/flash_attn-2.8.3%2Bcu130torch2.14-cp311-cp311-linux_x86_64.whl'
        f'#sha256={"a" * 64}"'
    ) in page
    assert 'data-requires-python="&gt;=3.9,&lt;4"' in page
    assert f'data-core-metadata="sha256={"b" * 64}"' in page
    assert f'data-dist-info-metadata="sha256={"b" * 64}"' in page
    assert 'data-yanked="bad &quot;build&quot; &lt;x&gt;"' in page
    assert '<meta name="pypi:repository-version" content="1.1">' in page


def test_variant_page_links_three_levels_up_and_json_follows_pep_691() -> None:
    doc = json.loads(
        project_json(
            "flash-attn",
            [_entry(), _entry(filename="x-1-py3-none-any.whl", version="1", yanked="")],
            "cu130-torch2.14",
        )
    )
    assert doc["meta"] == {"api-version": "1.1"} and doc["name"] == "flash-attn"
    first, second = doc["files"]
    assert first["url"].startswith("../../../files/flash-attn/")
    assert first["hashes"] == {"sha256": "a" * 64}
    assert first["core-metadata"] == {"sha256": "b" * 64}
    assert "dist-info-metadata" not in first  # PEP 714; pip 23.0.1 (Debian 12) crashed on it
    assert first["yanked"] is False and second["yanked"] is True  # yanked without a reason
    assert doc["versions"] == ["1", "2.8.3+cu130torch2.14"]
    assert first["size"] == 10 and first["upload-time"].endswith("Z")


def test_rebuild_removes_pages_of_vanished_projects(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put_if("simple/ghost/index.html", b"<a href='x'>x</a>", None, content_type="text/html")
    assert rebuild_index(store).pages_removed == 1
    assert store.read("simple/ghost/index.html") is None


def test_rebuild_does_not_rehash_wheels_and_verify_finds_tampering(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    wheels = publish_demo(store, tmp_path / "w")
    page = store.read("simple/torch/index.html")
    stored = store.path(f"files/torch/{wheels[2].name}")
    data = bytearray(stored.read_bytes())
    data[-30] ^= 0xFF  # same size, different bytes
    stored.write_bytes(bytes(data))
    rebuild_index(store)
    assert store.read("simple/torch/index.html") == page  # the recorded sha256 was used
    assert verify_index(store, deep=False).ok  # the quick check trusts the entries
    problems = verify_index(store).problems
    assert any("tampered" in p and wheels[2].name in p for p in problems)


def test_verify_finds_missing_files_and_unlisted_wheels(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    wheels = publish_demo(store, tmp_path / "w")
    store.path(f"files/torch/{wheels[2].name}.metadata").unlink()
    late = make_wheel(tmp_path / "w", "torch", "2.13.0")
    publish(store, [late], update_pages=False)  # committed but its pages never written
    problems = "\n".join(verify_index(store).problems)
    assert f"core metadata of {wheels[2].name}" in problems
    assert f"{late.name} is in the store but not on the page" in problems
    (store.root / "simple" / "fa-demo" / "index.html").write_text(
        '<a href="../../files/fa-demo/gone-1.0-py3-none-any.whl#sha256=00">x</a>'
    )
    assert "link to missing file files/fa-demo/gone-1.0-py3-none-any.whl" in "\n".join(
        verify_index(store).problems
    )


def test_verify_walks_both_html_and_json(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    publish_demo(store, tmp_path / "w")
    key = "cu130-torch2.14/simple/fa-demo/index.json"
    doc = json.loads(store.read(key))
    doc["files"][0]["hashes"]["sha256"] = "0" * 64
    store.path(key).write_text(json.dumps(doc))
    assert [p for p in verify_index(store, deep=False).problems if p.startswith(key)]


@pytest.mark.parametrize("count", [120])
def test_rebuild_of_many_wheels_lists_them_all(tmp_path: Path, count: int) -> None:
    store = LocalStore(tmp_path / "s")
    wheels = [
        variant_wheel(tmp_path / "w", f"pkg{i % 7}", f"1.{i}", ("2.13", "2.14")[i % 2])
        for i in range(count)
    ]
    publish(store, wheels, update_pages=False)
    report = rebuild_index(store)
    assert (report.wheels, report.projects, report.variants) == (count, 7, 2)
    verdict = verify_index(store, deep=False)
    assert verdict.ok and verdict.links == 2 * 2 * count  # HTML + JSON, combined + variant


def test_anchors_of_a_page_keep_attributes_and_whole_text() -> None:
    page = (
        b'<a href="../a-1.whl#sha256=ab" data-yanked="">a-<b>1</b>.whl</a>\n'
        b'<a name="top"></a><a href="b-2.whl">  b-2.whl\n'
    )
    anchors = parse_anchors(page)
    assert [(a.href, a.text) for a in anchors] == [
        ("../a-1.whl#sha256=ab", "a-1.whl"),
        ("", ""),
        ("b-2.whl", "b-2.whl"),  # left open at the end of the page: still an anchor
    ]
    assert anchors[0].attrs["data-yanked"] == "" and "data-yanked" not in anchors[2].attrs
