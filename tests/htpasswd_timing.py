"""How long a refused read takes, per kind of user, against a real ``factory serve --read-auth``
whose htpasswd file mixes kinds of hash: can the time of a refusal tell which users exist?
Shared by the integration test (tests/integration/test_htpasswd_timing.py, which asserts the
medians agree) and benchmarks/bench_htpasswd_timing.py (which prints them).

The file holds a bcrypt cost-4 user, a bcrypt cost-10 user and a SHA-512 crypt (5000 rounds)
user. Each round sends, in a random order, one GET with a wrong password for each of them and
one for a user who does not exist, each on a new connection: the rounds interleave the kinds,
so a machine whose load changes slows them all alike. ``paired_medians`` compares two users
round by round: on the 2-core builder at a load average of 5, the plain medians of 25 rounds
came out up to 8 % apart from run to run, the paired ones within 3 %.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from factory.index.htpasswd import bcrypt_line, sha512_crypt

REPO = Path(__file__).resolve().parent.parent
USERS = ("nobody", "cheap", "dear", "sha")
LABELS = {"nobody": "unknown user", "cheap": "bcrypt cost 4", "dear": "bcrypt cost 10",
          "sha": "SHA-512 crypt 5000 rounds"}


def write_mixed_htpasswd(path: Path) -> Path:
    """The three known users, each with a kind of hash of its own ('nobody' is not there)."""
    sha = sha512_crypt(b"right", "$6$rounds=5000$benchsaltbench")
    path.write_text(
        f"{bcrypt_line('cheap', 'right', cost=4)}\n{bcrypt_line('dear', 'right', cost=10)}\n"
        f"sha:{sha}\n"
    )
    return path


@contextlib.contextmanager
def read_auth_server(work: Path, repo: Path = REPO) -> Iterator[int]:
    """`factory serve --read-auth` from the checkout ``repo`` over an empty store with the
    mixed htpasswd file; yields its port. Its log goes to ``work/serve.log``."""
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    htpasswd = write_mixed_htpasswd(work / "htpasswd")
    env = {**os.environ, "PYTHONPATH": str(repo.resolve())}
    with (work / "serve.log").open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "factory", "serve", "--store", str(store), "--port", "0",
             "--htpasswd", str(htpasswd), "--read-auth"],
            env=env, cwd=work, stdout=subprocess.PIPE, stderr=log, text=True,
        )
        try:
            assert server.stdout is not None
            first = server.stdout.readline()
            match = re.search(r" at https?://[^/]+:(\d+)/simple/", first)
            if match is None:
                raise RuntimeError(f"the server did not start: {first!r}; see {work}/serve.log")
            yield int(match.group(1))
        finally:
            server.terminate()
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()


def refusal(port: int, user: str) -> tuple[float, int]:
    """Seconds from connecting to the status line of a GET with a wrong password, and the
    status."""
    token = base64.b64encode(f"{user}:wrong-password".encode()).decode()
    request = (f"GET /simple/ HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n"
               "Connection: close\r\n\r\n").encode()
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        head = sock.recv(64)
    return time.perf_counter() - started, int(head[9:12])


def refusal_times(port: int, rounds: int, seed: int = 1) -> dict[str, list[float]]:
    """``rounds`` refusals of each user, the users in a new random order each round (after
    one unmeasured round: connection setup, the first hash of each kind)."""
    for user in USERS:
        refusal(port, user)
    times: dict[str, list[float]] = {u: [] for u in USERS}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(USERS)
        rng.shuffle(order)
        for user in order:
            seconds, status = refusal(port, user)
            if status != 403:
                raise AssertionError(f"{user}: {status}, not 403")
            times[user].append(seconds)
    return times


def paired_medians(times: dict[str, list[float]]) -> dict[tuple[str, str], float]:
    """For each user ``a`` and each other ``b``, the median over the rounds of ``a``'s refusal
    time over ``b``'s in the same round."""
    return {
        (a, b): statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
        for a in USERS for b in USERS if a != b
    }
