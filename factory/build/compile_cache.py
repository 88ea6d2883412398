"""The shared compile cache: ccache in front of sccache in every build container, one cache per
builder.

Why the settings are what they are (measured with sccache 0.16, ccache 4.7 and nvcc 13.0):

- sccache caches an nvcc call per stage (cudafe++, cicc -> PTX, ptxas -> cubin, the host
  compile of the object), so a kernel shared between cells hits even when its object differs.
- The key of a preprocessed stage holds every path that reaches the preprocessed source: the
  line markers and the ``__FILE__`` strings (681 of them in one ATen kernel). torch's headers
  live in ``<venv>/lib/pythonX.Y/site-packages``, so the same kernel built for cp311 and cp313
  spells them differently. Plain: only ptxas hit. ``SCCACHE_BASEDIRS``: cudafe++, cicc and ptxas
  hit, but the object (host code with the ``__FILE__`` strings) still missed. The nvcc wrapper
  (``factory.runners.cache_config``) spells site-packages through one fixed link in every
  container: the whole object hits.
- The Python include dir (``-I.../python3.X``) differs per version too but is not in the key:
  sccache hashes the preprocessed output, and kernels that include only ATen never read it.
- The host compiler and the system headers are in the key: images of two Debian releases
  (g++ 12 / glibc 2.36 and g++ 14 / glibc 2.41) share only ptxas results. Python versions that
  should share kernels need images of one release (see ``factory.toolchain.python_image``).
- sccache never caches an nvcc call as a whole (it cannot prove the preprocessed source covers
  host code under ``#ifndef __CUDA_ARCH__``): every call preprocesses twice to make a key it never
  stores, then runs each stage from the cache. A kernel that hits costs ~8 s of preprocessing
  (ATen headers). So ccache sits in front of sccache (the "direct layer"): its direct mode keys
  a whole object on the command line, the source and the content of every header it read (the
  ``-MD`` depfile ninja asks for anyway; depend mode, no preprocessor run), and answers a hit in
  ~0.1 s. On its miss it runs the compiler through sccache (``CCACHE_PREFIX``), whose stage
  cache still serves kernels shared between cells. For that key the Python include dir is
  spelled through a fixed link too (``-I`` is on the command line; a kernel that really includes
  Python.h still misses: the header's content differs).

Layout of the cache dir on the builder: ``sccache/`` (sccache's disk cache) and ``ccache/`` (the
direct layer); the remote cache carries both (``factory.build.remote_cache``). The size bound covers
both: a quarter for the direct layer (whole objects, compressed), the rest for sccache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.matrix.settings import DEFAULT_CACHE_SIZE, Settings
from factory.store.s3 import DEFAULT_REGION, endpoint_from, region_from, s3_url
from factory.store.s3 import parse_url as parse_s3_url


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteCache:
    """The remote cache under the store's own bucket and prefix. Factory builds reach it from the
    host (``factory.build.remote_cache``: pull before, push after; the containers have no network);
    ``env()`` configures sccache's own S3 backend for a builder that has network."""

    bucket: str
    prefix: str
    endpoint: str | None = None
    region: str = DEFAULT_REGION

    @classmethod
    def from_store(cls, store: str, *, environ: Mapping[str, str] | None = None) -> RemoteCache:
        """``s3://bucket/prefix`` -> the cache under ``prefix/compile-cache/``; the endpoint and
        region come from the same variables the S3 store reads."""
        parts = parse_s3_url(store)
        if parts is None:
            raise ConfigError(f"a remote compile cache needs an s3:// store, not {store!r}")
        bucket, prefix = parts
        if not bucket:
            raise ConfigError(f"remote compile cache {store!r} names no bucket")
        prefix = "/".join(p for p in (prefix, "compile-cache") if p)
        return cls(bucket=bucket, prefix=prefix, endpoint=endpoint_from(environ),
                   region=region_from(environ))

    @property
    def url(self) -> str:
        return s3_url(self.bucket, self.prefix)

    def env(self) -> dict[str, str]:
        # Disk first, S3 second: hits come from the local disk when they can, every write goes
        # to both, and an S3 failure (l0 policy) never fails a build.
        env = {
            "SCCACHE_MULTILEVEL_CHAIN": "disk,s3",
            "SCCACHE_MULTILEVEL_WRITE_ERROR_POLICY": "l0",
            "SCCACHE_BUCKET": self.bucket,
            "SCCACHE_S3_KEY_PREFIX": self.prefix,
            "SCCACHE_REGION": self.region,
        }
        if self.endpoint:
            env["SCCACHE_ENDPOINT"] = self.endpoint
            env["SCCACHE_S3_USE_SSL"] = "true" if self.endpoint.startswith("https://") else "false"
        return env


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """``[settings.compile-cache]`` of the matrix, resolved."""

    dir: Path  # on the builder; every build container mounts it
    size: str = DEFAULT_CACHE_SIZE
    remote: RemoteCache | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "size": self.size,
            "remote": dataclasses.asdict(self.remote) if self.remote else None,
        }


def cache_settings(settings: Settings, *, store: str | None = None) -> CacheSettings:
    """The matrix's ``compile-cache = {dir, size, remote}`` with its remote resolved:
    ``remote = "store"`` puts the remote cache in the (s3://) store (``store``, the --store
    given, before the matrix's), or give an ``s3://bucket/prefix`` of its own."""
    config = settings.compile_cache
    remote = None
    if config.remote == "store":
        remote = RemoteCache.from_store(store or settings.store)
    elif config.remote:
        remote = RemoteCache.from_store(config.remote)
    return CacheSettings(dir=config.dir, size=config.size, remote=remote)


# -- stats ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheStats:
    """One sccache server's counters (``sccache --show-stats --stats-format json``)."""

    hits: int  # every cached step: whole objects and nvcc stages
    misses: int
    object_hits: int  # whole compiler calls (nvcc or c++) answered from the cache
    object_misses: int
    by_step: dict[str, tuple[int, int]]  # "ptx [cicc]" -> (hits, misses)
    cache_size: int | None
    max_cache_size: int | None
    location: str
    # the direct layer (ccache in front): whole objects answered without preprocessing
    direct_hits: int = 0
    direct_misses: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "object_hits": self.object_hits,
            "object_misses": self.object_misses,
            "by_step": {k: {"hits": h, "misses": m} for k, (h, m) in sorted(self.by_step.items())},
            "cache_size": self.cache_size,
            "max_cache_size": self.max_cache_size,
            "location": self.location,
            "direct_hits": self.direct_hits,
            "direct_misses": self.direct_misses,
        }

    def summary(self) -> str:
        steps = ", ".join(f"{k} {h}/{h + m}" for k, (h, m) in sorted(self.by_step.items()))
        direct = self.direct_hits + self.direct_misses
        head = f"{self.direct_hits} of {direct} objects whole (ccache); sccache " if direct else ""
        return (head + f"{self.hits} hits, {self.misses} misses"
                + (f" ({steps})" if steps else ""))


# The first step of a compiler call: nvcc itself, or a C/C++ compiler (its name in brackets).
_OBJECT_STEPS = re.compile(r"\[(nvcc|gcc|g\+\+|c\+\+|cc|clang|clang\+\+)\]$")


def _counts(section: Any) -> dict[str, int]:
    if not isinstance(section, Mapping):
        return {}
    counts = section.get("adv_counts") or section.get("counts") or {}
    return {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}


def parse_stats(data: str | Mapping[str, Any]) -> CacheStats:
    """Parse sccache's JSON stats (the whole document or its ``stats`` object)."""
    doc: Mapping[str, Any] = json.loads(data) if isinstance(data, str) else data
    stats = doc.get("stats", doc)
    hits, misses = _counts(stats.get("cache_hits")), _counts(stats.get("cache_misses"))
    by_step = {k: (hits.get(k, 0), misses.get(k, 0)) for k in set(hits) | set(misses)}
    obj_h = sum(h for k, (h, _) in by_step.items() if _OBJECT_STEPS.search(k))
    obj_m = sum(m for k, (_, m) in by_step.items() if _OBJECT_STEPS.search(k))
    size = doc.get("cache_size")
    max_size = doc.get("max_cache_size")
    return CacheStats(
        hits=sum(hits.values()),
        misses=sum(misses.values()),
        object_hits=obj_h,
        object_misses=obj_m,
        by_step=by_step,
        cache_size=size if isinstance(size, int) else None,
        max_cache_size=max_size if isinstance(max_size, int) else None,
        location=str(doc.get("cache_location", "")),
    )


def stats_from_report(report: Mapping[str, Any]) -> CacheStats | None:
    """The stats inside.py put in a run's report, if the cache was on: sccache's, and the
    direct layer's when it ran."""
    raw = report.get("sccache")
    direct = report.get("direct_cache")
    if not isinstance(raw, Mapping) and not isinstance(direct, Mapping):
        return None
    stats = parse_stats(raw if isinstance(raw, Mapping) else {})
    if isinstance(direct, Mapping):
        stats = dataclasses.replace(stats, direct_hits=int(direct.get("hits", 0)),
                                    direct_misses=int(direct.get("misses", 0)))
    return stats


# -- the cache on the builder ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiskUsage:
    files: int
    bytes: int


def disk_usage(cache_dir: Path) -> DiskUsage:
    files = total = 0
    for dirpath, _, names in os.walk(cache_dir):
        for name in names:
            try:
                total += (Path(dirpath) / name).lstat().st_size
            except OSError:
                continue
            files += 1
    return DiskUsage(files=files, bytes=total)


def clear(cache_dir: Path) -> DiskUsage:
    """Empty the cache directory (kept, so a running mount stays valid); returns what went."""
    gone = disk_usage(cache_dir)
    if cache_dir.is_dir():
        for child in cache_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    return gone


def recorded_builds(work_dir: Path) -> list[dict[str, Any]]:
    """Per cell, the cache stats of its latest run (from the runners' reports under work-dir)."""
    out: list[dict[str, Any]] = []
    if not work_dir.is_dir():
        return out
    for cell_dir in sorted(p for p in work_dir.iterdir() if p.is_dir()):
        reports = sorted((cell_dir / "logs").glob("*.report.json"), key=lambda p: p.stat().st_mtime)
        for path in reversed(reports):
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            stats = stats_from_report(report) if isinstance(report, dict) else None
            if stats is not None:
                out.append({"cell": cell_dir.name, "report": str(path), **stats.as_dict(),
                            "summary": stats.summary()})
                break
    return out
