"""factory cache stats|clear|pull|push [--matrix PATH] [--store S3] [--json] [--force | --wait]"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from factory.build import compile_cache, remote_cache
from factory.build.compile_cache import cache_settings, disk_usage, recorded_builds
from factory.commands._common import add_matrix_arg, matrix_from_args, print_json
from factory.engine import docker_client
from factory.errors import BuildError, ConfigError
from factory.runners.docker import LABEL
from factory.units import format_size, parse_size


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("stats", "clear", "pull", "push"),
        help="stats: size and hits per cell; clear: empty it; pull/push: sync this builder's "
        "cache with the remote one (compile-cache.remote; builds with --cache do it themselves)",
    )
    add_matrix_arg(parser)
    parser.add_argument(
        "--store",
        help="the s3:// store when the matrix says remote = \"store\" (default: its store)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--force", action="store_true",
                        help="clear even while builds that use this cache are running")
    parser.add_argument("--wait", action="store_true",
                        help="clear: wait for the builds that use this cache to finish (builds "
                        "with another cache or none are ignored)")


def _running_builds(cache_dir: Path) -> list[str]:
    """Running build containers that mount this cache (none when docker is absent): builds of
    other builders, without --cache or with another cache dir, do not hold it and are ignored."""
    try:
        client = docker_client(timeout=10)
        running = client.containers.list(filters={"label": LABEL, "status": "running"})
    except Exception:  # no engine, no SDK: nothing of ours can be running in it
        return []
    want = cache_dir.resolve()
    return [
        c.name for c in running
        if any(Path(m.get("Source", "")).resolve() == want for m in c.attrs.get("Mounts") or ())
    ]


def run(args: argparse.Namespace) -> int:
    matrix = matrix_from_args(args)
    settings = cache_settings(matrix.settings, store=args.store)
    if args.action in ("pull", "push"):
        if settings.remote is None:
            raise ConfigError(
                "no remote compile cache: set [settings.compile-cache] remote = \"store\" "
                "(an s3:// store) or remote = \"s3://bucket/prefix\""
            )
        fn = remote_cache.pull if args.action == "pull" else remote_cache.push
        result = fn(settings.remote, settings.dir)
        if args.json:
            print_json({**dataclasses.asdict(result), "dir": str(settings.dir),
                        "remote": settings.remote.url})
        else:
            print(result.summary())
        return 0
    work = matrix.settings.work_dir
    if args.action == "clear":
        running = _running_builds(settings.dir)
        while running and args.wait and not args.force:
            print(f"waiting for {len(running)} build(s) using {settings.dir} ({running[0]})",
                  flush=True)
            time.sleep(10)
            running = _running_builds(settings.dir)
        if running and not args.force:
            raise BuildError(
                f"{len(running)} build(s) running with this cache ({running[0]}); it is in use",
                tip="--wait waits for them; --force clears it under them",
            )
        gone = compile_cache.clear(settings.dir)
        if args.json:
            print_json({"cleared": str(settings.dir), "files": gone.files, "bytes": gone.bytes})
        else:
            print(f"cleared {settings.dir}: {gone.files} file(s), {format_size(gone.bytes)}")
        return 0
    usage = disk_usage(settings.dir)
    builds = recorded_builds(work)
    if args.json:
        print_json(
            {
                "cache": {
                    **settings.as_dict(),
                    "files": usage.files,
                    "bytes": usage.bytes,
                    "bound_bytes": parse_size(settings.size),
                },
                "builds": builds,
            }
        )
        return 0
    print(f"cache    {settings.dir}")
    print(f"size     {format_size(usage.bytes)} in {usage.files} file(s), bound {settings.size}")
    if settings.remote:
        r = settings.remote
        print(f"remote   {r.url}" + (f" at {r.endpoint}" if r.endpoint else ""))
    if not builds:
        print("no build with the cache on has been recorded under", work)
    for b in builds:
        print(f"{b['cell']}: {b['summary']}")
    return 0
