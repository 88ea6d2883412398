"""The compile cache inside the build: sccache (and ccache's direct layer in front of it, when
the image has it) in front of the compilers, started fresh per build, and its statistics for the
report. The settings come from factory.build.compile_cache (the job's ``cache`` entry)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from .log import Log
from .sampling import proc_table
from .steps import clean_env, install_script, run_step, which


class CacheRun:
    """The cache of one build: found, configured, started, and asked for its figures."""

    def __init__(self, cache: dict[str, Any], log: Log) -> None:
        self.cache = cache
        self.log = log
        self.sccache: str | None = None
        self.env: dict[str, str] = {}  # sccache's own variables (stats and stop need them)
        self.direct_log: str | None = None  # ccache's stats log, when its direct layer is on
        self.nvcc: list[str] = []  # the command nvcc runs through (after the factory's wrapper)

    def environment(self, real_nvcc: str, extra: dict[str, str]) -> bool:
        """Put sccache (and ccache's direct layer, when the image has it) in front of the
        compilers; False when sccache is not installed."""
        cache, log = self.cache, self.log
        self.sccache = which("sccache", extra["PATH"])
        if self.sccache is None:
            log.line(
                "factory: the compile cache is on but sccache is not installed "
                "(it must be in the wheelhouse)"
            )
            return False
        self.env = {
            "SCCACHE_DIR": cache["dir"],
            "SCCACHE_CACHE_SIZE": cache["size"],
            # we stop the server ourselves; it must not outlive or pre-empt us
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_SERVER_PORT": str(cache.get("port", 4226)),
        }
        extra.update(self.env)
        self.nvcc = [self.sccache, real_nvcc]
        # factory.build.compile_cache: the size bound, and compiler wrappers (nvcc, C++) that
        # spell paths the same for every Python version (so cp311 and cp313 share objects).
        self.env.update(cache.get("env", {}))
        extra.update(cache.get("env", {}))
        direct = cache.get("direct")
        if direct and which("ccache", extra["PATH"]) is None:
            log.line("factory: ccache is not in the builder image: the compile cache runs "
                     "without its direct layer (hits cost a preprocessing pass); "
                     "remake the image to get it")
        elif direct:
            self.direct_log = direct["env"]["CCACHE_STATSLOG"]
            Path(self.direct_log).unlink(missing_ok=True)
            extra.update(direct["env"])
        if cache.get("nvcc_wrapper"):
            self.nvcc = [install_script(cache["nvcc_wrapper"])]
        if cache.get("cxx_wrapper"):
            extra["FACTORY_HOST_CXX"] = extra.get("CXX") or os.environ.get("CXX") or "c++"
            extra["CXX"] = install_script(cache["cxx_wrapper"])
            # the wrapper calls sccache itself: torch must not put another in front
            extra["TORCH_NO_COMPILER_WRAPPER"] = "1"
        return True

    def start(self, env: dict[str, str]) -> int:
        """A fresh server of our own, with zeroed stats (the report's hits are this build's)."""
        assert self.sccache is not None
        sccache = self.sccache
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)
        code = run_step([sccache, "--start-server"], env=env, cwd=None, log=self.log)
        if code != 0:
            return code
        subprocess.run([sccache, "--zero-stats"], env=env, capture_output=True, timeout=60)
        return 0

    def servers(self) -> set[int]:
        """Our server's pids (it daemonizes: its compilers are found through it)."""
        return sccache_servers(self.env["SCCACHE_SERVER_PORT"]) if self.sccache else set()

    def finish(self, report: dict[str, Any], path: str) -> None:
        """The statistics into the report; stop the server."""
        if self.sccache:
            report.update(sccache_stats(self.sccache, clean_env({**self.env, "PATH": path})))
        if self.direct_log:
            # The build's hits and misses are whole objects, as the direct layer answered them;
            # sccache's (its steps, on the direct layer's misses) stay in sccache_hits/_misses.
            direct = direct_stats(self.direct_log)
            report["direct_cache"] = direct
            report["cache_hits"] = direct["hits"]
            report["cache_misses"] = direct["misses"]
        if self.sccache:
            subprocess.run([self.sccache, "--stop-server"], env=clean_env(self.env),
                           capture_output=True, timeout=60)


def sccache_stats(sccache: str, env: dict[str, str]) -> dict[str, Any]:
    try:
        out = subprocess.run(
            [sccache, "--show-stats", "--stats-format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        doc = json.loads(out)
        stats = doc.get("stats", {})
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}

    def total(key: str) -> int:
        value = stats.get(key, 0)
        if isinstance(value, dict):
            counts = value.get("counts", value)
            return sum(v for v in counts.values() if isinstance(v, int))
        return int(value) if isinstance(value, int) else 0

    hits, misses = total("cache_hits"), total("cache_misses")
    return {
        "cache_hits": hits,
        "cache_misses": misses,
        "sccache_hits": hits,
        "sccache_misses": misses,
        "compile_requests": total("compile_requests"),
        "sccache": doc,  # the whole document: factory.build.compile_cache parses it per step
    }


def direct_stats(path: str) -> dict[str, int]:
    """ccache's stats log (``# <source>``, then one counter name per line, per compile) ->
    objects that hit, missed, or could not be cached."""
    counts = {"hits": 0, "misses": 0, "uncacheable": 0}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return counts
    records: list[set[str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            records.append(set())
        elif line.strip() and records:
            records[-1].add(line.strip())
    for names in records:
        if names & {"direct_cache_hit", "preprocessed_cache_hit"}:
            counts["hits"] += 1
        elif "cache_miss" in names:
            counts["misses"] += 1
        else:
            counts["uncacheable"] += 1
    return counts



def sccache_servers(port: str) -> set[int]:
    """Our sccache server: named sccache, started with our port (other builds use others)."""
    mine = f"SCCACHE_SERVER_PORT={port}".encode()
    found = set()
    for pid, (_, comm, _) in proc_table().items():
        if comm != "sccache":
            continue
        try:
            if mine in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found


