"""The store in S3 or any S3-compatible service (boto3).

``FACTORY_S3_ENDPOINT_URL`` points boto3 at a non-AWS endpoint; credentials and region come
from the standard AWS variables and files. Exclusive create is ``PutObject`` with
``If-None-Match: *`` and compare-and-swap is ``If-Match: <ETag>`` (S3 conditional writes,
available since 2024), so no lock object is needed and a dead publisher cannot leave one behind.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from factory.environment import S3_ENDPOINT_ENV
from factory.errors import StoreError
from factory.store.base import (
    StoreBase,
    StoreObject,
    cache_control,
    check_key,
    parallel_reads,
)

ENDPOINT_ENV = S3_ENDPOINT_ENV
DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_S = 3  # an endpoint that does not answer a TCP connect in this is down


def endpoint_from(environ: Mapping[str, str] | None = None) -> str | None:
    """The S3 endpoint the environment names (``FACTORY_S3_ENDPOINT_URL``); None: AWS's."""
    env = os.environ if environ is None else environ
    return env.get(ENDPOINT_ENV) or None


def region_from(environ: Mapping[str, str] | None = None) -> str:
    """The AWS region the environment names (``AWS_REGION``, ``AWS_DEFAULT_REGION``), else
    us-east-1."""
    env = os.environ if environ is None else environ
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def unreachable(endpoint: str, exc: Exception) -> StoreError:
    """The one error for an S3 endpoint that cannot be connected to: it names the endpoint."""
    return StoreError(
        f"cannot reach the S3 endpoint {endpoint}: {type(exc).__name__}",
        tip=f"check {ENDPOINT_ENV} (or the AWS region) and that the endpoint is up and reachable "
        "from this host",
    )


def check_reachable(client: Any, bucket: str) -> None:
    """One request with no retries and a short connect timeout: a down endpoint fails here in
    seconds, not after the store's eight retries. Any answer, even an error, means it is up."""
    # heavy: botocore (boto3's), imported when S3 is used
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
    )

    endpoint = str(client.meta.endpoint_url)
    probe = s3_client(endpoint=endpoint, region=client.meta.region_name, max_attempts=1)
    try:
        probe.head_bucket(Bucket=bucket)
    except (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError) as exc:
        raise unreachable(endpoint, exc) from None
    except Exception:  # noqa: BLE001 - an answer (403, 404, ...): reachable; the real call reports it
        return


def error_code(exc: Exception) -> str:
    """The S3 error code of a botocore ClientError ('' for other errors)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: Exception) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def s3_client(
    *, endpoint: str | None = None, region: str | None = None, max_attempts: int = 8, **config: Any
) -> Any:
    """A boto3 S3 client. The endpoint and region default to what the environment says
    (``FACTORY_S3_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``, else us-east-1);
    ``config`` adds botocore settings (timeouts)."""
    # heavy: boto3, imported when S3 is used
    import boto3
    from botocore.config import Config

    config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return boto3.client(
        "s3",
        endpoint_url=endpoint or endpoint_from(),
        region_name=region or region_from(),
        config=Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=32,
            **config,
        ),
    )


SCHEME = "s3"


def parse_url(url: str) -> tuple[str, str] | None:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix'); None for anything else. The
    bucket may come back empty (s3:///x): the caller says what it needed it for."""
    head = f"{SCHEME}://"
    if not url.startswith(head):
        return None
    bucket, _, prefix = url[len(head):].partition("/")
    return bucket, prefix.strip("/")


def s3_url(bucket: str, prefix: str = "") -> str:
    return f"{SCHEME}://{bucket}/{prefix}" if prefix else f"{SCHEME}://{bucket}"


class S3Store(StoreBase):
    url_form = f"{SCHEME}://bucket/prefix"  # what a spec of this store looks like, for messages

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None) -> None:
        if not bucket:
            raise StoreError(f"an S3 store needs a bucket: {self.url_form}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = s3_url(bucket, self.prefix)
        self._client = client
        self._probed = client is not None  # a client handed in is the caller's business

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        if not self._probed:
            self._probed = True
            check_reachable(self._client, self.bucket)
        return self._client

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """The store an ``s3://bucket/prefix`` spec names; nothing is contacted yet."""
        parts = parse_url(url)
        if parts is None or not parts[0]:
            raise StoreError(f"store {url!r} names no bucket", tip=f"use {cls.url_form}")
        return cls(*parts)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    def _k(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, what: str, key: str, exc: Exception) -> StoreError:
        endpoint = self._client.meta.endpoint_url if self._client is not None else "?"
        return StoreError(
            f"S3 {what} {self.url}/{key} failed: {error_code(exc) or type(exc).__name__} "
            f"(endpoint {endpoint})"
        )

    # -- reads --------------------------------------------------------------------------------
    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        # heavy: botocore (boto3's), imported when S3 is used
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            return response["Body"].read(), str(response["ETag"])
        except ClientError as exc:
            if error_code(exc) in {"NoSuchKey", "404", "NotFound"}:
                return None, None
            raise self._fail("read of", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("read of", key, exc) from None

    def read(self, key: str) -> bytes | None:
        return self.read_with_token(key)[0]

    def _read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]:
        return parallel_reads(self, keys)

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[StoreObject]:
        # heavy: botocore (boto3's), imported when S3 is used
        from botocore.exceptions import BotoCoreError, ClientError

        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield StoreObject(key=obj["Key"][cut:], size=int(obj["Size"]))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("listing of", prefix, exc) from None

    # -- writes -------------------------------------------------------------------------------
    def _put(self, key: str, body: Any, content_type: str, **conditions: str) -> bool:
        # heavy: botocore (boto3's), imported when S3 is used
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._k(key),
                Body=body,
                ContentType=content_type,
                CacheControl=cache_control(key),
                **conditions,
            )
            return True
        except ClientError as exc:
            # 412: the condition failed; 409: another conditional write to the key was in flight.
            if _status(exc) in {409, 412} or error_code(exc) in {
                "PreconditionFailed",
                "ConditionalRequestConflict",
            }:
                return False
            raise self._fail("write of", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("write of", key, exc) from None

    def put_new(self, key: str, data: bytes | Path) -> bool:
        content_type = "application/octet-stream"
        if isinstance(data, Path):
            with open(data, "rb") as body:
                return self._put(key, body, content_type, IfNoneMatch="*")
        return self._put(key, data, content_type, IfNoneMatch="*")

    def put_if(
        self, key: str, data: bytes, token: str | None, *, content_type: str = "text/html"
    ) -> bool:
        if token is None:
            return self._put(key, data, content_type, IfNoneMatch="*")
        return self._put(key, data, content_type, IfMatch=token)

    def delete(self, key: str) -> None:
        # heavy: botocore (boto3's), imported when S3 is used
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._k(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("delete of", key, exc) from None
