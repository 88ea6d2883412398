"""How long a refused read takes, per kind of user, against a real ``factory serve --read-auth``
whose htpasswd file mixes kinds of hash: can the time of a refusal tell which users exist?

    python benchmarks/bench_htpasswd_timing.py [--rounds 20] [--repo PATH]

The file holds a bcrypt cost-4 user, a bcrypt cost-10 user and a SHA-512 crypt (5000 rounds)
user. Each round sends, in a random order, one GET with a wrong password for each of them and
one for a user who does not exist (each on a new connection); the table gives the median and
spread of each over the rounds, each median against the unknown user's, and "paired": the
median of each round's time against the unknown user's in that round. ``--repo`` serves
from another checkout of the factory (to measure the code before a change). Loopback only.
The measuring is tests/htpasswd_timing.py's, which the integration test asserts on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from htpasswd_timing import (  # noqa: E402
    LABELS,
    USERS,
    paired_medians,
    read_auth_server,
    refusal_times,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout that serves")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-htpasswd-") as tmp, \
            read_auth_server(Path(tmp), args.repo) as port:
        times = refusal_times(port, args.rounds)
    unknown = statistics.median(times["nobody"])
    paired = paired_medians(times)
    print(f"{'user':<28} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs unknown':>11} "
          f"{'paired':>7}")
    for user in USERS:
        median = statistics.median(times[user])
        ratio = paired.get((user, "nobody"), 1.0)
        print(f"{LABELS[user]:<28} {median * 1000:>10.1f} {min(times[user]) * 1000:>8.1f} "
              f"{max(times[user]) * 1000:>8.1f} {median / unknown:>10.2f}x {ratio:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
