"""The Store: where wheels and their side files live, and where the index pages are written.

Two kinds of object share one key space:

* files under ``files/<project>/``: a wheel, its PEP 658 ``.metadata``, its provenance
  manifest, an ``.entry.json`` written last (the index entry: hashes and metadata the pages
  need, so a rebuild never re-hashes a wheel) and an optional ``.yank.json``. All of them are
  created once with an exclusive write and never changed.
* index pages (``simple/...``, ``<variant>/simple/...``, ``index.html``): derived, rewritten
  with compare-and-swap so concurrent publishers never drop each other's wheels.

A backend implements the few primitives of ``Store``; ``StoreBase`` builds the wheel-level
reads on top of them so both backends answer them the same way.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, runtime_checkable

from factory.errors import StoreError

FILES = "files"
WHEEL_VARIANTS = "wheel-variants"  # variant-labelled copies and their pages (wheel_variants.py)
ENTRY_SUFFIX = ".entry.json"
YANK_SUFFIX = ".yank.json"
METADATA_SUFFIX = ".metadata"
PROVENANCE_SUFFIX = ".provenance.json"

# What HTTP caches may do with an object: files never change once written; pages change on
# every publish. The embedded server sends these, and the S3 store writes them onto the objects
# so a CDN in front of the bucket does the same.
FILE_CACHE_CONTROL = "public, max-age=31536000, immutable"
PAGE_CACHE_CONTROL = "public, max-age=60"


def cache_control(key: str) -> str:
    immutable = key.startswith((f"{FILES}/", f"{WHEEL_VARIANTS}/{FILES}/"))
    return FILE_CACHE_CONTROL if immutable else PAGE_CACHE_CONTROL


# One path segment: no separators, no dot-only names, nothing a URL or shell would reinterpret.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}$")


def check_key(key: str) -> str:
    """Refuse keys that could escape the store root or mean two things."""
    parts = key.split("/")
    if not key or any(not _SEGMENT_RE.match(p) or p in {".", ".."} for p in parts):
        raise StoreError(f"unsafe store key {key!r}")
    return key


def file_key(project: str, filename: str, suffix: str = "") -> str:
    return check_key(f"{FILES}/{project}/{filename}{suffix}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreObject:
    key: str
    size: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelEntry:
    """What the index needs to know about one published wheel (``<wheel>.entry.json``)."""

    filename: str
    project: str  # canonical name
    version: str
    sha256: str
    size: int
    metadata_sha256: str
    requires_python: str | None
    variant: str | None  # 'cu130-torch2.14', None for untagged wheels
    uploaded: str  # ISO 8601 UTC
    yanked: str | None = None  # the reason ('' is allowed by PEP 592), None if not yanked

    @property
    def key(self) -> str:
        return file_key(self.project, self.filename)

    def to_json(self) -> bytes:
        d = dataclasses.asdict(self)
        d.pop("yanked")  # the yank lives in its own file: entries never change
        d["dist_version"] = d.pop("version")  # "version" is the format's own version
        return json.dumps({"version": 1, **d}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, yanked: str | None = None) -> WheelEntry:
        try:
            d = json.loads(data)
            if d.pop("version") != 1:
                raise ValueError("unknown entry format version")
            d["version"] = d.pop("dist_version")
            return cls(**d, yanked=yanked)
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"corrupt index entry: {exc}") from None


def yank_reason(data: bytes) -> str:
    """The reason in a ``.yank.json`` (PEP 592 allows ''). The file being there is the yank: a
    record that does not parse still yanks, with no reason, rather than failing every page."""
    try:
        doc = json.loads(data)
    except ValueError:
        return ""
    reason = doc.get("reason", "") if isinstance(doc, dict) else ""
    return reason if isinstance(reason, str) else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stray:
    """Something in the store that is not an object: a writer's temp file, or a symlink."""

    key: str
    kind: str  # 'temp' | 'symlink'
    age: float  # seconds since it last changed (0 for symlinks)


@runtime_checkable
class Store(Protocol):
    """The primitives a backend provides, plus the wheel-level reads of ``StoreBase``."""

    url: str

    def read(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        """Bytes and version token (both None when absent), for a later ``put_if``."""

    def put_new(self, key: str, data: bytes | Path) -> bool:
        """Create the object only if absent (exclusive); False when it already exists."""

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str) -> bool:
        """Compare-and-swap: write only if the current token is ``token`` (None: absent)."""

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[StoreObject]:
        """Every object whose key starts with ``prefix``, in no particular order.

        ``sizes=False`` lets a backend report size 0 where sizes cost extra (a stat each)."""

    def read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]: ...

    def page_objects(self) -> builtins.list[StoreObject]: ...

    def uncommitted_wheels(self) -> builtins.list[str]: ...

    def published_content_keys(self) -> set[str]: ...

    def published_wheel_names(self) -> set[str]: ...

    def wheels(
        self, project: str | None = None, *, known: dict[str, WheelEntry] | None = None
    ) -> builtins.list[WheelEntry]: ...

    def strays(self) -> builtins.list[Stray]: ...

    def remove_stale_temps(self, older_than: float) -> builtins.list[str]: ...


class UrlStore(Protocol):
    """What the store registry holds for a scheme: the class of a URL store."""

    url_form: str  # what its spec looks like ('s3://bucket/prefix'), for messages

    def from_url(self, url: str) -> Store:
        """The store a spec of this scheme names; nothing is contacted yet."""
        ...


class StoreBase:
    """Wheel-level reads shared by the backends; they only need the primitives."""

    url: str

    # primitives, provided by the backend
    def read(self, key: str) -> bytes | None:
        raise NotImplementedError

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[StoreObject]:
        raise NotImplementedError

    def read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]:
        """``read`` for many keys, in order; parallel where reads are round trips (S3)."""
        return self._read_many(keys)

    def _read_many(self, keys: builtins.list[str]) -> builtins.list[bytes | None]:
        return [self.read(k) for k in keys]

    def strays(self) -> builtins.list[Stray]:
        """Leftovers that are not objects; none where writes are atomic (S3)."""
        return []

    def remove_stale_temps(self, older_than: float) -> builtins.list[str]:
        return []

    def page_objects(self) -> builtins.list[StoreObject]:
        """Every object that is not under ``files/`` (nor the wheel-variants tree): the pages."""
        return [
            o for o in self.list("") if not o.key.startswith((f"{FILES}/", f"{WHEEL_VARIANTS}/"))
        ]

    def wheels(
        self, project: str | None = None, *, known: dict[str, WheelEntry] | None = None
    ) -> builtins.list[WheelEntry]:
        """Every committed wheel (its entry written), with yank state, sorted by filename.

        ``known`` (wheel key -> entry, from an earlier listing moments ago) saves reading the
        entries again: an entry is written once and never changed, so one still listed is the
        one read before. Yank records are always read: they come and go."""
        prefix = f"{FILES}/{project}/" if project else f"{FILES}/"
        entry_keys: builtins.list[str] = []
        yank_keys: builtins.list[str] = []
        for obj in self.list(prefix, sizes=False):
            if obj.key.endswith(ENTRY_SUFFIX):
                entry_keys.append(obj.key)
            elif obj.key.endswith(YANK_SUFFIX):
                yank_keys.append(obj.key)
        yanks: dict[str, str] = {}
        for key, data in zip(yank_keys, self._read_many(yank_keys), strict=True):
            if data is not None:
                yanks[key[: -len(YANK_SUFFIX)]] = yank_reason(data)
        known = known or {}
        wheel_keys = [k[: -len(ENTRY_SUFFIX)] for k in entry_keys]
        unknown = [k for k in wheel_keys if k not in known]
        parsed = {k: known[k] for k in wheel_keys if k in known}
        blobs = self._read_many([k + ENTRY_SUFFIX for k in unknown])
        for key, data in zip(unknown, blobs, strict=True):
            if data is not None:
                parsed[key] = WheelEntry.from_json(data)
        entries = [dataclasses.replace(e, yanked=yanks.get(k)) for k, e in parsed.items()]
        entries.sort(key=lambda e: e.filename)
        return entries

    def uncommitted_wheels(self) -> builtins.list[str]:
        """Keys of wheels whose entry is missing: a publisher stopped between upload and commit."""
        wheels, entries = set(), set()
        for obj in self.list(f"{FILES}/", sizes=False):
            if obj.key.endswith(".whl"):
                wheels.add(obj.key)
            elif obj.key.endswith(ENTRY_SUFFIX):
                entries.add(obj.key[: -len(ENTRY_SUFFIX)])
        return sorted(wheels - entries)

    def published_wheel_names(self) -> set[str]:
        """The filename of every committed wheel (its entry written)."""
        return {o.key.rsplit("/", 1)[-1][: -len(ENTRY_SUFFIX)]
                for o in self.list(f"{FILES}/", sizes=False) if o.key.endswith(ENTRY_SUFFIX)}

    def published_content_keys(self) -> set[str]:
        """The ``content_key`` of every provenance manifest whose wheel is in the store."""
        keys = [o.key for o in self.list(f"{FILES}/", sizes=False)]
        present = set(keys)
        manifests = [
            k
            for k in keys
            if k.endswith(PROVENANCE_SUFFIX) and k[: -len(PROVENANCE_SUFFIX)] in present
        ]
        out: set[str] = set()
        for key, data in zip(manifests, self._read_many(manifests), strict=True):
            try:
                value = json.loads(data or b"{}").get("content_key")
            except (ValueError, AttributeError):
                raise StoreError(f"corrupt provenance manifest {key}") from None
            if isinstance(value, str) and value:
                out.add(value)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Published:
    """What a store has, for "is this cell built?": the content keys of its manifests, and its
    wheel filenames. A cell counts as built when either is there: a wheel is made per torch
    minor (its local tag and its ``torch==MAJ.MIN.*`` pin), so the cell of a new torch patch
    release names a wheel that is already published."""

    content_keys: frozenset[str]
    wheels: frozenset[str]

    def has(self, content_key: str, wheel: str) -> bool:
        return content_key in self.content_keys or wheel in self.wheels


def published(store: Store) -> Published:
    return Published(content_keys=frozenset(store.published_content_keys()),
                     wheels=frozenset(store.published_wheel_names()))


def parallel_reads(
    store: StoreBase, keys: builtins.list[str], workers: int = 16
) -> builtins.list[bytes | None]:
    if len(keys) < 2:
        return [store.read(k) for k in keys]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(store.read, keys))
