"""The remote compile cache: the builder's cache synced with S3, from the host.

Build containers have no network, so the caches inside them cannot reach S3. The host does it
instead: before a build it pulls the entries it lacks, after the build it pushes the ones S3
lacks. Both layers of the builder's cache dir (``factory.build.compile_cache``) travel:

- ``sccache/``: sccache's own entries, the same bytes in its disk layout (``a/b/<key>``) and in
  its S3 layout (``<prefix>/a/b/c/<key>``), so a builder that runs sccache with its S3 backend
  directly (a networked builder) shares the same remote.
- ``ccache/``: the direct layer's results and manifests (``a/b/<name>R|M``) under
  ``<prefix>/ccache/a/b/<name>``, so another builder's first build of a kernel is a 0.1 s hit,
  not a pass of preprocessing per stage. An entry already on one side is never overwritten (a
  manifest that grew since is only a missed hit, and ccache checks every result it reads).

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

from factory.build.compile_cache import RemoteCache
from factory.errors import StoreError
from factory.runners.cache_config import DIRECT_SUBDIR, SCCACHE_SUBDIR
from factory.store.s3 import error_code, s3_client
from factory.units import format_size

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
DIRECT_RE = re.compile(r"^[0-9a-v]/[0-9a-v]/[0-9a-v]{8,}[RM]$")
WORKERS = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncResult:
    direction: str  # "pull" | "push"
    files: int  # entries copied
    bytes: int
    present: int  # entries the other side already had
    seconds: float

    def summary(self) -> str:
        where = "from" if self.direction == "pull" else "to"
        return (
            f"{self.direction}ed {self.files} entr{'y' if self.files == 1 else 'ies'} "
            f"({format_size(self.bytes)}) {where} the remote cache, {self.present} already there, "
            f"{self.seconds:.1f} s"
        )


def client_for(remote: RemoteCache) -> Any:
    # best effort: a remote that is down costs a build seconds, not minutes
    return s3_client(endpoint=remote.endpoint, region=remote.region, max_attempts=3,
                     connect_timeout=5, read_timeout=60)


# An entry is named by its path under the builder's cache dir ("sccache/a/b/<key>",
# "ccache/a/b/<name>R"); each layer maps that to its S3 key and back.


def remote_key(remote: RemoteCache, entry: str) -> str:
    layer, _, rel = entry.partition("/")
    if layer == DIRECT_SUBDIR:
        return f"{remote.prefix}/{DIRECT_SUBDIR}/{rel}"
    key = rel.rsplit("/", 1)[-1]
    return f"{remote.prefix}/{key[0]}/{key[1]}/{key[2]}/{key}"


def _entry_of(remote: RemoteCache, s3_key: str) -> str | None:
    """The entry an S3 key holds, or None for anything else under the prefix."""
    rel = s3_key[len(remote.prefix) + 1 :] if s3_key.startswith(remote.prefix + "/") else ""
    if rel.startswith(DIRECT_SUBDIR + "/"):
        direct = rel[len(DIRECT_SUBDIR) + 1 :]
        return f"{DIRECT_SUBDIR}/{direct}" if DIRECT_RE.match(direct) else None
    key = rel.rsplit("/", 1)[-1]
    if KEY_RE.match(key) and rel == f"{key[0]}/{key[1]}/{key[2]}/{key}":
        return f"{SCCACHE_SUBDIR}/{key[0]}/{key[1]}/{key}"
    return None


def local_keys(cache_dir: Path) -> dict[str, Path]:
    """The entries on disk: sccache's ``a/b/<key>`` (its preprocessor cache stays local) and
    ccache's results and manifests (not its stats, locks or temporary files)."""
    found: dict[str, Path] = {}
    sccache = cache_dir / SCCACHE_SUBDIR
    if sccache.is_dir():
        for path in sccache.glob("?/?/*"):
            key, rel = path.name, path.relative_to(sccache).as_posix()
            if KEY_RE.match(key) and rel == f"{key[0]}/{key[1]}/{key}":
                found[f"{SCCACHE_SUBDIR}/{rel}"] = path
    direct = cache_dir / DIRECT_SUBDIR
    if direct.is_dir():
        for path in direct.glob("?/?/*"):
            rel = path.relative_to(direct).as_posix()
            if DIRECT_RE.match(rel) and path.is_file():
                found[f"{DIRECT_SUBDIR}/{rel}"] = path
    return found


def _remote_keys(remote: RemoteCache, client: Any) -> Iterator[tuple[str, int]]:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=remote.bucket, Prefix=remote.prefix + "/"):
        for obj in page.get("Contents", []):
            entry = _entry_of(remote, obj["Key"])
            if entry is not None:
                yield entry, int(obj.get("Size", 0))


def _s3_error(remote: RemoteCache, what: str, exc: Exception) -> StoreError:
    code = error_code(exc)
    return StoreError(
        f"remote compile cache {remote.url}: {what} failed: "
        f"{code or type(exc).__name__}"
    )


def pull(remote: RemoteCache, cache_dir: Path, *, client: Any = None) -> SyncResult:
    """Download the entries this builder lacks. Each lands under a temporary name and is renamed
    into place: a build never reads half an entry, a killed pull leaves no partial one."""
    # heavy: botocore (boto3's), imported when S3 is used
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
        dest = cache_dir / key
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
    """Upload the entries S3 lacks (one that is there stays: results are keyed by what made
    them, and a manifest there is as good as ours)."""
    # heavy: botocore (boto3's), imported when S3 is used
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
        except FileNotFoundError:  # evicted by the cache's size bound since the listing
            return 0
        return size

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            sizes = list(pool.map(send, todo))
    except (BotoCoreError, ClientError, OSError) as exc:
        raise _s3_error(remote, "upload", exc) from None
    return SyncResult(direction="push", files=len(sizes), bytes=sum(sizes),
                      present=len(have) - len(todo), seconds=time.monotonic() - t0)
