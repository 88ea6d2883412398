"""Refusal time does not tell which users exist, whatever kinds of hash the htpasswd file mixes:
against a real `factory serve --read-auth` whose file holds a bcrypt cost-4, a bcrypt cost-10
and a SHA-512 crypt user, a wrong password for each of them and for a user who does not exist
is refused in the same time, within 10 %. (With a dummy hash that imitated only the costliest
entry, the cost-4 and SHA-512 users were refused in 1-2 ms and the others in ~50 ms:
docs/BENCHMARKS.md, "Refusal time per kind of user".) The measuring is shared with
benchmarks/bench_htpasswd_timing.py.

128 refusals of 50-150 ms each (8-20 s). Each round asks for the four users in a random
order and the medians compared are of each two users' times in the same round, so a shared
machine whose load changes from second to second slows both sides of every comparison alike
(tests/htpasswd_timing.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

from htpasswd_timing import LABELS, USERS, paired_medians, read_auth_server, refusal_times

ROUNDS = 32


def test_refusals_take_as_long_for_every_kind_of_user(tmp_path: Path) -> None:
    with read_auth_server(tmp_path) as port:
        times = refusal_times(port, ROUNDS)
    shown = ", ".join(f"{LABELS[u]} {statistics.median(times[u]) * 1000:.1f} ms" for u in USERS)
    for (a, b), ratio in paired_medians(times).items():
        assert 1 / 1.10 <= ratio <= 1.10, f"{LABELS[a]} / {LABELS[b]}: {ratio:.2f} ({shown})"
