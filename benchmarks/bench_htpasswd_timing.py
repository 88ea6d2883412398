"""How long a refused read takes, per kind of user, against a real ``factory serve --read-auth``
whose htpasswd file mixes kinds of hash: can the time of a refusal tell which users exist?

    python benchmarks/bench_htpasswd_timing.py [--rounds 20] [--repo PATH]

The file holds a bcrypt cost-4 user, a bcrypt cost-10 user and a SHA-512 crypt (5000 rounds)
user. Each round sends, in a random order, one GET with a wrong password for each of them and
one for a user who does not exist (each on a new connection); the table gives the median and
spread of each over the rounds, and each median against the unknown user's. ``--repo`` serves
from another checkout of the factory (to measure the code before a change). Loopback only.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from factory.index.htpasswd import bcrypt_line, sha512_crypt  # noqa: E402

USERS = ("nobody", "cheap", "dear", "sha")


def _get(port: int, user: str) -> tuple[float, int]:
    token = base64.b64encode(f"{user}:wrong-password".encode()).decode()
    request = (f"GET /simple/ HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n"
               "Connection: close\r\n\r\n").encode()
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        head = sock.recv(64)
    return time.perf_counter() - started, int(head[9:12])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout that serves")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-htpasswd-") as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        htpasswd = work / "htpasswd"
        sha = sha512_crypt(b"right", "$6$rounds=5000$benchsaltbench")
        htpasswd.write_text(
            f"{bcrypt_line('cheap', 'right', cost=4)}\n{bcrypt_line('dear', 'right', cost=10)}\n"
            f"sha:{sha}\n"
        )
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(args.repo.resolve())}
        server = subprocess.Popen(
            [sys.executable, "-m", "factory", "serve", "--store", str(store), "--port",
             str(port), "--htpasswd", str(htpasswd), "--read-auth"],
            env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert server.stdout is not None
            first = server.stdout.readline()
            if not first.startswith("serving"):
                raise SystemExit(f"the server did not start: {first}{server.stderr.read()}")
            for user in USERS:  # warm up: connection setup, first hash of each kind
                _get(port, user)
            times: dict[str, list[float]] = {u: [] for u in USERS}
            rng = random.Random(1)
            for _ in range(args.rounds):
                order = list(USERS)
                rng.shuffle(order)
                for user in order:
                    seconds, status = _get(port, user)
                    assert status == 403, (user, status)
                    times[user].append(seconds)
        finally:
            server.terminate()
            server.wait(timeout=30)
    unknown = statistics.median(times["nobody"])
    print(f"{'user':<28} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs unknown':>11}")
    labels = {"nobody": "unknown user", "cheap": "bcrypt cost 4", "dear": "bcrypt cost 10",
              "sha": "SHA-512 crypt 5000 rounds"}
    for user in USERS:
        median = statistics.median(times[user])
        print(f"{labels[user]:<28} {median * 1000:>10.1f} {min(times[user]) * 1000:>8.1f} "
              f"{max(times[user]) * 1000:>8.1f} {median / unknown:>10.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
