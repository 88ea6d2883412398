"""The store as a local directory (the embedded default).

Exclusive create is a hard link from a fully written temp file (``link`` fails if the name
exists, so a reader never sees half a file and two writers never both win); compare-and-swap
is a compare under an ``flock`` and an ``os.replace``. Temp names start with a dot, which
``check_key`` never allows, so they cannot collide with real keys and listings skip them; a
writer killed mid-write leaves one behind, which ``strays`` reports and ``remove_stale_temps``
removes once it is older than a grace period. Reads never follow a symlink below the root
(``open_file``): a link planted in the store cannot serve a file from outside it.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from factory.errors import StoreError
from factory.store.base import FILES, WHEEL_VARIANTS, StoreBase, StoreObject, Stray, check_key

_LOCK_NAME = ".lock"
TEMP_PREFIX = ".tmp-"  # the server's upload directories use it too


def _token(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalStore(StoreBase):
    def __init__(self, root: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.root = Path(root).absolute()
        self.url = str(self.root)
        self.durable = durable  # False only where losing files on power loss is fine (benchmarks)

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    # -- reads --------------------------------------------------------------------------------
    def open_file(self, key: str) -> BinaryIO:
        """Open a regular file for reading, following no symlink below the root (openat walk
        with O_NOFOLLOW: no window between a check and the open). Raises FileNotFoundError
        when absent, OSError (ELOOP, ENOTDIR) for a symlink or anything else on the way."""
        parts = check_key(key).split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = below
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(leaf).st_mode):  # a directory, a FIFO, a device
            os.close(leaf)
            raise IsADirectoryError(f"{key} is not a regular file")
        return os.fdopen(leaf, "rb")

    def read(self, key: str) -> bytes | None:
        try:
            with self.open_file(key) as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {key} from {self.url}: {exc.strerror or exc}") from None

    def read_with_token(self, key: str) -> tuple[bytes | None, str | None]:
        data = self.read(key)
        return data, (None if data is None else _token(data))

    def list(self, prefix: str, *, sizes: bool = True) -> Iterator[StoreObject]:
        # Walk only the directory the prefix names, then filter on the rest of it.
        base, _, _ = prefix.rpartition("/")
        start = self.root / base if base else self.root
        if not start.is_dir():
            return
        stack = [(start, base)]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith(".") or entry.is_symlink():  # not objects: see strays
                    continue
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append((Path(entry.path), key))
                elif key.startswith(prefix):
                    if not sizes:
                        yield StoreObject(key=key, size=0)
                        continue
                    try:
                        yield StoreObject(key=key, size=entry.stat(follow_symlinks=False).st_size)
                    except FileNotFoundError:  # deleted while listing (a page)
                        continue

    def page_objects(self) -> builtins.list[StoreObject]:
        # Skip the files/ tree instead of walking and discarding it.
        try:
            tops = [
                e.name
                for e in os.scandir(self.root)
                if not e.name.startswith(".") and not e.is_symlink()
            ]
        except FileNotFoundError:
            return []
        out: builtins.list[StoreObject] = []
        for name in tops:
            if name in (FILES, WHEEL_VARIANTS):
                continue
            path = self.root / name
            if path.is_file():
                out.append(StoreObject(key=name, size=path.stat().st_size))
            else:
                out.extend(self.list(f"{name}/"))
        return out

    # -- writes -------------------------------------------------------------------------------
    def _temp_for(self, final: Path) -> Path:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {final.parent}: {exc.strerror}") from None
        return final.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"

    def _write_temp(self, temp: Path, data: bytes | Path, *, durable: bool) -> None:
        try:
            with open(temp, "xb") as out:
                if isinstance(data, Path):
                    with open(data, "rb") as src:
                        shutil.copyfileobj(src, out, 1024 * 1024)
                else:
                    out.write(data)
                if durable:
                    out.flush()
                    os.fsync(out.fileno())
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise StoreError(f"cannot write {temp.parent}: {exc.strerror}") from None

    def put_new(self, key: str, data: bytes | Path) -> bool:
        final = self.path(key)
        temp = self._temp_for(final)
        try:
            # Published files are the source of truth: make them durable before they appear.
            self._write_temp(temp, data, durable=self.durable)
            try:
                os.link(temp, final)
            except FileExistsError:
                return False
            except OSError as exc:
                raise StoreError(f"cannot create {key} in {self.url}: {exc.strerror}") from None
            return True
        finally:
            temp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
            yield
        finally:
            os.close(fd)

    def put_if(self, key: str, data: bytes, token: str | None, *, content_type: str = "") -> bool:
        final = self.path(key)
        temp = self._temp_for(final)
        try:
            self._write_temp(temp, data, durable=False)  # pages can always be rebuilt
            with self._locked():
                _, current = self.read_with_token(key)
                if current != token:
                    return False
                os.replace(temp, final)
                return True
        finally:
            temp.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        with self._locked():
            self.path(key).unlink(missing_ok=True)

    # -- housekeeping -------------------------------------------------------------------------
    def strays(self) -> builtins.list[Stray]:
        """Temp files and directories left by killed writers, and symlinks (never created by
        the factory; the server does not follow them)."""
        now = time.time()
        out: builtins.list[Stray] = []
        stack = [(str(self.root), "")]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    if entry.is_symlink():
                        out.append(Stray(key=key, kind="symlink", age=0.0))
                    elif entry.name.startswith(TEMP_PREFIX):
                        age = now - _newest_mtime(Path(entry.path))
                        out.append(Stray(key=key, kind="temp", age=max(age, 0.0)))
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, key))
                except FileNotFoundError:  # renamed or removed meanwhile
                    continue
        return sorted(out, key=lambda s: s.key)

    def remove_stale_temps(self, older_than: float) -> builtins.list[str]:
        removed = []
        for stray in self.strays():
            if stray.kind != "temp" or stray.age < older_than:
                continue
            path = self.root / stray.key
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(stray.key)
        return removed


def _newest_mtime(path: Path) -> float:
    """A temp directory is as old as its newest file: an upload still arriving is young."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for child in path.rglob("*"):
            try:
                newest = max(newest, child.lstat().st_mtime)
            except FileNotFoundError:
                continue
    return newest
