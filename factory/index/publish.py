"""Publishing wheels into the store, and yanking them (PEP 592).

Check, then change: every wheel is inspected (name and version against its own METADATA, a
valid zip with RECORD, no path tricks) before anything is written. Then, per wheel: the wheel,
its PEP 658 ``.metadata``, its provenance manifest, and last the ``.entry.json`` that commits
it; files are created exclusively, so the same bytes again change nothing and different bytes
under a published name are refused. Only then are the affected index pages rewritten.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from factory.errors import ConflictError, StoreError, WheelError
from factory.index.store.base import (
    ENTRY_SUFFIX,
    METADATA_SUFFIX,
    PROVENANCE_SUFFIX,
    YANK_SUFFIX,
    Store,
    WheelEntry,
    check_key,
    file_key,
)
from factory.index.writer import RebuildReport, rebuild_pages, update_index
from factory.matrix.tags import variant_of_filename
from factory.wheels.reader import (
    dist_info_dir,
    open_wheel,
    parse_filename,
    parse_headers,
    read_metadata,
)

_MAX_FILENAME = 200  # real ones stay under ~120 even with compressed manylinux tag sets


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckedWheel:
    """A wheel checked for the index, with what its entry and its ``.metadata`` file need."""

    filename: str
    project: str  # canonical
    version: str
    requires_python: str | None
    metadata: bytes  # the wheel's METADATA file, served as <wheel>.metadata
    sha256: str
    size: int
    variant: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublishReport:
    published: tuple[str, ...]  # newly added filenames
    unchanged: tuple[str, ...]  # already there with the same bytes
    pages_changed: int


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def inspect_wheel(source: Path | bytes, filename: str | None = None) -> CheckedWheel:
    """Validate a wheel and read what the index needs. Raises WheelError with one line."""
    name = filename or (source.name if isinstance(source, Path) else "")
    if "/" in name or "\\" in name:
        raise WheelError(f"unsafe wheel filename {name[:80]!r}")
    if len(name) > _MAX_FILENAME:
        raise WheelError(f"wheel filename too long ({len(name)} > {_MAX_FILENAME} characters)")
    try:
        check_key(name)
    except StoreError:
        raise WheelError(f"invalid wheel filename {name[:80]!r}") from None
    parsed = parse_filename(name)
    if not parsed.tags or any(not (t.interpreter and t.abi and t.platform) for t in parsed.tags):
        raise WheelError(f"invalid wheel filename {name[:80]!r}: an empty tag")  # 'any..whl'
    project, version = parsed.distribution, parsed.version
    try:
        if isinstance(source, Path):
            sha256, size = _sha256_file(source)
        else:
            sha256, size = hashlib.sha256(source).hexdigest(), len(source)
    except OSError as exc:
        raise WheelError(f"{name}: cannot read: {exc.strerror or exc}") from None
    with open_wheel(source, name) as archive:
        members = archive.namelist()
        for member in members:
            parts = member.split("/")
            if member.startswith("/") or "\\" in member or ".." in parts or ":" in parts[0]:
                raise WheelError(f"{name}: unsafe path in archive: {member[:80]!r}")
        dist_info = dist_info_dir(members, name)
        for required in ("METADATA", "RECORD", "WHEEL"):
            if f"{dist_info}/{required}" not in members:
                raise WheelError(f"{name}: {dist_info}/{required} is missing")
        try:
            bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise WheelError(f"{name}: corrupt zip ({exc})") from None
        if bad is not None:
            raise WheelError(f"{name}: corrupt member {bad[:80]!r} (CRC mismatch)")
        metadata = read_metadata(archive, dist_info, name)
    headers = parse_headers(metadata, "METADATA", name)
    meta_name, meta_version = headers.get("Name"), headers.get("Version")
    if not meta_name or not meta_version:
        raise WheelError(f"{name}: METADATA has no Name or Version")
    if canonicalize_name(str(meta_name)) != project:
        raise WheelError(f"{name}: filename says {project!r} but METADATA says {str(meta_name)!r}")
    try:
        same_version = Version(str(meta_version)) == version
    except Exception:
        same_version = False
    if not same_version:
        raise WheelError(
            f"{name}: filename says version {version} but METADATA says {str(meta_version)!r}"
        )
    requires_python = headers.get("Requires-Python")
    return CheckedWheel(
        filename=name,
        project=project,
        version=str(version),
        requires_python=str(requires_python).strip() if requires_python else None,
        metadata=metadata,
        sha256=sha256,
        size=size,
        variant=variant_of_filename(name),
    )


def _read_provenance(wheel: Path, info: CheckedWheel) -> bytes | None:
    path = wheel.with_name(wheel.name + PROVENANCE_SUFFIX)
    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        doc = json.loads(data)
    except ValueError:
        raise WheelError(f"{path.name}: not valid JSON") from None
    if not isinstance(doc, dict):
        raise WheelError(f"{path.name}: not a JSON object")
    if "sha256" in doc and doc["sha256"] != info.sha256:
        raise WheelError(f"{path.name}: its sha256 does not match {wheel.name}")
    return data


def _entry_for(info: CheckedWheel) -> WheelEntry:
    return WheelEntry(
        filename=info.filename,
        project=info.project,
        version=info.version,
        sha256=info.sha256,
        size=info.size,
        metadata_sha256=hashlib.sha256(info.metadata).hexdigest(),
        requires_python=info.requires_python,
        variant=info.variant,
        uploaded=_now(),
    )


def _store_wheel(store: Store, source: Path, info: CheckedWheel, provenance: bytes | None) -> bool:
    """Upload one wheel and its side files, entry last. True if it was new."""
    key = file_key(info.project, info.filename)
    old_entry = store.read(key + ENTRY_SUFFIX)
    if old_entry is not None:
        if WheelEntry.from_json(old_entry).sha256 != info.sha256:
            raise ConflictError(
                f"{info.filename} is already published with different bytes",
                tip="'factory rebuild-check CELL' names the members that differ and why; "
                "files in the store are immutable",
            )
        return False
    created = store.put_new(key, source)
    if not created:
        stored = store.read(key)
        if stored is None or hashlib.sha256(stored).hexdigest() != info.sha256:
            raise ConflictError(f"{info.filename} is already in the store with different bytes")
    store.put_new(key + METADATA_SUFFIX, info.metadata)
    if provenance is not None:
        store.put_new(key + PROVENANCE_SUFFIX, provenance)  # the first manifest stays
    return store.put_new(key + ENTRY_SUFFIX, _entry_for(info).to_json()) or created


def publish(store: Store, wheels: Iterable[Path], *, update_pages: bool = True) -> PublishReport:
    """Add wheels to the store, then rewrite only the index pages they appear on."""
    checked = []
    for path in wheels:
        path = Path(path)
        try:
            is_file = path.is_file()
        except OSError as exc:  # a name longer than the filesystem allows, a loop of links
            raise WheelError(f"{str(path)[:120]}: {exc.strerror}") from None
        if not is_file:
            raise WheelError(f"{str(path)[:120]}: no such file")
        info = inspect_wheel(path)
        checked.append((path, info, _read_provenance(path, info)))
    published: list[str] = []
    unchanged: list[str] = []
    for path, info, provenance in checked:
        (published if _store_wheel(store, path, info, provenance) else unchanged).append(
            info.filename
        )
    entries = []
    for _, info, _ in checked:
        data = store.read(file_key(info.project, info.filename) + ENTRY_SUFFIX)
        if data is not None:
            entries.append(WheelEntry.from_json(data))
    changed = _update_pages(store, entries) if update_pages else 0
    return PublishReport(
        published=tuple(published), unchanged=tuple(unchanged), pages_changed=changed
    )


def commit_stored_wheel(store: Store, key: str) -> str:
    """Finish a publish that stopped after the wheel was uploaded: write the missing side files."""
    data = store.read(key)
    if data is None:
        raise StoreError(f"{key} vanished from {store.url}")
    info = inspect_wheel(data, key.rsplit("/", 1)[-1])
    if file_key(info.project, info.filename) != key:
        raise StoreError(f"{key} is stored under the wrong project")
    store.put_new(key + METADATA_SUFFIX, info.metadata)
    store.put_new(key + ENTRY_SUFFIX, _entry_for(info).to_json())
    return info.filename


def yank(store: Store, filename: str, reason: str) -> bool:
    """Mark a published file as yanked (PEP 592); False if it already was."""
    try:
        dist, _, _, _ = parse_wheel_filename(filename)
        key = file_key(canonicalize_name(dist), filename)
    except Exception:
        raise WheelError(f"invalid wheel filename {filename[:80]!r}") from None
    entry_data = store.read(key + ENTRY_SUFFIX)
    if entry_data is None:
        raise StoreError(f"{filename} is not published in {store.url}")
    doc = {"version": 1, "reason": reason, "yanked_at": _now()}
    created = store.put_new(key + YANK_SUFFIX, json.dumps(doc).encode())
    _update_pages(store, [WheelEntry.from_json(entry_data)])
    return created


def rebuild_index(store: Store) -> RebuildReport:
    """``index rebuild``: complete the publishes that stopped after their wheel was uploaded
    (store files first), then have the writer derive every page again."""
    started = time.perf_counter()
    completed = tuple(commit_stored_wheel(store, key) for key in store.uncommitted_wheels())
    report = rebuild_pages(store)
    return dataclasses.replace(report, completed=completed, seconds=time.perf_counter() - started)


def _update_pages(store: Store, entries: list[WheelEntry]) -> int:
    return update_index(store, entries)
