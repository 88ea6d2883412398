"""Resolve time and bytes downloaded: our index vs plain pypiserver.

    python benchmarks/bench_index_resolve.py [--size-mb 60] [--runs 3]

An index holds 12 variants of one ~60 MB wheel (``+cu130torch2.3`` ... ``+cu130torch2.14``),
each pinning its torch minor (``torch==2.X.*``). A host venv has (fake) torch 2.11 and no
index offers torch, so a resolver must backtrack to the torch-2.11 variant. We time
``pip install --dry-run`` and ``uv pip install --dry-run`` against ``factory serve`` and against
``pypi-server run --disable-fallback`` (PyPI's pypiserver) over the same wheel files, and count
the bytes each server sends through a loopback proxy. Both servers run as subprocesses.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import contextlib

from index_fixtures import installer_env, uv_bin  # noqa: E402
from index_wheels import make_wheel, variant_wheel  # noqa: E402

from factory.index.publish import publish  # noqa: E402
from factory.store import LocalStore  # noqa: E402

TORCH_MINORS = [f"2.{m}" for m in range(3, 15)]
HOST_TORCH = "2.11.0"


class CountingProxy:
    """Forwards loopback TCP to a server and counts the bytes the server sends back."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.sent = 0
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if count:
                    with self.lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def take(self) -> int:
        with self.lock:
            sent, self.sent = self.sent, 0
        return sent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"server at {url} did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pypi_server = shutil.which("pypi-server")
    if pypi_server is None:
        raise SystemExit("pypi-server not found: pip install -e '.[bench]'")
    with tempfile.TemporaryDirectory(prefix="bench-resolve-") as tmp_name:
        tmp = Path(tmp_name)
        env = installer_env(tmp)
        wheels = [
            variant_wheel(
                tmp / "wheels", "flash-attn", "2.8.3", t, payload_bytes=args.size_mb << 20
            )
            for t in TORCH_MINORS
        ]
        publish(LocalStore(tmp / "store"), wheels)
        host = tmp / "host"
        subprocess.run(
            [uv_bin(), "venv", "-q", "--python", sys.executable, str(host)], check=True, env=env
        )
        torch = make_wheel(tmp / "torch", "torch", HOST_TORCH)
        subprocess.run(
            [uv_bin(), "pip", "install", "-q", "--python", str(host / "bin/python"), str(torch)],
            check=True,
            env=env,
        )
        ours_port, theirs_port = free_port(), free_port()
        servers = {
            "factory serve": (
                subprocess.Popen(
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
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                ours_port,
            ),
            "pypiserver --disable-fallback": (
                subprocess.Popen(
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
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                theirs_port,
            ),
        }
        rows = []
        try:
            for name, (_, port) in servers.items():
                wait_up(f"http://127.0.0.1:{port}/simple/")
                proxy = CountingProxy(port)
                url = f"http://127.0.0.1:{proxy.port}/simple/"
                tools = {
                    "pip": [
                        sys.executable,
                        "-m",
                        "pip",
                        "--python",
                        str(host / "bin/python"),
                        "install",
                        "--dry-run",
                        "--no-cache-dir",
                        "--index-url",
                        url,
                        "flash-attn",
                    ],
                    "uv": [
                        uv_bin(),
                        "pip",
                        "install",
                        "--dry-run",
                        "--no-cache",
                        "--python",
                        str(host / "bin/python"),
                        "--index-url",
                        url,
                        "flash-attn",
                    ],
                }
                for tool, cmd in tools.items():
                    times, sent, chosen = [], [], ""
                    for _ in range(args.runs):
                        proxy.take()
                        t0 = time.perf_counter()
                        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                        times.append(time.perf_counter() - t0)
                        sent.append(proxy.take())
                        out = done.stdout + done.stderr
                        chosen = (
                            "torch2.11"
                            if "cu130torch2.11" in out
                            else ("FAILED" if done.returncode else "?")
                        )
                    rows.append(
                        (tool, name, statistics.median(times), statistics.median(sent), chosen)
                    )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
        print(
            f"12 variants of a {args.size_mb} MB wheel; host torch {HOST_TORCH}; "
            f"median of {args.runs} runs"
        )
        print(
            f"| {'tool':<4} | {'server':<30} | {'resolve s':>9} | {'MB sent':>9} | {'chose':<9} |"
        )
        print(f"|{'-' * 6}|{'-' * 32}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
        for tool, name, seconds, sent_bytes, chosen in rows:
            print(
                f"| {tool:<4} | {name:<30} | {seconds:>9.2f} "
                f"| {sent_bytes / 1e6:>9.2f} | {chosen:<9} |"
            )
        return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
