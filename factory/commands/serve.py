"""factory serve [--store STORE] [--host H] [--port P] [--tls-cert FILE --tls-key FILE]
[--htpasswd FILE] [--read-auth] [--max-upload SIZE] [--max-connections N] [--workers N]
[--max-unpacked SIZE] [--max-ratio N]

The default address is 127.0.0.1, the one a reverse proxy on the same machine forwards to
(docs/DEPLOY.md); hosts on the network need ``--host 0.0.0.0`` (or the machine's address), said
on the command line so that serving a store to a network is a decision, not a default.
"""

from __future__ import annotations

import argparse
import socket
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
from factory.index.tls_front import listen, start_front, stop_front, tls_context
from factory.store import open_existing_store, url_scheme
from factory.units import parse_size


def configure(parser: argparse.ArgumentParser) -> None:
    add_store_arg(parser)
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only, e.g. behind a "
        "reverse proxy; 0.0.0.0: every interface, for hosts on the network)",
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)"
    )
    parser.add_argument(
        "--tls-cert", type=Path, default=None, metavar="FILE",
        help="serve https with this PEM certificate chain (and --tls-key)",
    )
    parser.add_argument(
        "--tls-key", type=Path, default=None, metavar="FILE", help="the certificate's PEM key"
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
        " --max-connections holds for all of them together",
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
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    spec = store_from_args(args)
    if url_scheme(spec) is not None:
        raise UsageError(
            "factory serve serves a local store",
            tip="put a static host or CDN in front of the bucket (docs/INDEX.md)",
        )

    store = open_existing_store(spec)  # missing or unreadable: one line, exit 11
    root = Path(spec)
    logger.configure(timestamps=True)  # the request log, with times (and start warnings)
    if not (root / "simple").is_dir():
        rebuild_index(store)  # an empty or never-indexed store still gets its pages
    front_socket = listen(args.host, args.port) if tls else None
    server = make_server(
        ServerConfig(
            store=root,
            host="127.0.0.1" if tls else args.host,  # behind the front: loopback only
            port=0 if tls else args.port,
            htpasswd=args.htpasswd,
            read_auth=args.read_auth,
            max_upload=parse_size(args.max_upload, what="--max-upload"),
            max_connections=args.max_connections,  # for all workers together
            wheel_limits=wheel_limits_from_args(args),
        )
    )
    uploads = (
        f"with credentials from {args.htpasswd}" if args.htpasswd else "disabled (no --htpasswd)"
    )
    if front_socket is not None:
        url = public_url("https", args.host, int(front_socket.getsockname()[1]))
    else:
        url = public_url("http", args.host, int(server.server_address[1]))
    print(f"serving {root.absolute()} at {url}simple/ (per variant: {url}<variant>/simple/)")
    print(
        f"    reads: {'credentials required' if args.read_auth else 'open'}; uploads: {uploads}; "
        "unknown names: 404 (no fallback)",
    )
    print(f"    on a GPU host: factory doctor --index {url}", flush=True)
    front = None
    if tls is not None and front_socket is not None:  # before any thread: the front is forked
        upstream = ("127.0.0.1", int(server.server_address[1]))
        front = start_front(front_socket, tls, upstream, close_in_child=(server.socket,))
        front_socket.close()
    try:
        serve_workers(server, args.workers)
    except KeyboardInterrupt:
        pass
    finally:
        if front is not None:
            stop_front(front)
        server.server_close()
    return 0


def public_url(scheme: str, host: str, port: int) -> str:
    """The URL hosts use: the host as given (a name stays a name, as a certificate names it); a
    wildcard address is named by this machine's host name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"
