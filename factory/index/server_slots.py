"""The index server's connection slots: the cap for the whole server, which request heads may
lose their slot to a new connection, and slow clients logged once per peer.

A connection whose request head is still arriving more than ``SLOW_HEAD`` seconds after it
began (a real client sends its head in one packet) can always be dropped for a new connection
when every slot is taken, wherever it is read: in the read loop, in a handler thread
(``HandedHeads``: HTTP/1.0, uploads, anything handed over before its head was whole), or in
another ``--workers`` process (``ConnectionSlots.claim``: the slot moves at once, the other
worker drops its oldest slow head the next time round its loop, within half a second). Before,
20 slow heads of HTTP/1.0 or POST requests held all of ``--max-connections 20`` until their
20 s head limit, and an attacker reconnecting every 20 s locked everyone out for good.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import threading
import time
from typing import Any

SLOW_HEAD = 1.0  # a head still arriving after this long may lose its slot to a new connection
MADE_ROOM = "request head still arriving while every slot was taken"  # what the log says


class ConnectionSlots:
    """The connection cap: in one process, or for the whole server when ``share`` made the
    count one that every worker process sees (each worker keeps its own tally in shared
    memory; a slot is taken while the sum is under the cap). Fixed shares per worker refused
    connections well below the cap whenever the kernel gave one worker more than its share.

    Beside each worker's tally, shared too: how many of its heads are slow (``offer``) and how
    many of those other workers have claimed (``claim``) and it has still to drop (``owed``)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._mine = 0
        self._shared: Any = None  # multiprocessing Array: tallies, slow heads, owed drops
        self._workers = 1
        self._index = 0

    @property
    def shared(self) -> bool:
        return self._shared is not None

    def share(self, workers: int) -> None:
        """Before forking ``workers`` processes (the first is index 0)."""
        self._shared = multiprocessing.get_context("fork").Array("q", 3 * workers)
        self._workers = workers

    def become(self, index: int) -> None:
        """In a forked worker: count this process's connections under ``index``."""
        self._index = index
        self._lock = threading.Lock()

    def forget(self, index: int) -> None:
        """A worker ended: its connections went with it."""
        if self._shared is not None:
            with self._shared.get_lock():
                counts = self._shared.get_obj()
                for part in range(3):
                    counts[part * self._workers + index] = 0

    def take(self) -> bool:
        with self._lock:
            if self._shared is None:
                if self._mine >= self.cap:
                    return False
                self._mine += 1
                return True
            with self._shared.get_lock():
                counts = self._shared.get_obj()
                if sum(counts[: self._workers]) >= self.cap:
                    return False
                counts[self._index] += 1
                return True

    def give(self) -> None:
        with self._lock:
            if self._shared is None:
                self._mine = max(0, self._mine - 1)
                return
            with self._shared.get_lock():
                # no floor at 0: a claimed head that closed on its own is given back here
                # and repaid (``repay``), and the two must add up
                self._shared.get_obj()[self._index] -= 1

    def in_use(self) -> int:
        if self._shared is None:
            return self._mine
        with self._shared.get_lock():
            return int(sum(self._shared.get_obj()[: self._workers]))

    # -- slow heads across workers ---------------------------------------------------------
    def offer(self, slow: int) -> None:
        """This worker has ``slow`` heads over SLOW_HEAD that another worker may claim."""
        if self._shared is None:
            return
        w, i = self._workers, self._index
        with self._shared.get_lock():
            counts = self._shared.get_obj()
            counts[w + i] = max(0, slow - counts[2 * w + i])

    def claim(self) -> bool:
        """Every slot is taken and this worker has no slow head of its own: take the slot of
        another worker's slow head (its tally down, this one's up); that worker drops the
        head when it next looks (``owed``). False when no worker offers one."""
        if self._shared is None:
            return False
        w, me = self._workers, self._index
        with self._lock, self._shared.get_lock():
            counts = self._shared.get_obj()
            for i in range(w):
                if i != me and counts[w + i] > 0:
                    counts[w + i] -= 1
                    counts[2 * w + i] += 1
                    counts[i] -= 1
                    counts[me] += 1
                    return True
        return False

    def owed(self) -> int:
        """How many slow heads other workers claimed from this one since it last asked (their
        slots are theirs already: drop that many without giving slots back)."""
        if self._shared is None:
            return 0
        at = 2 * self._workers + self._index
        if not self._shared.get_obj()[at]:  # the common case, without the lock
            return 0
        with self._shared.get_lock():
            counts = self._shared.get_obj()
            owed, counts[at] = int(counts[at]), 0
            return owed

    def repay(self, count: int) -> None:
        """``count`` claimed heads were gone or no longer slow when this worker looked: their
        connections count here again (a closed one was given back already)."""
        if self._shared is not None and count > 0:
            with self._lock, self._shared.get_lock():
                self._shared.get_obj()[self._index] += count


class HandedHeads:
    """Request heads a handler thread is reading (the loop handed the connection over before
    its head was whole, or it is the next request of a handed-over connection): when they
    began, so the loop can drop the one arriving longest as it drops its own. Dropping shuts
    the socket down, which wakes the thread's read; its reader then sees ``dropped`` and ends
    the connection, and the thread keeps the slot it would give back (it went to the new
    connection)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # -> when its head began
        self._dropped: set[socket.socket] = set()

    def begin(self, sock: socket.socket, since: float) -> None:
        with self._lock:
            if sock not in self._dropped:
                self._reading[sock] = since

    def end(self, sock: socket.socket) -> bool:
        """The head is whole: no longer droppable. False when it was dropped first."""
        with self._lock:
            self._reading.pop(sock, None)
            return sock not in self._dropped

    def dropped(self, sock: socket.socket) -> bool:
        return sock in self._dropped

    def slow(self, before: float) -> list[tuple[float, socket.socket]]:
        """The heads that began before ``before``, and when."""
        with self._lock:
            return [(since, sock) for sock, since in self._reading.items() if since < before]

    def drop(self, sock: socket.socket) -> bool:
        """Drop one head (its slot is the caller's now); False when it is whole by now."""
        with self._lock:
            if self._reading.pop(sock, None) is None:
                return False
            self._dropped.add(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        return True

    def forget(self, sock: socket.socket) -> bool:
        """The connection ended: True when it had been dropped (its slot went elsewhere)."""
        with self._lock:
            self._reading.pop(sock, None)
            if sock in self._dropped:
                self._dropped.discard(sock)
                return True
            return False


class SlowClients:
    """Slow clients are logged once per peer (a peer opening 500 slow connections is one
    line), again only after ``quiet`` seconds; the set of peers is bounded."""

    def __init__(self, quiet: float = 600.0, limit: int = 4096) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._quiet, self._limit = quiet, limit

    def first(self, peer: str) -> bool:
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(peer)
            if seen is not None and now - seen < self._quiet:
                return False
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen[peer] = now
            return True
