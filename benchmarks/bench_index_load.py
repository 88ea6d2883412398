"""Load on the served index: 200 concurrent resolver-style clients on loopback, while
publishers write.

    python benchmarks/bench_index_load.py [--clients 200] [--requests 10] [--variants 12]
        [--publishers 8] [--client threads|loop] [--pin] [--servers factory,pypiserver]
        [--workers 1] [--same-session]

One store holds ``--variants`` variants of two projects (small wheels: the load is in the
requests, not the bytes). ``factory serve`` and ``pypi-server run --disable-fallback`` (PyPI's
pypiserver, default server backend) serve the same wheel files, each as a subprocess. Each of
``--clients`` threads opens one keep-alive connection, waits at a barrier so that all start
together, and sends ``--requests`` requests of one mix:

* pages: the root page, a project page as HTML, the same page asking for PEP 691 JSON
  (pypiserver answers HTML to that: it has no JSON), in turn;
* metadata: what a resolver fetches per candidate after the page: the PEP 658 ``.metadata`` file
  from ours; from pypiserver, which has none, the wheel itself (what pip downloads there);
* downloads: the wheels themselves (64 KB each, or ``--wheel-size``), from both.

Per server and mix: requests, errors (anything but a 200, or no answer within 60 s), p50, p95
and p99 latency, throughput, the server's CPU time per request (all its threads, from /proc:
the one figure the other load on the machine barely moves) and the load average when the mix
ended. Loopback only; bounded in count (clients x requests) and time.

The client is in the same process and on the same cores as the publishers, and, on a small
machine, as the server: a latency includes the wait of the client thread for its own process's
GIL and for a core. ``--client loop`` keeps the same number of connections (one per client,
each with one request outstanding) but drives them all from one thread with non-blocking
sockets, so 200 client threads no longer compete with the server for the cores. ``--pin`` runs
the server on the last CPU and everything else (clients, publishers) on the others, as when the
clients and the CI jobs that publish are other machines.

Each server runs in a session of its own, as a service manager or a terminal starts one: with
the kernel's autogroup scheduling (Debian's default), CPU is shared between sessions first, so a
server in this process's session (``--same-session``, how this benchmark ran until 2026-12-01)
competes thread for thread with the 200 client threads and the publishers.

While each load runs, ``--publishers`` threads publish new wheels of the served projects, one
after another, the way each server is published to: ``factory publish`` processes into the
store that ``factory serve`` serves (what CI does); for pypiserver, whose store is its package
directory, a copy into that directory (written to a temp name, then renamed). The row shows how
many were published while the load ran (the load starts after each publisher's first wheel).
"""

from __future__ import annotations

import argparse
import http.client
import os
import selectors
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
from factory.store import LocalStore  # noqa: E402
from factory.units import parse_size  # noqa: E402

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
    return summary(latencies, errors, time.perf_counter() - started)


def summary(latencies: list[float], errors: list[str], wall: float) -> dict[str, float]:
    latencies.sort()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": q[49] * 1000,
        "p95_ms": q[94] * 1000,
        "p99_ms": q[98] * 1000,
        "max_ms": latencies[-1] * 1000,
        "rps": len(latencies) / wall,
        "load": os.getloadavg()[0],
        "first_error": errors[0] if errors else "",  # type: ignore[dict-item]
    }


CONNECT_TIMEOUT = 10  # seconds; a server whose accept queue is full leaves a connect hanging


class _LoopClient:
    """One connection of ``run_load_loop``: a request out, its answer read, the next."""

    def __init__(self, port: int, index: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.index, self.sent, self.buf, self.t0 = index, 0, b"", 0.0
        self.status: tuple[int, bool] | None = None  # the answer's, once its head is in
        self.left = 0  # body bytes still to come (counted, not kept: wheels can be big)

    def send(self, request: Request) -> None:
        path, headers = request
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.setblocking(True)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n{lines}\r\n".encode())
        self.sock.setblocking(False)
        self.t0 = time.perf_counter()
        self.sent += 1
        self.buf, self.status, self.left = b"", None, 0

    def feed(self, data: bytes) -> tuple[int, bool] | None:
        """(status, the server closes) once the whole answer is in, else None."""
        if self.status is not None:
            self.left -= len(data)
            return self.status if self.left <= 0 else None
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buf[:end].decode("latin-1").lower().split("\r\n")
        fields = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        self.status = int(head[0].split()[1]), fields.get("connection") == "close"
        self.left = end + 4 + int(fields.get("content-length", "0")) - len(self.buf)
        self.buf = b""
        return self.status if self.left <= 0 else None


def run_load_loop(
    port: int, requests: list[Request], clients: int, per_client: int
) -> dict[str, float]:
    """As ``run_load`` (``clients`` keep-alive connections, one request outstanding on each),
    driven from one thread with non-blocking sockets instead of one thread per client."""
    sel = selectors.DefaultSelector()
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    conns: list[_LoopClient] = []
    for i in range(clients):
        try:
            conns.append(_LoopClient(port, i))
        except OSError as exc:
            # the server accepts no more (pypiserver's accept queue): every request of this and
            # the remaining clients is an error, without waiting out one timeout per client
            errors.extend([f"connect: {type(exc).__name__}"] * per_client * (clients - i))
            break
    for c in conns:
        c.send(requests[c.index % len(requests)])
        sel.register(c.sock, selectors.EVENT_READ, c)
    left = len(conns)
    while left:
        ready = sel.select(timeout=60)
        if not ready:
            errors.extend(["TimeoutError"] * left)
            break
        for key, _ in ready:
            c = key.data
            try:
                data = c.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError as exc:
                data = b""
                errors.append(type(exc).__name__)
            got = c.feed(data) if data else (0, True)
            if got is None:
                continue
            latencies.append(time.perf_counter() - c.t0)
            status, closing = got
            if status != 200:
                errors.append(f"{status} {requests[(c.index + c.sent - 1) % len(requests)][0]}")
            if c.sent == per_client or closing:
                sel.unregister(c.sock)
                c.sock.close()
                left -= 1
                continue
            c.send(requests[(c.index + c.sent) % len(requests)])
    return summary(latencies, errors, time.perf_counter() - started)


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU so far of a process and its children (the server's workers; Linux),
    0 where /proc is absent."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(int(child)) for child in children)


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
    downloads: list[Request] = []
    for project in PROJECTS:
        pages += [(f"/simple/{project}/", html), (f"/simple/{project}/", json_)]
    for w in wheels:
        project = w.name.split("-")[0].replace("_", "-")
        if ours:
            files.append((f"/files/{project}/{quote(w.name)}.metadata", {}))
            downloads.append((f"/files/{project}/{quote(w.name)}", {}))
        else:
            files.append((f"/packages/{quote(w.name)}", {}))
            downloads.append((f"/packages/{quote(w.name)}", {}))
    return {"pages": pages, "metadata": files, "downloads": downloads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10, help="per client and mix")
    parser.add_argument("--variants", type=int, default=12)
    parser.add_argument("--publishers", type=int, default=8, help="publishing during the load")
    parser.add_argument(
        "--client",
        choices=("threads", "loop"),
        default="threads",
        help="one thread per client (default) or one thread for all the connections",
    )
    parser.add_argument(
        "--pin", action="store_true", help="the server on the last CPU, the rest on the others"
    )
    parser.add_argument("--servers", default="factory,pypiserver", help="comma-separated")
    parser.add_argument("--workers", type=int, default=1, help="factory serve --workers")
    parser.add_argument(
        "--wheel-size", default="64k", help="size of each served wheel (the downloads mix)"
    )
    parser.add_argument(
        "--same-session",
        action="store_true",
        help="start the servers in this process's session (as this benchmark did before)",
    )
    args = parser.parse_args()
    load = run_load if args.client == "threads" else run_load_loop
    wheel_bytes = parse_size(args.wheel_size, what="--wheel-size")
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus: list[str] = []
    if args.pin:
        if len(cpus) < 2:
            raise SystemExit("--pin needs at least 2 CPUs")
        os.sched_setaffinity(0, cpus[:-1])  # this process, its client threads, the publishers
        server_cpus = ["taskset", "-c", str(cpus[-1])]
    pypi_server = shutil.which("pypi-server")
    if pypi_server is None:
        raise SystemExit("pypi-server not found: pip install -e '.[bench]'")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp_name:
        tmp = Path(tmp_name)
        minors = [f"2.{m}" for m in range(3, 3 + args.variants)]
        wheels = [
            variant_wheel(tmp / "wheels", project, "1.0", t, payload_bytes=wheel_bytes)
            for project in PROJECTS
            for t in minors
        ]
        publish(LocalStore(tmp / "store"), wheels)
        ours_port, theirs_port = free_port(), free_port()
        commands = {
            "factory serve": (
                [
                    *server_cpus,
                    sys.executable,
                    "-m",
                    "factory",
                    "serve",
                    "--store",
                    str(tmp / "store"),
                    "--port",
                    str(ours_port),
                    *(["--workers", str(args.workers)] if args.workers != 1 else []),
                ],
                ours_port,
            ),
            "pypiserver --disable-fallback": (
                [
                    *server_cpus,
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
        wanted = {"factory": "factory serve", "pypiserver": "pypiserver --disable-fallback"}
        chosen = {wanted[n.strip()] for n in args.servers.split(",")}
        rows: list[tuple[str, str, dict[str, float]]] = []
        for name, (cmd, port) in commands.items():
            if name not in chosen:
                continue
            ours = name == "factory serve"
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env_for(name, tmp),
                start_new_session=not args.same_session,
            )
            try:
                wait_up(f"http://127.0.0.1:{port}/simple/")
                for mix, reqs in mixes(wheels, ours=ours).items():
                    target = tmp / "store" if ours else tmp / "wheels"
                    with Publishers(args.publishers, tmp / "pub", target, ours) as pubs:
                        cpu = cpu_seconds(proc.pid)
                        r = load(port, reqs, args.clients, args.requests)
                        cpu = cpu_seconds(proc.pid) - cpu
                    r["server_us"] = cpu / r["requests"] * 1e6  # CPU per request, all its threads
                    r["published"] = pubs.published - pubs.at_start  # during the load
                    r["publish_failures"] = len(pubs.failed)
                    r["first_publish_failure"] = pubs.failed[0] if pubs.failed else ""  # type: ignore[assignment]
                    rows.append((name, mix, r))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(
        f"{args.clients} concurrent clients x {args.requests} requests each, per server and mix,"
        f" while {args.publishers} publishers write; client: {args.client}"
        + (f"; server on CPU {cpus[-1]}, the rest on {cpus[:-1]}" if args.pin else "")
        + f"; factory serve --workers {args.workers}"
        + ("; servers in this session" if args.same_session else "; servers in their own session")
    )
    print()
    print(
        "| server                        | mix       | requests | errors | p50 ms | p95 ms "
        "| p99 ms | max ms | req/s | server CPU us/req | published | load |"
    )
    print(
        "|-------------------------------|-----------|---------:|-------:|-------:|-------:"
        "|-------:|-------:|------:|------------------:|----------:|-----:|"
    )
    fmt: Callable[[float], str] = lambda v: f"{v:6.1f}"  # noqa: E731
    for name, mix, r in rows:
        failures = f" ({int(r['publish_failures'])} failed)" if r["publish_failures"] else ""
        print(
            f"| {name:29} | {mix:9} | {int(r['requests']):8d} | {int(r['errors']):6d} "
            f"| {fmt(r['p50_ms'])} | {fmt(r['p95_ms'])} | {fmt(r['p99_ms'])} "
            f"| {r['max_ms']:6.0f} | {r['rps']:5.0f} | {r['server_us']:17.0f} "
            f"| {int(r['published'])}{failures} "
            f"| {r['load']:4.1f} |"
        )
    for name, mix, r in rows:
        if r["errors"]:
            print(f"{name} {mix}: first error: {r['first_error']}")
        if r["publish_failures"]:
            print(f"{name} {mix}: first publish failure: {r['first_publish_failure']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
