"""Index pages: content, per-variant trees, rebuild from the store, verify."""

from __future__ import annotations

import json
from pathlib import Path

import index_fixtures
from unit.test_index import _publish_demo

from factory.index import rebuild_index, verify_index
from factory.index.publish import yank
from factory.index.store import Store

# The shared fixtures (a module of their own: conftest.py belongs to everyone).
moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store = index_fixtures.store
store_spec = index_fixtures.store_spec


def test_per_variant_and_combined_indexes(store: Store, tmp_path: Path) -> None:
    _publish_demo(store, tmp_path)
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
    _publish_demo(store, tmp_path)
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
