"""The remote compile cache: the builder's sccache disk cache synced with S3, from the host.

Build containers have no network, so sccache inside them cannot reach S3. The host does it
instead: before a build it pulls the entries it lacks, after the build it pushes the ones S3
lacks. The entries are sccache's own: the same bytes in its disk layout (``a/b/<key>``) and in
its S3 layout (``<prefix>/a/b/c/<key>``), so a builder that runs sccache with its S3 backend
directly (a networked builder) shares the same remote.

A sync never fails a build: an S3 error is reported, and the build goes on with what it has.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .compile_cache import RemoteCache
from .errors import StoreError

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
WORKERS = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncResult:
    direction: str  # "pull" | "push"
    files: int  # entries copied
    bytes: int
    present: int  # entries the other side already had
    seconds: float

    def summary(self) -> str:
        from .logger import human_bytes

        where = "from" if self.direction == "pull" else "to"
        return (
            f"{self.direction}ed {self.files} entr{'y' if self.files == 1 else 'ies'} "
            f"({human_bytes(self.bytes)}) {where} the remote cache, {self.present} already there, "
            f"{self.seconds:.1f} s"
        )


def client_for(remote: RemoteCache) -> Any:
    from .store.s3 import s3_client

    # best effort: a remote that is down costs a build seconds, not minutes
    return s3_client(endpoint=remote.endpoint, region=remote.region, max_attempts=3,
                     connect_timeout=5, read_timeout=60)


def remote_key(remote: RemoteCache, key: str) -> str:
    return f"{remote.prefix}/{key[0]}/{key[1]}/{key[2]}/{key}"


def local_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / key[0] / key[1] / key


def local_keys(cache_dir: Path) -> dict[str, Path]:
    """The cache entries on disk (sccache's ``a/b/<key>``; its preprocessor cache stays local)."""
    found: dict[str, Path] = {}
    if not cache_dir.is_dir():
        return found
    for path in cache_dir.glob("?/?/*"):
        key = path.name
        if KEY_RE.match(key) and key[0] == path.parent.parent.name and key[1] == path.parent.name:
            found[key] = path
    return found


def _remote_keys(remote: RemoteCache, client: Any) -> Iterator[tuple[str, int]]:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=remote.bucket, Prefix=remote.prefix + "/"):
        for obj in page.get("Contents", []):
            key = obj["Key"].rsplit("/", 1)[-1]
            if KEY_RE.match(key) and obj["Key"] == remote_key(remote, key):
                yield key, int(obj.get("Size", 0))


def _s3_error(remote: RemoteCache, what: str, exc: Exception) -> StoreError:
    from .store.s3 import error_code

    code = error_code(exc)
    return StoreError(
        f"remote compile cache s3://{remote.bucket}/{remote.prefix}: {what} failed: "
        f"{code or type(exc).__name__}"
    )


def pull(remote: RemoteCache, cache_dir: Path, *, client: Any = None) -> SyncResult:
    """Download the entries this builder lacks. Each lands under a temporary name and is renamed
    into place: a build never reads half an entry, a killed pull leaves no partial one."""
    from botocore.exceptions import BotoCoreError, ClientError

    t0 = time.monotonic()
    client = client or client_for(remote)
    have = local_keys(cache_dir)
    try:
        wanted = [(k, size) for k, size in _remote_keys(remote, client) if k not in have]
    except (BotoCoreError, ClientError) as exc:
        raise _s3_error(remote, "listing", exc) from None

    def fetch(item: tuple[str, int]) -> int:
        key, _ = item
        dest = local_path(cache_dir, key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".pull-")
        try:
            with os.fdopen(fd, "wb") as fh:
                client.download_fileobj(remote.bucket, remote_key(remote, key), fh)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dest.stat().st_size

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            sizes = list(pool.map(fetch, wanted))
    except (BotoCoreError, ClientError) as exc:
        raise _s3_error(remote, "download", exc) from None
    return SyncResult(direction="pull", files=len(sizes), bytes=sum(sizes),
                      present=len(have), seconds=time.monotonic() - t0)


def push(remote: RemoteCache, cache_dir: Path, *, client: Any = None) -> SyncResult:
    """Upload the entries S3 lacks (entries are content-keyed: one that exists is the same)."""
    from botocore.exceptions import BotoCoreError, ClientError

    t0 = time.monotonic()
    client = client or client_for(remote)
    have = local_keys(cache_dir)
    try:
        there = {k for k, _ in _remote_keys(remote, client)}
    except (BotoCoreError, ClientError) as exc:
        raise _s3_error(remote, "listing", exc) from None
    todo = [(k, p) for k, p in sorted(have.items()) if k not in there]

    def send(item: tuple[str, Path]) -> int:
        key, path = item
        try:
            size = path.stat().st_size
            client.upload_file(str(path), remote.bucket, remote_key(remote, key))
        except FileNotFoundError:  # evicted by sccache's size bound since the listing
            return 0
        return size

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            sizes = list(pool.map(send, todo))
    except (BotoCoreError, ClientError, OSError) as exc:
        raise _s3_error(remote, "upload", exc) from None
    return SyncResult(direction="push", files=len(sizes), bytes=sum(sizes),
                      present=len(have) - len(todo), seconds=time.monotonic() - t0)
