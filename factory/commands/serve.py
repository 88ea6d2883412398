"""factory serve [--store STORE] [--host H] [--port P] [--htpasswd FILE] [--read-auth]
[--max-upload SIZE] [--max-connections N] [--workers N] [--max-unpacked SIZE] [--max-ratio N]"""

from __future__ import annotations

import argparse
from pathlib import Path

from factory import logger
from factory.commands._common import (
    add_store_arg,
    add_wheel_limit_args,
    store_from_args,
    wheel_limits_from_args,
)
from factory.errors import UsageError
from factory.index import rebuild_index
from factory.index.server import ServerConfig, make_server, serve_workers
from factory.store import open_existing_store, url_scheme
from factory.units import parse_size


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)"
    )
    parser.add_argument(
        "--htpasswd",
        type=Path,
        default=None,
        help="htpasswd file (Apache format); without it uploads are refused",
    )
    parser.add_argument(
        "--read-auth", action="store_true", help="reads need credentials from --htpasswd too"
    )
    parser.add_argument(
        "--max-upload", default="4g", metavar="SIZE", help="largest upload request (default 4g)"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=512,
        metavar="N",
        help="concurrent connections; past this a 503 (default 512)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes answering on the port (default 1; up to one per core helps under load);"
        " --max-connections is shared among them",
    )
    add_wheel_limit_args(parser)


def run(args: argparse.Namespace) -> int:
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, not {args.max_connections}")
    if not 1 <= args.workers <= args.max_connections:
        raise UsageError(
            f"--workers must be 1 to --max-connections ({args.max_connections}), not {args.workers}"
        )
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0-65535 (0: any free port), not {args.port}")
    spec = store_from_args(args)
    if url_scheme(spec) is not None:
        raise UsageError(
            "factory serve serves a local store",
            tip="put a static host or CDN in front of the bucket (docs/INDEX.md)",
        )

    store = open_existing_store(spec)
    root = Path(spec)
    if not (root / "simple").is_dir():
        rebuild_index(store)  # an empty or never-indexed store still gets its pages
    server = make_server(
        ServerConfig(
            store=root,
            host=args.host,
            port=args.port,
            htpasswd=args.htpasswd,
            read_auth=args.read_auth,
            max_upload=parse_size(args.max_upload, what="--max-upload"),
            max_connections=-(-args.max_connections // args.workers),  # each worker's share
            wheel_limits=wheel_limits_from_args(args),
        )
    )
    logger.configure(timestamps=True)  # the request log, each line with its time
    uploads = (
        f"with credentials from {args.htpasswd}" if args.htpasswd else "disabled (no --htpasswd)"
    )
    print(
        f"serving {root.absolute()} at {server.url}simple/"
        f" (per variant: {server.url}<variant>/simple/)"
    )
    print(
        f"    reads: {'credentials required' if args.read_auth else 'open'}; uploads: {uploads}; "
        "unknown names: 404 (no fallback)",
        flush=True,
    )
    try:
        serve_workers(server, args.workers)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
