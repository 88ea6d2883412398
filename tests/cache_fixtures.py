"""Helpers the compile-cache tests of both tiers share: fake sccache/ccache/python tools, cache
entries, a matrix whose store is the remote cache, and one real sccache + nvcc compile."""

from __future__ import annotations

import hashlib
import socket
import subprocess
from pathlib import Path

from factory.build import compile_cache
from factory.build.compile_cache import parse_stats


def fake_tools(bin_dir: Path, site: Path, include: Path) -> None:
    """`python` that names ``site`` as site-packages and ``include`` as its include dir; `sccache`
    and `ccache` that print their name and what they got."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "python").write_text(f"#!/bin/sh\necho {site}\necho {include}\n")
    for tool in ("sccache", "ccache"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool}; for a do echo "$a"; done\n')
    for f in ("python", "sccache", "ccache"):
        (bin_dir / f).chmod(0o755)


def cache_entry(cache: Path, content: bytes) -> str:
    key = hashlib.sha256(content).hexdigest()
    path = cache / key[0] / key[1] / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return key


def cache_matrix(tmp_path: Path, spec: str | None) -> Path:
    """The flash-attn cell; with ``spec`` an S3 store that is also the remote compile cache."""
    settings = f"""[settings]
store = "{spec}"
[settings.compile-cache]
dir = "cc"
remote = "store"
""" if spec else ""
    path = tmp_path / "matrix.toml"
    path.write_text(f"""version = 1
{settings}[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = ["3.11"]
[packages.flash-attn]
versions = ["2.8.3.post2"]
""")
    return path


HEADER = """#pragma once
#include <cstdio>
// __FILE__ puts this header's path into the host code, as TORCH_CHECK does in ATen's headers.
inline void report(int n) { std::printf("%s: n=%d\\n", __FILE__, n); }
__device__ inline float twice(float x) { return 2.0f * x; }
"""


KERNEL = """#include <ext.h>
__global__ void k(const float* a, float* o, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) o[i] = twice(a[i]);
}
void launch(const float* a, float* o, long n) {
  report((int)n);
  k<<<(n + 255) / 256, 256>>>(a, o, n);
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compile_in_a_fresh_server(
    sccache: str, argv: list[str], env: dict[str, str], *, cwd: Path
) -> compile_cache.CacheStats:
    """One compile in its own sccache server (as one build container has), and its stats."""
    try:
        subprocess.run([sccache, "--start-server"], env=env, check=True, capture_output=True)
        subprocess.run(argv, env=env, check=True, capture_output=True, cwd=cwd)
        out = subprocess.run(
            [sccache, "--show-stats", "--stats-format", "json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
    return parse_stats(out)
