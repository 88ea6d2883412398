"""The store as a local directory (the embedded default).

Exclusive create is a hard link from a fully written temp file (``link`` fails if the name
exists, so a reader never sees half a file and two writers never both win); compare-and-swap
is a compare under an ``flock`` and an ``os.replace``. Temp names start with a dot, which
``check_key`` never allows, so they cannot collide with real keys and listings skip them.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from factory.errors import StoreError
from factory.index.store.base import FILES, WHEEL_VARIANTS, StoreBase, StoreObject, check_key

_LOCK_NAME = ".lock"


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
    def read(self, key: str) -> bytes | None:
        try:
            with open(os.path.join(self.url, check_key(key)), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {key} from {self.url}: {exc.strerror}") from None

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
                if entry.name.startswith("."):
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
                e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith(".")
            ]
            tops += [
                e.name for e in os.scandir(self.root) if e.is_file() and not e.name.startswith(".")
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
        return final.parent / f".tmp-{uuid.uuid4().hex}"

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
