"""Publishing wheels into the store, and yanking them (PEP 592).

Check, then change: every wheel is checked strictly (factory.wheels.checks: tags, core
metadata, member names, sizes, RECORD hashes) before anything is written. Then, per wheel:
the wheel, its PEP 658 ``.metadata``, its provenance manifest, and last the ``.entry.json``
that commits it; files are created exclusively, so the same bytes again change nothing and
different bytes under a published name are refused. Then the affected index pages are rewritten.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from factory.errors import ConflictError, StoreError, WheelError
from factory.index.writer import RebuildReport, rebuild_pages, update_index
from factory.matrix.tags import variant_of_filename
from factory.store.base import (
    ENTRY_SUFFIX,
    METADATA_SUFFIX,
    PROVENANCE_SUFFIX,
    YANK_SUFFIX,
    Store,
    WheelEntry,
    file_key,
)
from factory.wheels.checks import DEFAULT_LIMITS, WheelLimits, check_filename, check_wheel
from factory.wheels.reader import require_file


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


def inspect_wheel(
    source: Path | bytes, filename: str | None = None, *, limits: WheelLimits = DEFAULT_LIMITS
) -> CheckedWheel:
    """Check a wheel strictly (factory.wheels.checks) and read what the index needs.
    Raises WheelError with one line."""
    if isinstance(source, bytes):  # a stored wheel read back (commit_stored_wheel)
        name = filename or ""
        check_filename(name)
        with tempfile.TemporaryDirectory(prefix="factory-inspect-") as tmp:
            path = Path(tmp) / name
            path.write_bytes(source)
            return inspect_wheel(path, limits=limits)
    vetted = check_wheel(source, limits)
    try:
        sha256, size = _sha256_file(source)
    except OSError as exc:
        raise WheelError(f"{source.name}: cannot read: {exc.strerror or exc}") from None
    return CheckedWheel(
        filename=source.name,
        project=canonicalize_name(vetted.info.filename_name),
        version=str(Version(vetted.info.filename_version)),
        requires_python=vetted.info.requires_python,
        metadata=vetted.metadata,
        sha256=sha256,
        size=size,
        variant=variant_of_filename(source.name),
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
    _put_side_file(store, key + METADATA_SUFFIX, info.metadata)
    if created:
        # The wheel is new, so any side file already there is a deleted build's (a retention
        # delete that stopped before its last step): it must not yank, or describe, this one.
        store.delete(key + YANK_SUFFIX)
    if provenance is not None:
        if created:
            _put_side_file(store, key + PROVENANCE_SUFFIX, provenance)
        else:
            store.put_new(key + PROVENANCE_SUFFIX, provenance)  # the first manifest stays
    return store.put_new(key + ENTRY_SUFFIX, _entry_for(info).to_json()) or created


def _put_side_file(store: Store, key: str, data: bytes) -> None:
    """Create a side file, or make the one there ``data`` if it is not (the ``.metadata`` is
    the wheel's METADATA, whatever a stopped deletion left under its name)."""
    if store.put_new(key, data):
        return
    current, token = store.read_with_token(key)
    if current != data:
        store.put_if(key, data, token, content_type="application/octet-stream")


def publish(
    store: Store,
    wheels: Iterable[Path],
    *,
    update_pages: bool = True,
    limits: WheelLimits = DEFAULT_LIMITS,
) -> PublishReport:
    """Add wheels to the store, then rewrite only the index pages they appear on."""
    checked = []
    for path in wheels:
        path = require_file(Path(path))
        info = inspect_wheel(path, limits=limits)
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
    _put_side_file(store, key + METADATA_SUFFIX, info.metadata)
    store.put_new(key + ENTRY_SUFFIX, _entry_for(info).to_json())
    return info.filename


def _published_key(store: Store, filename: str) -> str:
    """The store key of a published wheel; raises when the name is bad or not published."""
    try:
        dist, _, _, _ = parse_wheel_filename(filename)
        key = file_key(canonicalize_name(dist), filename)
    except Exception:
        raise WheelError(f"invalid wheel filename {filename[:80]!r}") from None
    if store.read(key + ENTRY_SUFFIX) is None:
        raise StoreError(f"{filename} is not published in {store.url}")
    return key


def yank(store: Store, filename: str, reason: str) -> bool:
    """Mark a published file as yanked (PEP 592); False if it already was."""
    key = _published_key(store, filename)
    entry_data = store.read(key + ENTRY_SUFFIX)
    assert entry_data is not None  # _published_key checked it
    doc = {"version": 1, "reason": reason, "yanked_at": _now()}
    created = store.put_new(key + YANK_SUFFIX, json.dumps(doc).encode())
    _update_pages(store, [WheelEntry.from_json(entry_data)])
    return created


TEMP_GRACE = 3600.0  # a temp file this old has no live writer (uploads keep theirs fresh)


def unyank(store: Store, filename: str) -> bool:
    """Undo a yank: remove the ``.yank.json`` and rewrite the pages; False if it was not yanked."""
    key = _published_key(store, filename)
    if store.read(key + YANK_SUFFIX) is None:
        return False
    store.delete(key + YANK_SUFFIX)
    entry_data = store.read(key + ENTRY_SUFFIX)
    assert entry_data is not None  # _published_key checked it
    _update_pages(store, [WheelEntry.from_json(entry_data)])
    return True


def rebuild_index(store: Store, *, temp_grace: float = TEMP_GRACE) -> RebuildReport:
    """``index rebuild``: remove the temp files of writers that died more than ``temp_grace``
    seconds ago, complete the publishes that stopped after their wheel was uploaded (store
    files first), then have the writer derive every page again."""
    started = time.perf_counter()
    temps_removed = tuple(store.remove_stale_temps(temp_grace))
    completed = tuple(commit_stored_wheel(store, key) for key in store.uncommitted_wheels())
    report = rebuild_pages(store)
    return dataclasses.replace(
        report,
        completed=completed,
        seconds=time.perf_counter() - started,
        temps_removed=temps_removed,
    )


def _update_pages(store: Store, entries: list[WheelEntry]) -> int:
    return update_index(store, entries)
