"""The Store primitives that need no S3 server: key checks, no temp files left by the local store.
The contract on both backends is in tests/integration/test_store.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.errors import StoreError
from factory.store import LocalStore
from factory.store.base import check_key


@pytest.mark.parametrize(
    "key", ["../x", "files/../x", "/abs", "a//b", ".hidden", "a/.tmp-1", "a/b\\c", ""]
)
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(StoreError):
        check_key(key)


def test_local_store_leaves_no_temp_files(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "s")
    s.put_new("files/p/x.whl", b"1")
    s.put_new("files/p/x.whl", b"2")
    s.put_if("simple/p/index.html", b"a", "wrong-token", content_type="text/html")
    leftovers = [p.name for p in (tmp_path / "s").rglob(".tmp-*")]
    assert leftovers == []


# -- the registry of URL stores ------------------------------------------------------------------
def test_a_url_store_comes_from_its_scheme_and_a_directory_needs_none(tmp_path: Path) -> None:
    from factory.store import SCHEMES, LocalStore, S3Store, open_store, url_scheme

    assert SCHEMES == {"s3": S3Store}
    s3 = open_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Store) and s3.url == "s3://bucket/some/prefix"
    assert url_scheme(str(tmp_path)) is None and isinstance(open_store(str(tmp_path)), LocalStore)


@pytest.mark.parametrize(("spec", "message"), [
    ("gs://bucket/x", "unsupported store 'gs://bucket/x'"),
    ("s3:///prefix", "names no bucket"),
])
def test_a_bad_store_spec_is_one_line(spec: str, message: str) -> None:
    from factory.store import open_store

    with pytest.raises(StoreError, match=message) as info:
        open_store(spec)
    assert "\n" not in info.value.message and "s3://bucket/prefix" in (info.value.tip or "")
