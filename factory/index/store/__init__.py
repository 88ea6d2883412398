"""The store: a local directory or S3, behind one Protocol. ``open_store(spec)`` picks one."""

from __future__ import annotations

from factory.errors import StoreError
from factory.index.store.base import Store, StoreObject, WheelEntry, file_key
from factory.index.store.local import LocalStore


def open_store(spec: str) -> Store:
    """``spec`` is a directory path or ``s3://bucket/prefix``; nothing is created yet."""
    if spec.startswith("s3://"):
        from factory.index.store.s3 import S3Store

        bucket, _, prefix = spec[len("s3://") :].partition("/")
        if not bucket:
            raise StoreError(f"store {spec!r} names no bucket", tip="use s3://bucket/prefix")
        return S3Store(bucket, prefix)
    if "://" in spec:
        raise StoreError(f"unsupported store {spec!r}", tip="use a directory or s3://bucket/prefix")
    return LocalStore(spec)


__all__ = ["LocalStore", "Store", "StoreObject", "WheelEntry", "file_key", "open_store"]
