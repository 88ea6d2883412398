"""Reading a factory index for the doctor: its PEP 503 pages through a directory or an
http(s)/file URL (stdlib only), into ``IndexFile`` facts; and ``IndexAccess``, what an
installer needs to reach that index besides its URL (plain http by name: pip and PDM refuse it
unless told to trust the host; https with a private CA: the CA bundle)."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from factory.errors import StoreError, UsageError, WheelError
from factory.links import Anchor, parse_anchors
from factory.matrix.tags import VARIANT_RE, LocalTag, parse_local


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexAccess:
    """How installers reach the index, besides its URL."""

    url: str  # the index root as given
    cert: Path | None = None  # the CA bundle that verifies an https index (a private CA)

    @property
    def host(self) -> str:
        """host[:port] without credentials, as pip's --trusted-host takes it."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{parts.port}" if parts.port else host

    @property
    def plain_http(self) -> bool:
        """Plain http to a host that pip and PDM do not trust by themselves: they treat only
        https, ``localhost`` and loopback addresses as secure, and ignore any other http index
        ("not a trusted or secure host") unless told to trust it."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme != "http":
            return False
        host = parts.hostname or ""
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name: trusted only when told
            return True

    @property
    def private_ca(self) -> Path | None:
        """The CA bundle to give installers (https only)."""
        return self.cert if urllib.parse.urlsplit(self.url).scheme == "https" else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    project: str
    version: Version
    interpreters: frozenset[str]
    abis: frozenset[str]
    platforms: frozenset[str]
    local: LocalTag | None  # None: not a factory-tagged wheel
    yanked: str | None

    @property
    def cuda(self) -> str | None:
        return self.local.cuda if self.local else None

    @property
    def variant(self) -> str | None:
        """The per-variant index this file is on: 'cu130-torch2.14-sm100' (see tags.py)."""
        if self.local is None:
            return None
        return self.local.variant


def _file_from_link(anchor: Anchor) -> IndexFile | None:
    attrs, text, href = anchor.attrs, anchor.text, anchor.href
    name = urllib.parse.unquote(href.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]) or text
    if not name.endswith(".whl"):
        return None  # sdists and other files: the doctor installs wheels only
    try:
        dist, version, _, tags = parse_wheel_filename(name)
    except Exception:  # a malformed name on someone's index is not the doctor's failure
        return None
    try:
        local = parse_local(version.local) if version.local else None
    except WheelError:
        local = None
    return IndexFile(
        filename=name,
        project=canonicalize_name(dist),
        version=version,
        interpreters=frozenset(t.interpreter for t in tags),
        abis=frozenset(t.abi for t in tags),
        platforms=frozenset(t.platform for t in tags),
        local=local,
        yanked=attrs.get("data-yanked") if "data-yanked" in attrs else None,
    )


class IndexReader:
    """A factory index tree read through a directory path or an http(s)/file URL (stdlib only).

    ``root`` is the tree's top: ``<root>/simple/<project>/`` holds every variant and
    ``<root>/<variant>/simple/<project>/`` one each. A URL that already ends in ``/simple/`` (or
    ``/<variant>/simple/``) is taken back to the top."""

    def __init__(self, location: str, *, cert: Path | None = None) -> None:
        self.location = location
        self.cert = cert
        if re.match(r"^https?://", location):
            self._dir: Path | None = None
            base = location.rstrip("/")
        else:
            path = Path(location[len("file://"):] if location.startswith("file://") else location)
            if not path.is_dir():
                raise UsageError(f"index {location!r} is neither an http(s) URL nor a directory")
            self._dir = path.resolve()
            base = self._dir.as_uri()
        parts = base.split("/")
        if parts[-1] == "simple":
            parts.pop()
            if parts and VARIANT_RE.match(parts[-1]):
                parts.pop()
        self.root_url = "/".join(parts)

    def variant_url(self, variant: str | None) -> str:
        return f"{self.root_url}/{variant}/simple/" if variant else f"{self.root_url}/simple/"

    def _get(self, rel: str) -> bytes | None:
        """A page by path below the root; None when it does not exist."""
        if self._dir is not None:
            path = self._dir / rel / "index.html"
            try:
                return path.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:
                raise StoreError(f"cannot read {path}: {exc.strerror}") from None
        url = f"{self.root_url}/{rel}/"
        request = urllib.request.Request(url, headers={"Accept": "text/html"})
        try:
            with urllib.request.urlopen(request, timeout=60, context=self._context) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise StoreError(f"index {url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise StoreError(
                    f"cannot verify the certificate of {url}: {reason.verify_message}",
                    tip="a private CA signed it? pass --cert FILE, the CA bundle that does",
                ) from None
            raise StoreError(f"cannot reach the index at {url}: {reason}") from None

    @functools.cached_property
    def _context(self) -> ssl.SSLContext | None:
        if not self.root_url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=str(self.cert) if self.cert else None)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"cannot read the CA bundle {self.cert}: {exc}") from None

    def projects(self) -> list[str]:
        page = self._get("simple")
        if page is None:
            raise StoreError(
                f"no index at {self.location}: {self.variant_url(None)} does not exist",
                tip="point --index at the index root (the directory or URL above simple/)",
            )
        return sorted({canonicalize_name(a.text or a.href.strip("/")) for a in parse_anchors(page)})

    def files(self, project: str, variant: str | None = None) -> list[IndexFile] | None:
        rel = f"{variant}/simple/{project}" if variant else f"simple/{project}"
        page = self._get(rel)
        if page is None:
            return None
        out = [f for a in parse_anchors(page) if (f := _file_from_link(a))]
        return [f for f in out if f.project == project]
