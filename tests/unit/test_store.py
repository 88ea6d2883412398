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
