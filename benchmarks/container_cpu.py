"""The CPU seconds a build container used, read from its cgroup until it is gone.

A container's processes are not children of `factory build` (docker starts them), so
`/usr/bin/time` around the factory sees none of the compile. This polls the container's
cgroup (v1 ``cpuacct.usage``/``cpuacct.stat``, v2 ``cpu.stat``) every few seconds and writes
the last reading as JSON when the container goes away (or on Ctrl-C):

    python benchmarks/container_cpu.py NAME-PREFIX --out cpu.json [--interval 5]

NAME-PREFIX: the start of the container's name (`factory-build-<cell id>`, cut at 63
characters); the first container whose name starts with it is followed, waiting for one to
appear.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _container(prefix: str) -> str | None:
    out = subprocess.run(["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        cid, _, name = line.partition(" ")
        if name.startswith(prefix):
            return cid
    return None


def reading(cid: str) -> dict[str, float] | None:
    """CPU seconds (user, system, total) of the container's cgroup, v1 or v2; None: gone."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}")
    v2 = next(iter(Path("/sys/fs/cgroup").glob(f"**/docker-{cid}.scope")), None) \
        if not v1.exists() else None
    try:
        if v1.exists():
            ticks = dict(line.split() for line in (v1 / "cpuacct.stat").read_text().splitlines())
            hz = 100.0  # USER_HZ
            return {"user": int(ticks["user"]) / hz, "system": int(ticks["system"]) / hz,
                    "total": int((v1 / "cpuacct.usage").read_text()) / 1e9}
        if v2 is not None:
            stat = dict(line.split() for line in (v2 / "cpu.stat").read_text().splitlines())
            return {"user": int(stat["user_usec"]) / 1e6, "system": int(stat["system_usec"]) / 1e6,
                    "total": int(stat["usage_usec"]) / 1e6}
    except (OSError, KeyError, ValueError):
        return None
    return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args(argv)
    cid = None
    while cid is None:
        cid = _container(args.prefix)
        if cid is None:
            time.sleep(args.interval)
    first = time.time()
    last: dict[str, float] | None = None
    try:
        while (now := reading(cid)) is not None:
            last = now
            args.out.write_text(json.dumps({"container": cid, "first_seen": first,
                                            "last_seen": time.time(), "cpu_seconds": last}))
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    print(json.dumps({"container": cid, "cpu_seconds": last}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
