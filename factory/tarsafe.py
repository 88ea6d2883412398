"""Unpacking tar archives on every Python the project runs on. tarfile's extraction filters
(PEP 706: ``filter="data"`` refuses absolute names, ``..``, links out of the destination and
special files) exist from 3.10.12 and 3.11.4; Ubuntu 22.04's 3.10 and Debian 12's 3.11.2 have
none and raise TypeError on the keyword. There the same refusals are made here, before
anything is written."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

HAS_FILTERS = hasattr(tarfile, "data_filter")


def _checked(members: list[tarfile.TarInfo], dest: Path) -> list[tarfile.TarInfo]:
    """What the 'data' filter would pass, or TarError naming the first member it would not."""
    root = os.path.realpath(dest)
    out = []
    for m in members:
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts:
            raise tarfile.TarError(f"member {m.name!r} points outside the destination")
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise tarfile.TarError(f"member {m.name!r} is a special file")
        if m.issym() or m.islnk():
            base = os.path.dirname(os.path.join(root, m.name)) if m.issym() else root
            target = os.path.realpath(os.path.join(base, m.linkname))
            if os.path.commonpath([root, target]) != root:
                raise tarfile.TarError(f"link {m.name!r} points outside the destination")
        m.mode &= 0o755  # no setuid, setgid or sticky bits, nothing writable by others
        out.append(m)
    return out


def extract(tf: tarfile.TarFile, dest: Path, *, trusted: bool = False,
            members: list[tarfile.TarInfo] | None = None) -> None:
    """Unpack ``tf`` (or those ``members`` of it) into ``dest``: the 'data' filter for archives
    from elsewhere (an sdist, NVIDIA's redist archives), the 'tar' filter for our own (no names
    outside ``dest``; modes kept)."""
    dest = Path(dest)
    if HAS_FILTERS:
        tf.extractall(dest, members=members, filter="tar" if trusted else "data")
    elif trusted:
        tf.extractall(dest, members=members)  # noqa: S202 - our own archives
    else:
        checked = _checked(tf.getmembers() if members is None else members, dest)
        tf.extractall(dest, members=checked)  # noqa: S202 - checked above
