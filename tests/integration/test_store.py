"""The Store primitives, on a local directory and on a real S3 API server (moto)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import index_fixtures
import pytest
from index_wheels import make_wheel

from factory.errors import StoreError
from factory.store import LocalStore, Store, open_store
from factory.store.s3 import S3Store

# The shared fixtures (a module of their own: conftest.py belongs to everyone).
moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store = index_fixtures.store
store_spec = index_fixtures.store_spec


def test_open_store_picks_the_backend(tmp_path: Path, s3_env: dict[str, str]) -> None:
    local = open_store(str(tmp_path / "x"))
    assert isinstance(local, LocalStore) and not (tmp_path / "x").exists()  # nothing created yet
    s3 = open_store("s3://bucket-name/some/prefix")
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix) == ("bucket-name", "some/prefix")
    with pytest.raises(StoreError):
        open_store("gs://bucket/prefix")
    with pytest.raises(StoreError, match="'s3:///x' names no bucket"):
        open_store("s3:///x")


def test_put_new_is_exclusive(store: Store) -> None:
    assert store.read("files/p/a.whl") is None
    assert store.put_new("files/p/a.whl", b"first") is True
    assert store.put_new("files/p/a.whl", b"second") is False
    assert store.read("files/p/a.whl") == b"first"


def test_put_new_from_a_file(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 300_000)
    assert store.put_new("files/p/big.whl", src)
    assert store.read("files/p/big.whl") == src.read_bytes()


def test_put_if_is_compare_and_swap(store: Store) -> None:
    assert store.put_if("simple/index.html", b"v1", None, content_type="text/html")
    assert not store.put_if("simple/index.html", b"again", None, content_type="text/html")
    data, token = store.read_with_token("simple/index.html")
    assert data == b"v1" and token
    assert store.put_if("simple/index.html", b"v2", token, content_type="text/html")
    assert not store.put_if("simple/index.html", b"stale", token, content_type="text/html")
    assert store.read("simple/index.html") == b"v2"


def test_compare_and_swap_loses_no_update_under_contention(store: Store) -> None:
    """Eight threads each add 5 to a counter through read/put_if retries: no increment lost."""
    key = "simple/counter/index.json"
    store.put_if(key, b"0", None, content_type="application/json")

    def bump() -> None:
        for _ in range(5):
            while True:
                data, token = store.read_with_token(key)
                if store.put_if(
                    key, str(int(data or b"0") + 1).encode(), token, content_type="application/json"
                ):
                    break

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.read(key) == b"40"


def test_list_delete_and_prefixes(store: Store) -> None:
    for key in ["files/a/1.whl", "files/a/1.whl.metadata", "files/b/2.whl", "simple/a/index.html"]:
        store.put_new(key, key.encode())
    assert sorted(o.key for o in store.list("files/a/")) == [
        "files/a/1.whl",
        "files/a/1.whl.metadata",
    ]
    assert sorted(o.key for o in store.list("files/")) == [
        "files/a/1.whl",
        "files/a/1.whl.metadata",
        "files/b/2.whl",
    ]
    assert {o.key: o.size for o in store.list("files/b")} == {
        "files/b/2.whl": len(b"files/b/2.whl")
    }
    assert [o.key for o in store.page_objects()] == ["simple/a/index.html"]
    store.delete("simple/a/index.html")
    assert store.read("simple/a/index.html") is None


def test_published_content_keys_reads_the_manifests(store: Store, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "demo", "1.0")
    key = f"files/demo/{wheel.name}"
    store.put_new(key, wheel)
    manifest = {"version": 1, "cell": {"package": "demo"}, "content_key": "abc123", "sha256": "x"}
    store.put_new(key + ".provenance.json", json.dumps(manifest).encode())
    # A manifest whose wheel never arrived does not count as published.
    store.put_new(
        "files/demo/demo-2.0-py3-none-any.whl.provenance.json",
        json.dumps({**manifest, "content_key": "orphan"}).encode(),
    )
    assert store.published_content_keys() == {"abc123"}


