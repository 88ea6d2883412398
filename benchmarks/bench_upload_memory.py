"""Server memory while a big wheel is uploaded: ``factory serve`` on loopback, curl (and
optionally twine) posting a generated wheel of ``--size`` bytes.

    python benchmarks/bench_upload_memory.py [--size 2g] [--twine]

The wheel holds one stored (uncompressed) member of random bytes, so the upload really is
``--size`` bytes on the wire and the strict checks re-hash all of it. The server's RSS is
sampled every 0.2 s from /proc while the upload runs; its peak (VmHWM) is read at the end.
Prints one row per client: bytes sent, seconds, HTTP status, peak and last RSS. Loopback only;
the files are removed afterwards.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from index_fixtures import peak_rss  # noqa: E402
from probe_server import Server  # noqa: E402

from factory.index.htpasswd import bcrypt_line  # noqa: E402
from factory.units import parse_size  # noqa: E402

MIB = 1024 * 1024


def big_wheel(directory: Path, size: int) -> Path:
    """A valid wheel of about ``size`` bytes, written in 1 MiB pieces (never all in memory)."""
    name, version = "big_upload", "1.0"
    dist_info = f"{name}-{version}.dist-info"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    small = {
        f"{name}/__init__.py": b"",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: big-upload\nVersion: {version}\n\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    rows = []
    with zipfile.ZipFile(path, "w", allowZip64=True) as zf:
        digest = hashlib.sha256()
        written = 0
        with zf.open(zipfile.ZipInfo(f"{name}/payload.bin"), "w", force_zip64=True) as f:
            while written < size:
                chunk = os.urandom(min(MIB, size - written))
                f.write(chunk)
                digest.update(chunk)
                written += len(chunk)
        rows.append(f"{name}/payload.bin,{_b64(digest.digest())},{written}")
        for member, data in small.items():
            zf.writestr(member, data)
            rows.append(f"{member},{_b64(hashlib.sha256(data).digest())},{len(data)}")
        rows.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(rows) + "\n")
    return path


def _b64(raw: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def upload_command(client: str, url: str, wheel: Path, password: str) -> list[str]:
    if client == "curl":
        return [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-u",
            f"bench:{password}",
            "-F",
            ":action=file_upload",
            "-F",
            f"content=@{wheel}",
            url,
        ]
    return [
        "twine",
        "upload",
        "--non-interactive",
        "--disable-progress-bar",
        "--repository-url",
        url,
        "-u",
        "bench",
        "-p",
        password,
        str(wheel),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="2g", help="payload bytes (default 2g)")
    parser.add_argument("--twine", action="store_true", help="also upload with twine")
    args = parser.parse_args()
    size = parse_size(args.size)
    tmp = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    rows = []
    try:
        started = time.monotonic()
        wheel = big_wheel(tmp, size)
        print(
            f"wheel: {wheel.stat().st_size / MIB:.0f} MiB in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        password = "bench-password"
        htpasswd = tmp / "htpasswd"
        htpasswd.write_text(bcrypt_line("bench", password, cost=10) + "\n")
        clients = ["curl", "twine"] if args.twine else ["curl"]
        for client in clients:
            store = tmp / f"store-{client}"
            server = Server(store, htpasswd)
            url = server.url
            idle = _rss(server.proc.pid)
            samples: list[int] = []
            done = threading.Event()

            def sample(
                pid: int = server.proc.pid,
                done: threading.Event = done,
                samples: list[int] = samples,
            ) -> None:
                while not done.wait(0.2):
                    samples.append(_rss(pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            cmd = upload_command(client, url, wheel, password)
            t0 = time.monotonic()
            result = subprocess.run(cmd, capture_output=True, text=True)
            seconds = time.monotonic() - t0
            done.set()
            sampler.join()
            peak = peak_rss(server.proc.pid)
            status = result.stdout.strip() if client == "curl" else f"exit {result.returncode}"
            stored = store / "files" / "big-upload" / wheel.name
            ok = stored.is_file() and stored.stat().st_size == wheel.stat().st_size
            rows.append(
                (client, wheel.stat().st_size, seconds, status, idle, peak, max(samples or [0]), ok)
            )
            server.stop()
            shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(
        "| client | upload | seconds | status | server RSS idle | server peak RSS (VmHWM) "
        "| stored intact |"
    )
    print("|---|---:|---:|---|---:|---:|---|")
    for client, nbytes, seconds, status, idle, peak, _sampled, ok in rows:
        print(
            f"| {client} | {nbytes / MIB:,.0f} MiB | {seconds:.1f} | {status} | "
            f"{idle / MIB:.0f} MiB | {peak / MIB:.0f} MiB | {'yes' if ok else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
