"""Index pages: content, per-variant trees, rebuild from the store, verify."""

from __future__ import annotations

import json
from pathlib import Path

import index_fixtures
from index_wheels import publish_demo, variant_wheel

from factory.index import rebuild_index, verify_index
from factory.index.publish import publish, yank
from factory.store import Store

# The shared fixtures (a module of their own: conftest.py belongs to everyone).
moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store = index_fixtures.store
store_spec = index_fixtures.store_spec


def test_per_variant_and_combined_indexes(store: Store, tmp_path: Path) -> None:
    publish_demo(store, tmp_path)
    combined = store.read("simple/fa-demo/index.html").decode()  # normalized project name
    assert "torch2.13" in combined and "torch2.14" in combined
    only = store.read("cu130-torch2.14/simple/fa-demo/index.html").decode()
    assert "torch2.14" in only and "torch2.13" not in only
    assert json.loads(store.read("cu130-torch2.13/simple/index.json"))["projects"] == [
        {"name": "fa-demo"}
    ]
    # An untagged wheel (torch itself) is only in the combined index.
    assert {p["name"] for p in json.loads(store.read("simple/index.json"))["projects"]} == {
        "fa-demo",
        "torch",
    }
    assert store.read("cu130-torch2.14/simple/torch/index.html") is None
    assert json.loads(store.read("index.json"))["variants"] == [
        "cu130-torch2.13",
        "cu130-torch2.14",
    ]
    assert verify_index(store).ok


def test_rebuild_regenerates_every_page_from_the_store(store: Store, tmp_path: Path) -> None:
    publish_demo(store, tmp_path)
    yank(store, "fa_demo-1.0.0+cu130torch2.13-py3-none-any.whl", "miscompiled")
    before = {o.key: store.read(o.key) for o in store.page_objects()}
    for key in before:
        store.delete(key)
    assert not verify_index(store).ok
    report = rebuild_index(store)
    assert report.wheels == 3 and report.variants == 2 and report.pages_written == len(before)
    assert {o.key: store.read(o.key) for o in store.page_objects()} == before
    assert rebuild_index(store).pages_written == 0  # nothing changed: nothing rewritten
    assert verify_index(store).ok


def test_each_arch_set_has_its_own_variant_index_and_old_urls_keep_their_wheels(
    store: Store, tmp_path: Path
) -> None:
    wheels = [variant_wheel(tmp_path, "fa-demo", "1.0", "2.14", archs=a) for a in ("90", "100")]
    publish(store, wheels)
    sm90 = store.read("cu130-torch2.14-sm90/simple/fa-demo/index.html").decode()
    sm100 = store.read("cu130-torch2.14-sm100/simple/fa-demo/index.html").decode()
    assert "sm90-" in sm90 and "sm100" not in sm90
    assert "sm100-" in sm100 and "sm90" not in sm100
    assert store.read("cu130-torch2.14/simple/fa-demo/index.html") is None
    # A wheel published before the arch set was in the variant name has the old name in its
    # entry: the old URL keeps listing it (and only it), the new one lists it too.
    key = "files/fa-demo/fa_demo-1.0+cu130torch2.14sm90-py3-none-any.whl.entry.json"
    doc = json.loads(store.read(key))
    store.delete(key)
    store.put_new(key, json.dumps({**doc, "variant": "cu130-torch2.14"}).encode())
    rebuild_index(store)
    old = store.read("cu130-torch2.14/simple/fa-demo/index.html").decode()
    assert "sm90-" in old and "sm100" not in old
    assert store.read("cu130-torch2.14-sm90/simple/fa-demo/index.html").decode().count("<a ") == 1
    assert set(json.loads(store.read("index.json"))["variants"]) == {
        "cu130-torch2.14",
        "cu130-torch2.14-sm90",
        "cu130-torch2.14-sm100",
    }
    assert verify_index(store).ok
