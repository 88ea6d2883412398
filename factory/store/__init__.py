"""The store: a local directory or a URL store (S3), behind one Protocol.

``SCHEMES`` is the registry of URL stores: a spec's scheme (``s3://...``) -> the class that
parses it (``from_url``); a spec without one is a directory. A new backend is its module plus
one line here. ``open_store(spec)`` picks one; every spec is parsed here and nowhere else.
"""

from __future__ import annotations

import os

from factory.errors import StoreError
from factory.store.base import Store, StoreObject, UrlStore, WheelEntry, file_key
from factory.store.local import LocalStore
from factory.store.s3 import S3Store

SCHEMES: dict[str, UrlStore] = {"s3": S3Store}
URL_FORMS = " or ".join(cls.url_form for cls in SCHEMES.values())  # for messages


def url_scheme(spec: str) -> str | None:
    """The scheme of a URL store's spec ('s3'); None for a directory; StoreError for a scheme no
    backend has."""
    if "://" not in spec:
        return None
    scheme = spec.partition("://")[0]
    if scheme not in SCHEMES:
        raise StoreError(f"unsupported store {spec!r}", tip=f"use a directory or {URL_FORMS}")
    return scheme


def open_store(spec: str) -> Store:
    """``spec`` is a directory path or a URL store (``s3://bucket/prefix``); nothing is created
    or contacted yet."""
    scheme = url_scheme(spec)
    if scheme is None:
        return LocalStore(spec)
    return SCHEMES[scheme].from_url(spec)


def open_existing_store(spec: str) -> Store:
    """``open_store`` for commands that only read or tidy a store: a local store must already
    be a directory (a typo in --store must not serve, verify or list an empty store it made)."""
    store = open_store(spec)
    if isinstance(store, LocalStore):
        try:
            is_dir = store.root.is_dir()
            if is_dir:
                with os.scandir(store.root):
                    pass
        except OSError as exc:  # a directory on the way, or the store itself, unreadable
            raise StoreError(f"cannot read store {store.root}: {exc.strerror or exc}") from None
        if not is_dir:
            raise StoreError(
                f"store {store.root} does not exist",
                tip="give --store the directory that holds the published wheels "
                "(a build with --publish makes it)",
            )
    return store


__all__ = [
    "SCHEMES", "URL_FORMS", "LocalStore", "Store", "StoreObject", "WheelEntry", "file_key",
    "open_existing_store", "open_store", "url_scheme",
]
