"""The index server and publisher probed as an attacker would, against a real ``factory serve``
on loopback; prints one reliability row per probe (tried / refused / lost / tracebacks).

    python benchmarks/probe_server.py [--lines 500] [--half-open 3000]

Probes: malformed and random request lines; a TLS ClientHello; half-open connections past the
connection cap (server threads counted from /proc); uploads with a NUL or a 300-character
filename, an encrypted member, a 3 GiB-of-zeros wheel, mismatched tags; the same wheels through
``factory publish``; weak htpasswd schemes at start; wrong passwords from 4 clients while a
valid client reads (its p50 with and without them), and the time a wrong password takes for an
existing and an unknown user; a symlink planted in the store; a server killed mid-upload (its
temp file reported by ``index verify`` and removed by ``index rebuild``). "tracebacks" counts
``Traceback`` in the server's and the CLI's stderr. Loopback only, bounded in count and time.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from index_fixtures import multipart_upload  # noqa: E402
from index_wheels import make_wheel  # noqa: E402

from factory.index.htpasswd import bcrypt_line  # noqa: E402

PASSWORD = "probe-password"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TLS_HELLO = bytes.fromhex("16030100c4010000c00303" + "ab" * 32 + "000020" + "c02b" * 16 + "0100")


class Server:
    def __init__(self, store: Path, htpasswd: Path, *extra: str) -> None:
        self.stderr = store.parent / f"serve-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "factory",
                "serve",
                "--store",
                str(store),
                "--port",
                "0",
                "--htpasswd",
                str(htpasswd),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.stderr, "w"),  # noqa: SIM115 (the child keeps it)
            text=True,
            env=ENV,
        )
        assert self.proc.stdout is not None
        url = self.proc.stdout.readline().split(" at ", 1)[1].split()[0]
        self.url = url.removesuffix("simple/")
        self.port = int(self.url.rstrip("/").rsplit(":", 1)[1])

    def tracebacks(self) -> int:
        return self.stderr.read_text(errors="replace").count("Traceback")

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return 0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        if self.proc.stdout:
            self.proc.stdout.close()


def raw(port: int, data: bytes, timeout: float = 20) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(data)
            out = b""
            while b"\r\n\r\n" not in out:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
            return out
    except OSError:
        return b""


def status(response: bytes) -> int:
    try:
        return int(response.split(b"\r\n", 1)[0].split()[1]) if response[:5] == b"HTTP/" else 0
    except (IndexError, ValueError):
        return 0


def auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def multipart_post(filename: str, content: bytes, authorization: str) -> bytes:
    body = multipart_upload(filename, content, "pr0be")
    head = (
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=pr0be\r\n"
        f"Content-Length: {len(body)}\r\nAuthorization: {authorization}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


def bomb(directory: Path, gib: int) -> Path:
    w = make_wheel(directory, "bomb", "1.0")
    with (
        zipfile.ZipFile(w, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf,
        zf.open("bomb/zeros.bin", "w", force_zip64=True) as f,
    ):
        block = bytes(1 << 20)
        for _ in range(gib * 1024):
            f.write(block)
    return w


def encrypted(directory: Path) -> Path:
    w = make_wheel(directory, "enc", "1.0")
    data = bytearray(w.read_bytes())
    i = data.find(b"PK\x01\x02")
    data[i + 8] |= 1
    w.write_bytes(bytes(data))
    return w


def stored_files(store: Path) -> int:
    return sum(1 for p in (store / "files").rglob("*.whl")) if (store / "files").exists() else 0


Row = tuple[str, int, int, int, int, str]  # probe, tried, refused, lost, tracebacks, note


def probe_request_lines(tmp: Path, htpasswd: Path, n: int) -> list[Row]:
    store = tmp / "lines"
    server = Server(store, htpasswd)
    fixed = [
        b"GET / HTTP/2.0\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        TLS_HELLO,
        b"GET /\r\n",
        b"\r\n\r\n",
    ]
    rng = random.Random(17)
    fuzzed = [
        bytes(
            rng.choice([rng.randrange(256), 0x20, 0x2F, 0x47]) for _ in range(rng.randrange(1, 200))
        )
        .replace(b"\r", b"")
        .replace(b"\n", b"")
        + b"\r\nConnection: close\r\n\r\n"
        for _ in range(n)
    ]
    rows = []
    for name, batch in (
        (
            "malformed request lines (HTTP/2.0, GARBAGE, 70k chars, TLS ClientHello, "
            "HTTP/0.9, empty)",
            fixed,
        ),
        ("random request lines", fuzzed),
    ):
        codes = [status(raw(server.port, data)) for data in batch]
        answered = sum(1 for c in codes if c)
        refused = sum(1 for c in codes if 400 <= c < 500)
        rows.append(
            (
                name,
                len(batch),
                refused,
                len(batch) - answered,
                0,
                "codes: " + ", ".join(f"{c} x {codes.count(c)}" for c in sorted(set(codes))),
            )
        )
    server.stop()
    tb = server.tracebacks()
    return [(name, tried, refused, lost, tb, note) for name, tried, refused, lost, _, note in rows]


def probe_half_open(tmp: Path, htpasswd: Path, count: int) -> list[Row]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 512)), hard))
    server = Server(tmp / "halfopen", htpasswd)
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        except OSError:
            break
    time.sleep(2)
    threads = server.threads()
    code = status(raw(server.port, b"GET /simple/ HTTP/1.1\r\nConnection: close\r\n\r\n"))
    for s in socks:
        s.close()
    time.sleep(3)
    after = status(raw(server.port, b"GET /simple/ HTTP/1.1\r\nConnection: close\r\n\r\n"))
    server.stop()
    return [
        (
            f"{count} half-open connections (cap 512)",
            len(socks),
            0,
            0,
            server.tracebacks(),
            f"server threads {threads}; a request meanwhile: {code}; after they close: {after}",
        )
    ]


def probe_uploads(tmp: Path, htpasswd: Path) -> list[Row]:
    store = tmp / "uploads"
    server = Server(store, htpasswd)
    good = make_wheel(tmp / "u", "probe", "1.0").read_bytes()
    a = auth("uploader", PASSWORD)
    cases = {
        "NUL in the filename": ("pro\0be-1.0-py3-none-any.whl", good),
        "300-character filename": ("p" * 300 + "-1.0-py3-none-any.whl", good),
        "../ in the filename": ("../probe-1.0-py3-none-any.whl", good),
        "encrypted member": ("enc-1.0-py3-none-any.whl", encrypted(tmp / "e").read_bytes()),
        "3 GiB of zeros (a zip bomb)": (
            "bomb-1.0-py3-none-any.whl",
            bomb(tmp / "b", 3).read_bytes(),
        ),
        "filename tags differ from WHEEL": (
            "probe-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            good,
        ),
    }
    codes = {
        name: status(raw(server.port, multipart_post(fn, data, a), timeout=300))
        for name, (fn, data) in cases.items()
    }
    server.stop()
    stored = stored_files(store)
    temps = sum(1 for _ in store.rglob(".tmp-*"))
    refused = sum(1 for c in codes.values() if c == 400)
    return [
        (
            "hostile uploads (" + ", ".join(cases) + ")",
            len(cases),
            refused,
            0,
            server.tracebacks(),
            f"codes {sorted(codes.values())}; wheels stored {stored}; temp files left {temps}",
        )
    ]


def probe_publish(tmp: Path) -> list[Row]:
    wheels = [
        encrypted(tmp / "pe"),
        bomb(tmp / "pb", 3),
        make_wheel(
            tmp / "pt", "probe", "1.0", filename="probe-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
        ),
        make_wheel(tmp / "pi", "probe", "1.0", tag="py3-none-bogus_tag"),
        make_wheel(tmp / "pr", "probe", "1.0", requires_python=">=3.x,,"),
    ]
    store = tmp / "publish"
    codes, tracebacks = [], 0
    for w in wheels:
        r = subprocess.run(
            [sys.executable, "-m", "factory", "publish", "--store", str(store), str(w)],
            capture_output=True,
            text=True,
            env=ENV,
        )
        codes.append(r.returncode)
        tracebacks += r.stderr.count("Traceback")
    return [
        (
            "`factory publish` of an encrypted member, a 3 GiB zip bomb, tags differing from "
            "WHEEL, "
            "a bogus platform tag, Requires-Python `>=3.x,,`",
            len(wheels),
            sum(1 for c in codes if c == 9),
            0,
            tracebacks,
            f"exit codes {codes}; wheels stored {stored_files(store)}",
        )
    ]


def probe_weak_htpasswd(tmp: Path) -> list[Row]:
    lines = [
        "u:plaintext",
        "u:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=",
        "u:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
        "u:rqXexS6ZhobKA",
    ]
    codes, tracebacks = [], 0
    for i, line in enumerate(lines):
        path = tmp / f"weak-{i}"
        path.write_text(line + "\n")
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "factory",
                "serve",
                "--store",
                str(tmp / "weak"),
                "--port",
                "0",
                "--htpasswd",
                str(path),
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
        codes.append(r.returncode)
        tracebacks += r.stderr.count("Traceback")
    return [
        (
            "htpasswd with plain, {SHA}, apr1-MD5, DES entries",
            len(lines),
            sum(1 for c in codes if c == 13),
            0,
            tracebacks,
            f"exit codes {codes} (one line naming the user)",
        )
    ]


def _timed_get(port: int, authorization: str) -> float:
    t0 = time.perf_counter()
    raw(
        port,
        (
            f"GET /simple/ HTTP/1.1\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
        ).encode(),
    )
    return time.perf_counter() - t0


def probe_auth(tmp: Path) -> list[Row]:
    htpasswd = tmp / "htpasswd-12"
    htpasswd.write_text(bcrypt_line("uploader", PASSWORD, cost=12) + "\n")
    server = Server(tmp / "auth", htpasswd, "--read-auth")
    good = auth("uploader", PASSWORD)
    _timed_get(server.port, good)  # cached from here on
    alone = statistics.median(_timed_get(server.port, good) for _ in range(20))
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            _timed_get(server.port, auth("uploader", "wrong"))

    attackers = [threading.Thread(target=attacker, daemon=True) for _ in range(4)]
    for t in attackers:
        t.start()
    time.sleep(1)
    attacked = statistics.median(_timed_get(server.port, good) for _ in range(20))
    stop.set()
    for t in attackers:
        t.join()
    wrong = statistics.median(_timed_get(server.port, auth("uploader", "nope")) for _ in range(5))
    unknown = statistics.median(_timed_get(server.port, auth("nobody", "nope")) for _ in range(5))
    server.stop()
    return [
        (
            "wrong bcrypt passwords from 4 clients while a valid client reads",
            20,
            0,
            0,
            server.tracebacks(),
            f"valid client p50 {alone * 1000:.0f} ms alone, {attacked * 1000:.0f} ms "
            f"under attack; wrong password: existing user {wrong * 1000:.0f} ms, unknown user "
            f"{unknown * 1000:.0f} ms",
        )
    ]


def probe_symlink(tmp: Path, htpasswd: Path) -> list[Row]:
    store = tmp / "links"
    make = make_wheel(tmp / "l", "probe", "1.0")
    subprocess.run(
        [sys.executable, "-m", "factory", "publish", "--store", str(store), str(make)],
        check=True,
        capture_output=True,
        env=ENV,
    )
    (store / "files" / "probe" / "evil-1.0-py3-none-any.whl").symlink_to("/etc/passwd")
    (store / "files" / "etc").symlink_to("/etc")
    server = Server(store, htpasswd)
    paths = ["files/probe/evil-1.0-py3-none-any.whl", "files/etc/passwd.metadata"]
    codes = [
        status(raw(server.port, f"GET /{p} HTTP/1.1\r\nConnection: close\r\n\r\n".encode()))
        for p in paths
    ]
    server.stop()
    verify = subprocess.run(
        [sys.executable, "-m", "factory", "index", "verify", "--store", str(store)],
        capture_output=True,
        text=True,
        env=ENV,
    )
    return [
        (
            "symlinks planted in the store (a wheel -> /etc/passwd, a directory -> /etc)",
            len(paths),
            codes.count(404),
            0,
            server.tracebacks() + verify.stderr.count("Traceback"),
            f"codes {codes}; `index verify` exit {verify.returncode}, "
            f"{verify.stdout.count('a symlink in the store')} symlink problem(s)",
        )
    ]


def probe_killed_upload(tmp: Path, htpasswd: Path) -> list[Row]:
    store = tmp / "killed"
    server = Server(store, htpasswd)
    big = make_wheel(tmp / "k", "killed", "1.0", payload_bytes=256 << 20)
    curl = subprocess.Popen(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "--limit-rate",
            "20M",
            "-u",
            f"uploader:{PASSWORD}",
            "-F",
            ":action=file_upload",
            "-F",
            f"content=@{big}",
            server.url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(store.glob(".tmp-*/*.whl")):
        time.sleep(0.1)
    time.sleep(1)
    server.stop(signal.SIGKILL)
    curl.wait(timeout=120)
    left = sum(1 for _ in store.glob(".tmp-*"))
    verify = subprocess.run(
        [sys.executable, "-m", "factory", "index", "verify", "--store", str(store)],
        capture_output=True,
        text=True,
        env=ENV,
    )
    rebuild = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory",
            "index",
            "rebuild",
            "--store",
            str(store),
            "--temp-grace",
            "0",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    after = sum(1 for _ in store.glob(".tmp-*"))
    return [
        (
            "server SIGKILLed mid-upload (256 MiB)",
            1,
            0,
            0,
            verify.stderr.count("Traceback") + rebuild.stderr.count("Traceback"),
            f"temp dirs left {left}; `index verify` listed {verify.stdout.count('temp .tmp-')}; "
            f"`index rebuild --temp-grace 0` removed them: {after} left",
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--half-open", type=int, default=3000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="probe-server-"))
    htpasswd = tmp / "htpasswd"
    htpasswd.write_text(bcrypt_line("uploader", PASSWORD, cost=10) + "\n")
    rows: list[Row] = []
    try:
        for probe in (
            lambda: probe_request_lines(tmp, htpasswd, args.lines),
            lambda: probe_half_open(tmp, htpasswd, args.half_open),
            lambda: probe_uploads(tmp, htpasswd),
            lambda: probe_publish(tmp),
            lambda: probe_weak_htpasswd(tmp),
            lambda: probe_auth(tmp),
            lambda: probe_symlink(tmp, htpasswd),
            lambda: probe_killed_upload(tmp, htpasswd),
        ):
            got = probe()
            rows += got
            for row in got:
                print("  ", row, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("| probe | tried | refused | lost | tracebacks | result |")
    print("|---|---:|---:|---:|---:|---|")
    for name, tried, refused, lost, tracebacks, note in rows:
        print(f"| {name} | {tried} | {refused} | {lost} | {tracebacks} | {note} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
