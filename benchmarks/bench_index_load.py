"""Load on the served index: 200 concurrent resolver-style clients on loopback, while
publishers write.

    python benchmarks/bench_index_load.py [--clients 200] [--requests 10] [--variants 12]
        [--publishers 8]

One store holds ``--variants`` variants of two projects (small wheels: the load is in the
requests, not the bytes). ``factory serve`` and ``pypi-server run --disable-fallback`` (PyPI's
pypiserver, default server backend) serve the same wheel files, each as a subprocess. Each of
``--clients`` threads opens one keep-alive connection, waits at a barrier so that all start
together, and sends ``--requests`` requests of one mix:

* pages: the root page, a project page as HTML, the same page asking for PEP 691 JSON
  (pypiserver answers HTML to that: it has no JSON), in turn;
* metadata: what a resolver fetches per candidate after the page: the PEP 658 ``.metadata`` file
  from ours; from pypiserver, which has none, the wheel itself (what pip downloads there).

Per server and mix: requests, errors (anything but a 200, or no answer within 60 s), p50 and
p99 latency and throughput. Loopback only; bounded in count (clients x requests) and time.

While each load runs, ``--publishers`` threads publish new wheels of the served projects, one
after another, the way each server is published to: ``factory publish`` processes into the
store that ``factory serve`` serves (what CI does); for pypiserver, whose store is its package
directory, a copy into that directory (written to a temp name, then renamed). The row shows how
many were published while the load ran (the load starts after each publisher's first wheel).
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from index_wheels import variant_wheel  # noqa: E402

from factory.index.pages import JSON_TYPE  # noqa: E402
from factory.index.publish import publish  # noqa: E402
from factory.index.store import LocalStore  # noqa: E402

PROJECTS = ("flash-attn", "demo-ext")
MAX_EACH = 40  # wheels per publisher and load run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"server at {url} did not come up")


Request = tuple[str, dict[str, str]]  # path, headers


def run_load(port: int, requests: list[Request], clients: int, per_client: int) -> dict[str, float]:
    """``clients`` threads, one keep-alive connection each, ``per_client`` requests each."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine: list[float] = []
        bad: list[str] = []
        barrier.wait()
        for n in range(per_client):
            path, headers = requests[(i + n) % len(requests)]
            t0 = time.perf_counter()
            try:
                conn.request("GET", path, headers={"Connection": "keep-alive", **headers})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    bad.append(f"{response.status} {path}")
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()  # HTTP/1.0 servers: the next request reconnects
            except (OSError, http.client.HTTPException) as exc:
                bad.append(f"{type(exc).__name__} {path}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    latencies.sort()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": latencies[-1] * 1000,
        "rps": len(latencies) / wall,
        "first_error": errors[0] if errors else "",  # type: ignore[dict-item]
    }


class Publishers:
    """``count`` threads publishing fresh wheels until stopped; counts what they published."""

    serial = 0

    def __init__(self, count: int, tmp: Path, target: Path, ours: bool) -> None:
        self.count, self.tmp, self.target, self.ours = count, tmp, target, ours
        self.stop = threading.Event()
        self.published = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)
        ]
        self.at_start = 0

    def __enter__(self) -> Publishers:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 300  # the load starts once every publisher is writing
        while time.monotonic() < deadline and self.published + len(self.failed) < self.count:
            time.sleep(0.05)
        self.at_start = self.published
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _run(self, i: int) -> None:
        for _ in range(MAX_EACH):  # bounded: a slow server must not fill the disk meanwhile
            if self.stop.is_set():
                return
            with self.lock:
                Publishers.serial += 1  # across runs: a version is never published twice
                n = Publishers.serial
            source = self.tmp / f"pub-{i}-{n}"
            wheel = variant_wheel(source, PROJECTS[n % 2], f"9.{n}", "2.3", payload_bytes=64 << 10)
            if self.ours:
                result = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "factory",
                        "publish",
                        "--store",
                        str(self.target),
                        str(wheel),
                    ],
                    capture_output=True,
                    text=True,
                )
                ok, why = result.returncode == 0, result.stderr.strip()[-200:]
            else:
                temp = self.target / f".{wheel.name}.part"
                shutil.copyfile(wheel, temp)
                temp.rename(self.target / wheel.name)
                ok, why = True, ""
                time.sleep(0.2)  # about the pace of one `factory publish` on this machine
            shutil.rmtree(source, ignore_errors=True)
            with self.lock:
                if ok:
                    self.published += 1
                else:
                    self.failed.append(why)


def env_for(name: str, tmp: Path) -> dict[str, str]:
    """pypiserver imports passlib, whose bcrypt backend check fails with bcrypt 5 (which this
    project installs): give pypiserver's process a ``bcrypt`` that is absent, so passlib
    skips that backend (no htpasswd is used here)."""
    import os

    if name == "factory serve":
        return dict(os.environ)
    hide = tmp / "hide-bcrypt"
    hide.mkdir(exist_ok=True)
    (hide / "bcrypt.py").write_text("raise ImportError('hidden from pypiserver')\n")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]),
    }


def mixes(wheels: list[Path], ours: bool) -> dict[str, list[Request]]:
    html = {"Accept": "text/html"}
    json_ = {"Accept": f"{JSON_TYPE}, text/html;q=0.1"}
    pages: list[Request] = [("/simple/", html)]
    files: list[Request] = []
    for project in PROJECTS:
        pages += [(f"/simple/{project}/", html), (f"/simple/{project}/", json_)]
    for w in wheels:
        project = w.name.split("-")[0].replace("_", "-")
        if ours:
            files.append((f"/files/{project}/{quote(w.name)}.metadata", {}))
        else:
            files.append((f"/packages/{quote(w.name)}", {}))
    return {"pages": pages, "metadata": files}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10, help="per client and mix")
    parser.add_argument("--variants", type=int, default=12)
    parser.add_argument("--publishers", type=int, default=8, help="publishing during the load")
    args = parser.parse_args()
    pypi_server = shutil.which("pypi-server")
    if pypi_server is None:
        raise SystemExit("pypi-server not found: pip install -e '.[bench]'")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp_name:
        tmp = Path(tmp_name)
        minors = [f"2.{m}" for m in range(3, 3 + args.variants)]
        wheels = [
            variant_wheel(tmp / "wheels", project, "1.0", t, payload_bytes=64 << 10)
            for project in PROJECTS
            for t in minors
        ]
        publish(LocalStore(tmp / "store"), wheels)
        ours_port, theirs_port = free_port(), free_port()
        commands = {
            "factory serve": (
                [
                    sys.executable,
                    "-m",
                    "factory",
                    "serve",
                    "--store",
                    str(tmp / "store"),
                    "--port",
                    str(ours_port),
                ],
                ours_port,
            ),
            "pypiserver --disable-fallback": (
                [
                    pypi_server,
                    "run",
                    "-p",
                    str(theirs_port),
                    "-i",
                    "127.0.0.1",
                    "--disable-fallback",
                    str(tmp / "wheels"),
                ],
                theirs_port,
            ),
        }
        rows: list[tuple[str, str, dict[str, float]]] = []
        for name, (cmd, port) in commands.items():
            ours = name == "factory serve"
            proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(name, tmp)
            )
            try:
                wait_up(f"http://127.0.0.1:{port}/simple/")
                for mix, reqs in mixes(wheels, ours=ours).items():
                    target = tmp / "store" if ours else tmp / "wheels"
                    with Publishers(args.publishers, tmp / "pub", target, ours) as pubs:
                        r = run_load(port, reqs, args.clients, args.requests)
                    r["published"] = pubs.published - pubs.at_start  # during the load
                    r["publish_failures"] = len(pubs.failed)
                    r["first_publish_failure"] = pubs.failed[0] if pubs.failed else ""  # type: ignore[assignment]
                    rows.append((name, mix, r))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(
        f"{args.clients} concurrent clients x {args.requests} requests each, per server and mix,"
        f" while {args.publishers} publishers write"
    )
    print()
    print(
        "| server                        | mix      | requests | errors | p50 ms | p99 ms "
        "| max ms | req/s | published |"
    )
    print(
        "|-------------------------------|----------|---------:|-------:|-------:|-------:"
        "|-------:|------:|----------:|"
    )
    fmt: Callable[[float], str] = lambda v: f"{v:6.1f}"  # noqa: E731
    for name, mix, r in rows:
        failures = f" ({int(r['publish_failures'])} failed)" if r["publish_failures"] else ""
        print(
            f"| {name:29} | {mix:8} | {int(r['requests']):8d} | {int(r['errors']):6d} "
            f"| {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {r['max_ms']:6.0f} | {r['rps']:5.0f} "
            f"| {int(r['published'])}{failures} |"
        )
    for name, mix, r in rows:
        if r["errors"]:
            print(f"{name} {mix}: first error: {r['first_error']}")
        if r["publish_failures"]:
            print(f"{name} {mix}: first publish failure: {r['first_publish_failure']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
