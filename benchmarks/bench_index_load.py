"""Load on the served index: 200 concurrent resolver-style clients on loopback.

    python benchmarks/bench_index_load.py [--clients 200] [--requests 10] [--variants 12]

One store holds ``--variants`` variants of two projects (small wheels: the load is in the
requests, not the bytes). ``factory serve`` and ``pypi-server run --disable-fallback`` (PyPI's
pypiserver, default server backend) serve the same wheel files, each as a subprocess. Each of
``--clients`` threads opens one keep-alive connection, waits at a barrier so that all start
together, and sends ``--requests`` requests of one mix:

* pages: the root page, a project page as HTML, the same page asking for PEP 691 JSON
  (pypiserver answers HTML to that: it has no JSON), in turn;
* metadata: what a resolver fetches per candidate after the page: the PEP 658 ``.metadata`` file
  from ours; from pypiserver, which has none, the wheel itself (what pip downloads there);
* revalidate: the pages again with the ``If-None-Match`` validator each server gave for them
  (what pip's and uv's HTTP caches send once a page's max-age has passed): a 304 counts as an
  answer, as does a 200 from a server without validators.

Every request says ``Accept-Encoding: gzip, deflate``, as pip and uv do.

Per server and mix: requests, errors (anything but a 200, or no answer within 60 s), p50 and
p99 latency and throughput. Loopback only; bounded in count (clients x requests) and time.
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
# pypiserver imports passlib when it is installed, and passlib 1.7 fails its bcrypt self-test with
# bcrypt >= 5 (FIELD-NOTES section 9), so pypiserver would not start. It treats passlib as
# optional; a read-only benchmark needs no auth, so run it as if passlib were absent.
PYPISERVER_WITHOUT_PASSLIB = (
    "import sys; sys.modules['passlib'] = None; sys.argv[0] = 'pypi-server'; "
    "from pypiserver.__main__ import main; sys.exit(main())"
)


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
ACCEPT_ENCODING = {"Accept-Encoding": "gzip, deflate"}  # what pip (requests) and uv send


def run_load(port: int, requests: list[Request], clients: int, per_client: int) -> dict[str, float]:
    """``clients`` threads, one keep-alive connection each, ``per_client`` requests each."""
    latencies: list[float] = []
    errors: list[str] = []
    not_modified = [0]
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
                conn.request(
                    "GET", path, headers={"Connection": "keep-alive", **ACCEPT_ENCODING, **headers}
                )
                response = conn.getresponse()
                response.read()
                if response.status not in (200, 304):
                    bad.append(f"{response.status} {path}")
                elif response.status == 304:
                    with lock:
                        not_modified[0] += 1
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
        "not_modified": not_modified[0],
        "p50_ms": q[49] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": latencies[-1] * 1000,
        "rps": len(latencies) / wall,
        "first_error": errors[0] if errors else "",  # type: ignore[dict-item]
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


def with_validators(port: int, pages: list[Request]) -> list[Request]:
    """The same page requests, each with the ETag the server sent for it (if any)."""
    out: list[Request] = []
    for path, headers in pages:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", path, headers={**ACCEPT_ENCODING, **headers})
        response = conn.getresponse()
        response.read()
        etag = response.getheader("ETag")
        conn.close()
        out.append((path, {**headers, **({"If-None-Match": etag} if etag else {})}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10, help="per client and mix")
    parser.add_argument("--variants", type=int, default=12)
    args = parser.parse_args()
    pypi_server = shutil.which("pypi-server")
    if pypi_server is None:
        raise SystemExit("pypi-server not found: pip install 'pypiserver>=2.4'")
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
                [sys.executable, "-m", "factory", "serve", "--store", str(tmp / "store"),
                 "--port", str(ours_port)],
                ours_port,
            ),
            "pypiserver --disable-fallback": (
                [sys.executable, "-c", PYPISERVER_WITHOUT_PASSLIB, "run", "-p", str(theirs_port),
                 "-i", "127.0.0.1", "--disable-fallback", str(tmp / "wheels")],
                theirs_port,
            ),
        }
        rows: list[tuple[str, str, dict[str, float]]] = []
        for name, (cmd, port) in commands.items():
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_up(f"http://127.0.0.1:{port}/simple/")
                todo = mixes(wheels, ours=name == "factory serve")
                todo["revalidate"] = with_validators(port, todo["pages"])
                for mix, reqs in todo.items():
                    rows.append((name, mix, run_load(port, reqs, args.clients, args.requests)))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"{args.clients} concurrent clients x {args.requests} requests each, per server and mix")
    print()
    print("| server                        | mix        | requests | 304s | errors | p50 ms "
          "| p99 ms | max ms | req/s |")
    print("|-------------------------------|------------|---------:|-----:|-------:|-------:"
          "|-------:|-------:|------:|")
    fmt: Callable[[float], str] = lambda v: f"{v:6.1f}"  # noqa: E731
    for name, mix, r in rows:
        print(f"| {name:29} | {mix:10} | {int(r['requests']):8d} | {int(r['not_modified']):4d} "
              f"| {int(r['errors']):6d} "
              f"| {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {r['max_ms']:6.0f} | {r['rps']:5.0f} |")
    for name, mix, r in rows:
        if r["errors"]:
            print(f"{name} {mix}: first error: {r['first_error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
