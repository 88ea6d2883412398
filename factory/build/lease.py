"""One builder per cell across hosts: a lease object in the store, written with conditional puts.

The protocol, its states and what happens on a pause, a partition or clock skew are written
down in docs/LEASES.md; in short:

The per-host flock (pipeline._cell_lock) keeps two builds of one host out of one build tree;
two hosts sharing a store need the store itself to decide. A builder claims a cell by creating
``leases/<content key>.json`` only if it is absent (S3 ``IfNoneMatch: *``; the local store:
an exclusive create under its lock). Every later write (renewal, release, takeover) reads the
object first and writes only if it is unchanged since (S3 ``IfMatch``; local: the same
compare-and-swap). A lease whose ``expires`` has passed (its builder was killed, paused, or cut
off from the store) may be taken over that way, so exactly one of several waiting builders
gets it. A builder renews its own lease only while the object still names it as the holder: a
renewal that finds another holder means the lease is lost, and the build is told (``Hold``):
it stops before it publishes, and publishing itself first renews with a conditional write, so
a builder publishes only while it provably holds the lease. A finished cell is never rebuilt:
the store is asked whether the cell is published before claiming and again once the lease is
held. Release rewrites the lease as expired (conditionally: never someone else's).

A lease object is read from a shared store, so it is untrusted input: one that does not parse,
or claims to live implausibly long, is treated as expired (taken over) with one warning line,
never an error that blocks its cell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

from factory.errors import ConflictError, StoreError

LEASE_PREFIX = "leases"
LEASE_TTL_SECONDS = 15 * 60.0
POLL_SECONDS = 30.0
# A lease that claims to live longer than this from now was not written by a builder (they
# write now + TTL): treated as invalid, not waited for.
MAX_LEASE_SECONDS = 24 * 3600.0

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """The two primitives of factory.store's Store a lease needs (no import: the store
    is a later stage)."""

    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]: ...

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str) -> bool: ...


class LeaseLost(ConflictError):
    """This builder's lease on a cell was taken over: another builder builds it now."""


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
    token: str | None = None  # the store's version of the object this was read from

    def to_json(self) -> bytes:
        return json.dumps({"version": 1, "cell": self.cell, "holder": self.holder,
                           "expires": self.expires}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, token: str | None) -> Lease:
        """A lease read back; StoreError (one line, saying what is wrong) when it is not one."""
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise TypeError(f"a JSON {type(d).__name__}, not an object")
            cell, holder, expires = d["cell"], d["holder"], d["expires"]
            if not isinstance(cell, str) or not isinstance(holder, str) or not holder:
                raise TypeError("'cell' and 'holder' must be strings")
            if isinstance(expires, bool) or not isinstance(expires, (int, float)) or \
                    not math.isfinite(expires):
                raise TypeError("'expires' must be a finite number")
            return cls(cell=cell, holder=holder, expires=float(expires), token=token)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # ValueError: not JSON
            what = (f"no {exc}" if isinstance(exc, KeyError) else
                    "nested too deep" if isinstance(exc, RecursionError) else str(exc))
            raise StoreError(f"corrupt lease: {what}") from None


def check_lease(key: str, data: bytes, *, now: float) -> str | None:
    """Why the object under ``key`` is not a lease builders can honour, or None: for
    ``factory index verify``, which names such objects."""
    try:
        lease = Lease.from_json(data, None)
    except StoreError as exc:
        return f"{key}: {exc.message} (builders treat it as expired and take it over)"
    if lease.expires > now + MAX_LEASE_SECONDS:
        return (f"{key}: the lease of {lease.holder} claims to live until {lease.expires:.0f}, "
                "more than a day from now (builders treat it as expired and take it over)")
    return None


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
        self.lost: str | None = None  # why the lease was lost, once it was
        self._writing = threading.Lock()  # the heartbeat and the build renew one at a time

    def _read(self) -> tuple[Lease | None, str | None]:
        """The lease in the store and its token; a corrupt one is None (expired), warned."""
        data, token = self.store.read_with_token(self.key)
        if data is None:
            return None, None
        problem = check_lease(self.key, data, now=self.clock())
        if problem is not None:
            log.warning("%s: %s", self.cell, problem)
            return None, token
        return Lease.from_json(data, token), token

    def _write(self, token: str | None, expires: float) -> Lease | None:
        mine = Lease(cell=self.cell, holder=self.holder, expires=expires)
        if not self.store.put_if(self.key, mine.to_json(), token,
                                 content_type="application/json"):
            return None
        return mine

    def try_acquire(self) -> Lease | None:
        """Take the lease if it is free or expired: None on success, else the holder's lease."""
        current, token = self._read()
        if current is not None and current.holder != self.holder and \
                current.expires > self.clock():
            return current
        got = self._write(token, self.clock() + self.ttl)
        if got is None:  # someone else wrote in between: read who
            current, _ = self._read()
            return current if current is not None else self.try_acquire()
        self.held, self.lost = got, None
        return None

    def renew(self) -> bool:
        """Push the expiry out, only while the store still names this builder as the holder
        (a conditional write on what was just read); False when the lease was lost: taken
        over after it expired. A StoreError (the store unreachable) is raised: nothing is
        known then, and the caller tries again."""
        with self._writing:
            return self._renew()

    def _renew(self) -> bool:
        if self.held is None:
            return False
        current, token = self._read()
        if current is None or current.holder != self.holder:
            taker = current.holder if current is not None else "nobody (the lease is gone)"
            return self._lose(f"the store names {taker} as its holder")
        got = self._write(token, self.clock() + self.ttl)
        if got is None:  # written between our read and write: only a takeover does that
            current, _ = self._read()
            taker = current.holder if current is not None else "another builder"
            return self._lose(f"{taker} took it over during the renewal")
        self.held = got
        return True

    def _lose(self, why: str) -> bool:
        self.held = None
        self.lost = why
        return False

    def release(self) -> None:
        """Mark the lease expired, only if it is still ours."""
        with self._writing, contextlib.suppress(StoreError):
            if self.held is None:
                return
            current, token = self._read()
            if current is not None and current.holder == self.holder:
                self._write(token, 0.0)
        self.held = None


class Hold:
    """What ``hold_cell`` yields: true while this builder holds the cell's lease (build it),
    false when the cell is published (build nothing). ``check`` and ``confirm`` tell a build
    whether it may go on: once the lease is lost, it must not publish."""

    def __init__(self, lease: CellLease | None) -> None:
        self.lease = lease

    def __bool__(self) -> bool:
        return self.lease is not None

    def check(self) -> None:
        """Raise LeaseLost when the heartbeat found the lease lost (no store call)."""
        if self.lease is not None and self.lease.lost is not None:
            raise self._lost()

    def confirm(self) -> None:
        """Renew now, with a conditional write: the proof, right before publishing, that this
        builder still holds the lease (for another TTL). Raises LeaseLost when it does not."""
        self.check()
        if self.lease is not None and not self.lease.renew():
            raise self._lost()

    def _lost(self) -> LeaseLost:
        assert self.lease is not None
        minutes = self.lease.ttl / 60
        return LeaseLost(
            f"{self.lease.cell}: this builder lost the cell's lease ({self.lease.lost}); it was "
            f"paused or cut off from the store past the {minutes:g} min TTL, so another builder "
            "builds the cell now; not publishing",
        )


@contextlib.contextmanager
def hold_cell(store: LeaseStore, *, content_key: str, cell: str, published: Callable[[], bool],
              on_wait: Callable[[Lease], None] = lambda lease: None,
              ttl: float = LEASE_TTL_SECONDS, poll: float = POLL_SECONDS,
              holder: str | None = None) -> Iterator[Hold]:
    """Yield a true ``Hold`` while this builder holds the cell's lease (build it), or a false
    one when the cell is published (by another builder, before or while we waited): build
    nothing. Waits while another builder's lease is alive; takes it over once it expires. A
    heartbeat renews the lease every ttl/3 while the body runs; when a renewal finds the
    lease taken over, it says so in one line and the Hold fails its next ``check``."""
    lease = CellLease(store, content_key=content_key, cell=cell, ttl=ttl, holder=holder)
    while True:
        if published():
            yield Hold(None)
            return
        other = lease.try_acquire()
        if other is None:
            break
        on_wait(other)
        time.sleep(max(0.05, min(poll, other.expires - lease.clock() + 0.05)))
    if published():  # finished by the holder we just followed
        lease.release()
        yield Hold(None)
        return
    with renewing(lease):
        yield Hold(lease)


@contextlib.contextmanager
def renewing(lease: CellLease) -> Iterator[None]:
    """While the body runs, a heartbeat renews the held ``lease`` every ttl/3; released after
    (also when the body raises, or SIGTERM unwinds it)."""
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(lease.ttl / 3):
            try:
                if lease.renew():
                    continue
            except StoreError as exc:  # unreachable: nothing known; try again next beat
                log.warning("%s: lease renewal failed (%s); retrying in %.0f s", lease.cell,
                            exc.message, lease.ttl / 3)
                continue
            if not stop.is_set():
                log.warning("%s: lost this cell's lease (%s); the build stops before it "
                            "publishes", lease.cell, lease.lost)
            return

    beat = threading.Thread(target=heartbeat, daemon=True, name=f"lease-{lease.cell}")
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(timeout=5)
        lease.release()
