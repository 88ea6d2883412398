"""HTTP caching of the embedded server, checked with curl: single byte ranges (206), strong
ETags and Last-Modified with 304 on pages and files, gzip for pages, the index files by their
own names; and the same Cache-Control on S3 objects. Also unyank."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import index_fixtures
import pytest
from index_wheels import make_wheel, variant_wheel

from factory.index.publish import publish, unyank, yank
from factory.index.server import RunningServer, parse_range, running_server
from factory.store import LocalStore, open_store
from factory.store.base import FILE_CACHE_CONTROL, PAGE_CACHE_CONTROL

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec

pytestmark = pytest.mark.integration
WHEEL = "fa_demo-1.0+cu130torch2.14sm100-py3-none-any.whl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    tmp = tmp_path_factory.mktemp("http")
    store = LocalStore(tmp / "store")
    wheels = [variant_wheel(tmp, "fa-demo", "1.0", "2.14", archs="100", payload_bytes=10000)]
    wheels += [make_wheel(tmp, f"pkg{i}", "1.0") for i in range(40)]  # a root page worth gzip
    publish(store, wheels)
    with running_server(store.root) as running:
        yield running


def curl(*args: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one curl request."""
    done = subprocess.run(
        ["curl", "-s", "-D", "-", "--max-time", "30", *args], capture_output=True, check=True
    )
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def test_a_single_range_gets_206_and_only_those_bytes(server: RunningServer) -> None:
    url = f"{server.url}files/fa-demo/{WHEEL.replace('+', '%2B')}"
    status, headers, whole = curl(url)
    assert status == 200 and headers["accept-ranges"] == "bytes"
    assert headers["cache-control"] == FILE_CACHE_CONTROL
    status, headers, part = curl("-H", "Range: bytes=100-199", url)
    assert status == 206 and part == whole[100:200]
    assert headers["content-range"] == f"bytes 100-199/{len(whole)}"
    status, _, tail = curl("-H", "Range: bytes=-22", url)  # the zip's end record: uv reads it
    assert status == 206 and tail == whole[-22:]
    status, headers, _ = curl("-H", f"Range: bytes={len(whole)}-", url)
    assert status == 416 and headers["content-range"] == f"bytes */{len(whole)}"
    # Several ranges: the whole file (allowed), never a wrong multipart answer.
    assert curl("-H", "Range: bytes=0-1,5-6", url)[:3:2] == (200, whole)
    # If-Range with another version's tag: the whole file.
    assert curl("-H", "Range: bytes=0-9", "-H", 'If-Range: "other"', url)[0] == 200


def test_files_and_pages_answer_304_to_their_validators(server: RunningServer) -> None:
    for url in (
        f"{server.url}files/fa-demo/{WHEEL.replace('+', '%2B')}",
        f"{server.url}simple/fa-demo/",
        f"{server.url}cu130-torch2.14-sm100/simple/",
    ):
        status, headers, _ = curl(url)
        assert status == 200
        etag, modified = headers["etag"], headers["last-modified"]
        assert etag.startswith('"') and not etag.startswith("W/")  # strong
        assert curl("-H", f"If-None-Match: {etag}", url)[0] == 304
        assert curl("-H", f"If-Modified-Since: {modified}", url)[0] == 304
        assert curl("-H", 'If-None-Match: "stale"', url)[0] == 200
        # If-None-Match wins over a matching If-Modified-Since (RFC 9110).
        assert (
            curl("-H", 'If-None-Match: "stale"', "-H", f"If-Modified-Since: {modified}", url)[0]
            == 200
        )
    status, headers, _ = curl(f"{server.url}simple/fa-demo/")
    assert headers["cache-control"] == PAGE_CACHE_CONTROL


def test_a_page_changes_its_etag_when_it_changes(server: RunningServer, tmp_path: Path) -> None:
    url = f"{server.url}simple/"
    etag = curl(url)[1]["etag"]
    publish(LocalStore(server.server.config.store), [make_wheel(tmp_path, "newcomer", "1.0")])
    status, headers, body = curl("-H", f"If-None-Match: {etag}", url)
    assert status == 200 and headers["etag"] != etag and b"newcomer" in body


def test_pages_are_gzipped_when_asked(server: RunningServer) -> None:
    status, headers, plain = curl(f"{server.url}simple/")
    assert status == 200 and "content-encoding" not in headers
    status, headers, packed = curl("-H", "Accept-Encoding: gzip", f"{server.url}simple/")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(packed) == plain and len(packed) < len(plain)
    assert (
        "Accept-Encoding" in headers["vary"]
        and headers["etag"] != curl(f"{server.url}simple/")[1]["etag"]
    )
    assert curl("-H", "Accept-Encoding: gzip;q=0", f"{server.url}simple/")[2] == plain


def test_index_files_are_served_by_their_own_names(server: RunningServer) -> None:
    status, headers, body = curl(f"{server.url}simple/index.html")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert body == curl(f"{server.url}simple/")[2]
    status, headers, body = curl(f"{server.url}simple/fa-demo/index.json")
    assert status == 200 and json.loads(body)["name"] == "fa-demo"
    assert curl(f"{server.url}index.html")[0] == 200
    assert curl(f"{server.url}simple/../files/x/index.html")[0] == 404
    assert curl(f"{server.url}files/fa-demo/index.html")[0] == 404


def test_range_parsing() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-", 10) == (0, 9)
    assert parse_range("bytes=5-100", 10) == (5, 9)
    assert parse_range("bytes=-3", 10) == (7, 9)
    assert parse_range("bytes=-30", 10) == (0, 9)
    assert parse_range("bytes=10-", 10) is False
    assert parse_range("bytes=5-4", 10) is False
    assert parse_range("bytes=0-1,3-4", 10) is None
    assert parse_range("items=0-1", 10) is None


def test_unyank_offers_the_file_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    publish(store, [make_wheel(tmp_path, "yk", "1.0")])
    name = "yk-1.0-py3-none-any.whl"
    assert not unyank(store, name)  # not yanked: nothing to undo
    yank(store, name, "broken")
    assert "data-yanked" in store.read("simple/yk/index.html").decode()
    assert unyank(store, name)
    assert "data-yanked" not in store.read("simple/yk/index.html").decode()
    assert json.loads(store.read("simple/yk/index.json"))["files"][0]["yanked"] is False
    yank(store, name, "again")  # and it can be yanked again
    assert "again" in store.read("simple/yk/index.html").decode()
    done = subprocess.run(
        [*index_fixtures.cli("unyank", "--store", str(store.root), name)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "unyanked" in done.stdout
    bad = subprocess.run(
        [*index_fixtures.cli("unyank", "--store", str(store.root), "nope-1.0-py3-none-any.whl")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "not published" in bad.stderr and "Traceback" not in bad.stderr


def test_s3_objects_carry_the_servers_cache_control(s3_spec: str, tmp_path: Path) -> None:
    import boto3

    store = open_store(s3_spec)
    publish(store, [variant_wheel(tmp_path, "fa-demo", "1.0", "2.14", archs="100")])
    bucket, prefix = s3_spec[len("s3://") :].split("/", 1)
    client = boto3.client("s3", endpoint_url=index_fixtures.os.environ["FACTORY_S3_ENDPOINT_URL"])
    wheel = client.head_object(Bucket=bucket, Key=f"{prefix}/files/fa-demo/{WHEEL}")
    page = client.head_object(Bucket=bucket, Key=f"{prefix}/simple/fa-demo/index.html")
    assert wheel["CacheControl"] == FILE_CACHE_CONTROL
    assert page["CacheControl"] == PAGE_CACHE_CONTROL
