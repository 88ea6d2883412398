"""The store: a local directory or S3, behind one Protocol. ``open_store(spec)`` picks one."""

from __future__ import annotations

from factory.errors import StoreError
from factory.store.base import Store, StoreObject, WheelEntry, file_key
from factory.store.local import LocalStore
from factory.store.s3 import S3Store


def open_store(spec: str) -> Store:
    """``spec`` is a directory path or ``s3://bucket/prefix``; nothing is created yet."""
    if spec.startswith("s3://"):
        bucket, _, prefix = spec[len("s3://") :].partition("/")
        if not bucket:
            raise StoreError(f"store {spec!r} names no bucket", tip="use s3://bucket/prefix")
        return S3Store(bucket, prefix)
    if "://" in spec:
        raise StoreError(f"unsupported store {spec!r}", tip="use a directory or s3://bucket/prefix")
    return LocalStore(spec)


def open_existing_store(spec: str) -> Store:
    """``open_store`` for commands that only read or tidy a store: a local store must already
    be a directory (a typo in --store must not serve, verify or list an empty store it made)."""
    store = open_store(spec)
    if isinstance(store, LocalStore) and not store.root.is_dir():
        raise StoreError(
            f"store {store.root} does not exist",
            tip="give --store the directory that holds the published wheels "
            "(a build with --publish makes it)",
        )
    return store


__all__ = [
    "LocalStore", "Store", "StoreObject", "WheelEntry", "file_key", "open_existing_store",
    "open_store",
]
