"""The remote compile cache: the builder's cache (sccache's and the direct layer's entries) synced
with S3 from the host (a real S3 API server on loopback; real sccache and nvcc in the slow
test)."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import boto3
import index_fixtures
import pytest
from cache_fixtures import (
    HEADER,
    KERNEL,
    cache_entry,
    cache_matrix,
    compile_in_a_fresh_server,
    free_port,
)
from ops_builds import factory_cli
from tools import need_nvcc, tool

from factory.build import remote_cache
from factory.build.compile_cache import RemoteCache

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec


def test_push_then_pull_moves_exactly_the_missing_entries(
    tmp_path: Path, s3_spec: str, s3_env: dict[str, str]
) -> None:
    remote = _remote(s3_spec, s3_env)
    a, b = tmp_path / "builder-a", tmp_path / "builder-b"
    keys = [cache_entry(a / "sccache", f"object {i}".encode() * 1000) for i in range(3)]
    # not cache entries: sccache's local preprocessor cache, a stray temp file
    (a / "sccache/preprocessor/1/2/3").mkdir(parents=True)
    (a / "sccache/preprocessor/1/2/3" / ("1" * 64)).write_bytes(b"direct mode")
    (a / "sccache/0").mkdir(exist_ok=True)
    (a / "sccache/0" / "tmp.partial").write_bytes(b"x")
    # the direct layer: a result and a manifest (ccache's names), and what is not an entry
    direct = {"c/c/7furaj1jvvfmfmu5fntrhksiqbajarqR": b"result",
              "7/3/fe1oo00bdo6k74vc5eq5msse0kc4v5aM": b"manifest"}
    for rel, data in {**direct, "c/stats": b"0", "c/CACHEDIR.TAG": b"",
                      "tmp/.cleaned": b"", "7/3/lock": b""}.items():
        (a / "ccache" / rel).parent.mkdir(parents=True, exist_ok=True)
        (a / "ccache" / rel).write_bytes(data)

    first = remote_cache.push(remote, a)
    assert (first.files, first.present) == (5, 0)
    assert _listing(s3_spec, s3_env) == sorted(
        [f"pkgs/compile-cache/{k[0]}/{k[1]}/{k[2]}/{k}" for k in keys]
        + [f"pkgs/compile-cache/ccache/{rel}" for rel in direct]
    )
    again = remote_cache.push(remote, a)
    assert (again.files, again.present) == (0, 5)  # nothing is sent twice

    already = cache_entry(b / "sccache", b"object 0" * 1000)
    pulled = remote_cache.pull(remote, b)
    assert (pulled.files, pulled.present) == (4, 1) and already in keys
    for k in keys:
        rel = f"sccache/{k[0]}/{k[1]}/{k}"
        assert (b / rel).read_bytes() == (a / rel).read_bytes()
    for rel, data in direct.items():
        assert (b / "ccache" / rel).read_bytes() == data
    assert not (b / "ccache/c/stats").exists()  # counters stay with their builder
    assert not [p for p in b.rglob(".pull-*")]  # no temporary files left behind
    assert remote_cache.pull(remote, b).files == 0


def test_cache_push_and_pull_commands(tmp_path: Path, s3_spec: str, s3_env: dict[str, str]) -> None:
    matrix = cache_matrix(tmp_path, s3_spec)
    key = cache_entry(tmp_path / "cc" / "sccache", b"kernel object")
    pushed = factory_cli("cache", "push", "--matrix", str(matrix), "--json", env=s3_env)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["files"] == 1
    shutil.rmtree(tmp_path / "cc")
    pulled = factory_cli("cache", "pull", "--matrix", str(matrix), env=s3_env)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith("pulled 1 entry")
    assert (tmp_path / "cc" / "sccache" / key[0] / key[1] / key).read_bytes() == b"kernel object"


def test_a_build_pulls_before_and_pushes_after(
    tmp_path: Path, s3_spec: str, s3_env: dict[str, str]
) -> None:
    """The build's wrapper around its attempts: what another builder pushed is on disk before the
    compile starts; what this one compiled is in S3 after, also when the build failed."""
    from factory.build.job import BuildOptions
    from factory.build.pipeline import _remote_cache_synced
    from factory.logger import Log
    from factory.matrix.load import load_matrix

    matrix = load_matrix(cache_matrix(tmp_path, s3_spec))
    other = tmp_path / "other-builder"
    theirs = cache_entry(other / "sccache", b"compiled elsewhere")
    remote_cache.push(_remote(s3_spec, s3_env), other)
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with _remote_cache_synced(matrix, BuildOptions(cache=True), Log(stream=out)):
            assert (tmp_path / "cc" / "sccache" / theirs[0] / theirs[1] / theirs).is_file()
            ours = cache_entry(tmp_path / "cc" / "sccache", b"compiled here")
            raise RuntimeError("the build failed after compiling")
    assert f"pkgs/compile-cache/{ours[0]}/{ours[1]}/{ours[2]}/{ours}" in _listing(s3_spec, s3_env)
    assert "pulled 1 entry" in out.getvalue() and "pushed 1 entry" in out.getvalue()


@pytest.mark.slow
def test_an_offline_builder_hits_what_another_pushed(
    tmp_path: Path, s3_spec: str, s3_env: dict[str, str]
) -> None:
    """Real sccache and nvcc: builder A compiles with a disk cache only (no network, like a build
    container) and pushes; builder B pulls into an empty disk cache, compiles offline, and gets
    the whole object from the cache."""
    sccache, nvcc = tool("sccache"), need_nvcc()
    remote = _remote(s3_spec, s3_env)
    src = tmp_path / "k.cu"
    src.write_text(KERNEL.replace("#include <ext.h>", HEADER))
    results = []
    for builder in ("a", "b"):
        cache_dir = tmp_path / f"cache-{builder}"
        disk = cache_dir / "sccache"
        if builder == "b":
            assert remote_cache.pull(remote, cache_dir).files >= 1
        env = {  # no S3 settings: sccache sees only its disk
            "HOME": str(tmp_path),
            "PATH": f"{Path(nvcc).parent}:/usr/bin:/bin",
            "SCCACHE_DIR": str(disk),
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_SERVER_PORT": str(free_port()),
        }
        argv = [sccache, nvcc, "-c", str(src), "-o", str(tmp_path / f"{builder}.o"),
                "-gencode=arch=compute_80,code=sm_80"]
        results.append(compile_in_a_fresh_server(sccache, argv, env, cwd=tmp_path))
        if builder == "a":
            assert remote_cache.push(remote, cache_dir).files >= 1
    first, second = results
    assert first.object_misses == 1
    assert second.object_hits == 1 and second.misses == 0
    assert (tmp_path / "a.o").read_bytes() == (tmp_path / "b.o").read_bytes()
    assert os.listdir(tmp_path / "cache-b" / "sccache")


def _remote(spec: str, env: dict[str, str]) -> RemoteCache:
    return RemoteCache.from_store(spec, environ=env)


def _listing(spec: str, env: dict[str, str]) -> list[str]:
    bucket = spec[len("s3://"):].split("/", 1)[0]
    client = boto3.client("s3", endpoint_url=env["FACTORY_S3_ENDPOINT_URL"], region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))
