"""One builder per cell across hosts: a lease object in the store, written with conditional puts.

The per-host flock (pipeline._cell_lock) keeps two builds of one host out of one build tree;
two hosts sharing a store need the store itself to decide. A builder claims a cell by creating
``leases/<content key>.json`` only if it is absent (S3 ``IfNoneMatch: *``; the local store:
an exclusive create under its lock) and keeps it alive by rewriting it only if it still holds
the version it wrote (S3 ``IfMatch``; local: the same compare-and-swap). A lease whose
``expires`` has passed (its builder was killed, or lost the store) may be taken over with the
same compare-and-swap, so exactly one of several waiting builders gets it. A finished cell is
never rebuilt: the store is asked whether the cell is published before claiming and again once
the lease is held. Release rewrites the lease as expired (conditionally: never someone else's).

Clocks: expiry compares wall clocks of different hosts; the TTL (15 min, renewed every 5)
is far above any sane clock skew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

from factory.errors import StoreError

LEASE_PREFIX = "leases"
LEASE_TTL_SECONDS = 15 * 60.0
POLL_SECONDS = 30.0


class LeaseStore(Protocol):
    """The two primitives of factory.store's Store a lease needs (no import: the store
    is a later stage)."""

    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]: ...

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str) -> bool: ...


def lease_key(content_key: str) -> str:
    if not content_key.isalnum():
        raise StoreError(f"unsafe content key for a lease: {content_key!r}")
    return f"{LEASE_PREFIX}/{content_key}.json"


def new_holder() -> str:
    """host:pid:random: unique per claim, readable in the store."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lease:
    cell: str
    holder: str
    expires: float  # epoch seconds
    token: str | None = None  # the store's version of the object this was read from / written as

    def to_json(self) -> bytes:
        return json.dumps({"version": 1, "cell": self.cell, "holder": self.holder,
                           "expires": self.expires}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, token: str | None) -> Lease:
        try:
            d = json.loads(data)
            return cls(cell=str(d["cell"]), holder=str(d["holder"]),
                       expires=float(d["expires"]), token=token)
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"corrupt lease: {exc}") from None


class CellLease:
    """Claim, renew and release one cell's lease (see the module docstring)."""

    def __init__(self, store: LeaseStore, *, content_key: str, cell: str, holder: str | None = None,
                 ttl: float = LEASE_TTL_SECONDS, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.key = lease_key(content_key)
        self.cell = cell
        self.holder = holder or new_holder()
        self.ttl = ttl
        self.clock = clock
        self.held: Lease | None = None

    def _write(self, token: str | None, expires: float) -> Lease | None:
        mine = Lease(cell=self.cell, holder=self.holder, expires=expires)
        if not self.store.put_if(self.key, mine.to_json(), token,
                                 content_type="application/json"):
            return None
        _, written = self.store.read_with_token(self.key)
        return dataclasses.replace(mine, token=written)

    def try_acquire(self) -> Lease | None:
        """Take the lease if it is free or expired: None on success, else the holder's lease."""
        data, token = self.store.read_with_token(self.key)
        current = Lease.from_json(data, token) if data is not None else None
        if current is not None and current.holder != self.holder and \
                current.expires > self.clock():
            return current
        got = self._write(token, self.clock() + self.ttl)
        if got is None:  # someone else wrote in between: read who
            data, token = self.store.read_with_token(self.key)
            return Lease.from_json(data, token) if data is not None else self.try_acquire()
        self.held = got
        return None

    def renew(self) -> bool:
        """Push the expiry out; False when the lease was lost (taken over after expiring)."""
        if self.held is None:
            return False
        got = self._write(self.held.token, self.clock() + self.ttl)
        self.held = got
        return got is not None

    def release(self) -> None:
        """Mark the lease expired, only if it is still ours."""
        if self.held is None:
            return
        with contextlib.suppress(StoreError):
            self._write(self.held.token, 0.0)
        self.held = None


@contextlib.contextmanager
def hold_cell(store: LeaseStore, *, content_key: str, cell: str, published: Callable[[], bool],
              on_wait: Callable[[Lease], None] = lambda lease: None,
              ttl: float = LEASE_TTL_SECONDS, poll: float = POLL_SECONDS,
              holder: str | None = None) -> Iterator[bool]:
    """Yield True while this builder holds the cell's lease (build it), or False when the cell
    is published (by another builder, before or while we waited): build nothing. Waits while
    another builder's lease is alive; takes it over once it expires. A heartbeat renews the
    lease every ttl/3 while the body runs."""
    lease = CellLease(store, content_key=content_key, cell=cell, ttl=ttl, holder=holder)
    while True:
        if published():
            yield False
            return
        other = lease.try_acquire()
        if other is None:
            break
        on_wait(other)
        time.sleep(max(0.05, min(poll, other.expires - lease.clock() + 0.05)))
    if published():  # finished by the holder we just followed
        lease.release()
        yield False
        return
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(ttl / 3):
            with contextlib.suppress(StoreError):
                if not lease.renew():
                    return

    beat = threading.Thread(target=heartbeat, daemon=True, name=f"lease-{cell}")
    beat.start()
    try:
        yield True
    finally:
        stop.set()
        beat.join(timeout=5)
        lease.release()
