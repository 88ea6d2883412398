"""The index server's limits as pure logic: Range numbers bounded before they are parsed,
PEP 691's ``+`` in ``?format=``, the connection cap shared by worker processes, the minimum
rate, one log line per slow peer, and slow heads that give their slots to new connections
across workers and handler threads. (tests/integration/test_server_faults.py drives the real
server.)"""

from __future__ import annotations

import os
import socket

from factory.index.server import ConnectionSlots, SlowClients, negotiate, parse_range
from factory.index.server_slots import HandedHeads
from factory.index.server_loop import too_slow


def test_range_numbers_of_any_length() -> None:
    huge = "9" * 5000
    assert parse_range(f"bytes={huge}-", 100) is False  # starts past the end: 416
    assert parse_range(f"bytes=0-{huge}", 100) == (0, 99)  # to the end
    assert parse_range(f"bytes=-{huge}", 100) == (0, 99)  # the last 'huge' bytes: all of it
    assert parse_range(f"bytes={'0' * 5000}5-9", 100) == (5, 9)  # leading zeros are zeros
    assert parse_range("bytes=10-5", 100) is False and parse_range("bytes=-0", 100) is False


def test_format_with_a_literal_plus() -> None:
    # '?format=application/vnd.pypi.simple.v1+json' reaches negotiate with a space for '+'
    assert negotiate(None, "application/vnd.pypi.simple.v1 json") == "json"
    assert negotiate(None, "application/vnd.pypi.simple.v1+json") == "json"
    assert negotiate(None, "text/html") == "html" and negotiate(None, "text/plain") is None


def test_one_process_cap() -> None:
    slots = ConnectionSlots(2)
    assert slots.take() and slots.take() and not slots.take()
    slots.give()
    assert slots.take() and not slots.take()  # the slot given back, and only that one


def test_the_cap_shared_by_forked_workers() -> None:
    slots = ConnectionSlots(3)
    slots.share(2)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # worker 1 takes two slots, then reports what it saw
        slots.become(1)
        ok = slots.take() and slots.take()
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert slots.take() and not slots.take()  # the whole server's third, then the cap
    slots.forget(1)  # the worker ended: its connections went with it
    assert slots.take() and slots.take() and not slots.take()  # its two back, not more


def test_minimum_rate_after_the_grace() -> None:
    assert not too_slow(5.0, 0, 1000.0, 10.0)  # within the grace: anything goes
    assert too_slow(11.0, 10_000, 1000.0, 10.0)  # 909 bytes/s on average
    assert not too_slow(11.0, 11_000, 1000.0, 10.0)


def test_a_slow_peer_is_logged_once() -> None:
    slow = SlowClients(quiet=600.0, limit=3)
    assert slow.first("10.0.0.1") and not slow.first("10.0.0.1")
    assert slow.first("10.0.0.2")
    assert SlowClients(quiet=0.0).first("x")


def test_a_slow_head_of_another_worker_gives_its_slot() -> None:
    """Worker 1 holds every slot, two of them slow heads: worker 0 claims both (the slots
    move at once), and worker 1 then owes two drops. One of the two had closed on its own
    meanwhile (its slot given back as always): one drop, one claim repaid, and the tally is
    what is open."""
    slots = ConnectionSlots(3)
    slots.share(2)
    slots.become(1)  # (one process playing both workers: the counts are shared memory)
    assert slots.take() and slots.take() and slots.take()
    slots.offer(2)
    slots.become(0)
    assert not slots.take()
    assert slots.claim() and slots.claim() and not slots.claim()  # two offered, two taken
    assert slots.in_use() == 3
    slots.become(1)
    assert slots.owed() == 2 and slots.owed() == 0
    slots.give()  # the one that closed on its own
    slots.repay(1)  # not there to drop; the other is dropped without giving its slot back
    assert slots.in_use() == 3  # worker 0's two new connections and worker 1's third
    slots.give()
    assert slots.in_use() == 2
    slots.offer(1)
    slots.forget(1)  # worker 1 ended: nothing of it is left to claim
    slots.become(0)
    assert not slots.claim() and slots.in_use() == 2


def test_one_process_offers_nothing() -> None:
    slots = ConnectionSlots(1)
    slots.offer(5)
    assert slots.take() and not slots.take() and not slots.claim() and slots.owed() == 0


def test_a_head_read_by_a_handler_thread_can_be_dropped_until_it_is_whole() -> None:
    heads = HandedHeads()
    a, peer_a = socket.socketpair()
    b, peer_b = socket.socketpair()
    with a, b, peer_a, peer_b:
        heads.begin(a, 10.0)
        heads.begin(b, 20.0)
        assert heads.slow(15.0) == [(10.0, a)]
        assert heads.end(b)  # whole: no longer droppable
        assert heads.slow(100.0) == [(10.0, a)] and not heads.drop(b)
        assert heads.drop(a) and heads.dropped(a)
        assert peer_a.recv(1) == b""  # shut down: the thread's read wakes
        assert not heads.end(a)  # its thread learns it was dropped
        assert heads.forget(a) and not heads.forget(b)  # a's slot went elsewhere, b's not
