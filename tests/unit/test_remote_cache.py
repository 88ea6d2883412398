"""The remote compile cache: the builder's cache (sccache's and the direct layer's entries) synced
with S3 from the host (a real S3 API server on loopback; real sccache and nvcc in the slow
test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cache_fixtures import cache_entry, cache_matrix
from ops_builds import factory_cli

from factory.build import remote_cache
from factory.build.compile_cache import RemoteCache
from factory.errors import StoreError


def test_an_unreachable_remote_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    remote = RemoteCache(bucket="wheels", prefix="x/compile-cache", endpoint="http://127.0.0.1:9")
    cache_entry(tmp_path / "sccache", b"data")
    for fn in (remote_cache.pull, remote_cache.push):
        with pytest.raises(StoreError) as info:
            fn(remote, tmp_path)
        assert "\n" not in info.value.message and "s3://wheels/x/compile-cache" in info.value.message


def test_cache_pull_without_a_remote_is_a_config_error(tmp_path: Path) -> None:
    r = factory_cli("cache", "pull", "--matrix", str(cache_matrix(tmp_path, None)))
    assert r.returncode != 0 and "no remote compile cache" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2


