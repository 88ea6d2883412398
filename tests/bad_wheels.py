"""Wheels every publish and upload must refuse, each with the reason it names (``REFUSED``), and a
zip bomb: shared by the strict checks' unit tests and the CLI tests of both doors."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from index_wheels import make_wheel

MIB = 1024**2


def patch_bytes(path: Path, old: bytes, new: bytes) -> Path:
    data = path.read_bytes()
    assert data.count(old) == 2  # the local header and the central directory
    path.write_bytes(data.replace(old, new))
    return path


def patch_central(path: Path, member: str, offset: int, value: bytes) -> Path:
    """Overwrite a field of one member's central directory entry (flags: 8, method: 10)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    i = data.find(b"PK\x01\x02")
    while i >= 0:
        name_len = int.from_bytes(data[i + 28 : i + 30], "little")
        if data[i + 46 : i + 46 + name_len] == name:
            data[i + offset : i + offset + len(value)] = value
            path.write_bytes(bytes(data))
            return path
        i = data.find(b"PK\x01\x02", i + 4)
    raise AssertionError(f"{member} not in the central directory")


def symlink_member(tmp: Path) -> Path:
    w = make_wheel(tmp / "s", "demo", "1.0")
    with zipfile.ZipFile(w, "a") as zf:
        info = zipfile.ZipInfo("demo/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    return w


def method(kind: int) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        w = make_wheel(tmp / f"m{kind}", "demo", "1.0")
        data = {}
        with zipfile.ZipFile(w) as zf:
            for n in zf.namelist():
                data[n] = zf.read(n)
        with zipfile.ZipFile(w, "w") as zf:
            for n, d in data.items():
                zf.writestr(n, d, compress_type=kind if n.endswith(".py") else zipfile.ZIP_DEFLATED)
        return w

    return make


def record_mismatch(tmp: Path) -> Path:
    w = make_wheel(tmp / "r", "demo", "1.0")
    with zipfile.ZipFile(w) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["demo/__init__.py"] = b"print('changed after RECORD was written')\n"
    with zipfile.ZipFile(w, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return w


def with_metadata(tmp: Path, extra: str, sub: str) -> Path:
    w = make_wheel(tmp / sub, "demo", "1.0")
    with zipfile.ZipFile(w) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    meta = "demo-1.0.dist-info/METADATA"
    members[meta] = members[meta].rstrip(b"\n") + extra.encode() + b"\n\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(members[meta]).digest()).rstrip(b"=")
    record = "demo-1.0.dist-info/RECORD"
    rows = [
        r
        if not r.startswith(meta + ",")
        else f"{meta},sha256={digest.decode()},{len(members[meta])}"
        for r in members[record].decode().splitlines()
    ]
    members[record] = ("\n".join(rows) + "\n").encode()
    with zipfile.ZipFile(w, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return w


REFUSED: dict[str, tuple[Callable[[Path], Path], str]] = {
    "filename tags differ from WHEEL": (
        lambda t: make_wheel(
            t / "a",
            "demo",
            "1.0",
            filename="demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        ),
        "are not WHEEL's",
    ),
    "invalid platform tag": (
        lambda t: make_wheel(t / "b", "demo", "1.0", tag="py3-none-bogus_tag"),
        "invalid platform tag 'bogus_tag'",
    ),
    "invalid tags": (
        lambda t: make_wheel(t / "c", "demo", "1.0", tag="xx-yy-zz"),
        "invalid interpreter tag 'xx'",
    ),
    "invalid Requires-Python": (
        lambda t: make_wheel(t / "d", "demo", "1.0", requires_python=">=3.x,,"),
        "invalid METADATA: .*requires-python",
    ),
    "two Name headers": (lambda t: with_metadata(t, "\nName: other", "e"), "invalid METADATA"),
    "NUL in a member name": (
        lambda t: patch_bytes(
            make_wheel(t / "f", "demo", "1.0", extra_members={"demo/evilX.py": b""}),
            b"demo/evilX.py",
            b"demo/evil\0.py",
        ),
        "a NUL character",
    ),
    "absolute member": (
        lambda t: make_wheel(t / "g", "demo", "1.0", extra_members={"/etc/cron.d/x": b""}),
        "absolute",
    ),
    "symlink member": (symlink_member, "is a symlink"),
    "bzip2 member": (method(zipfile.ZIP_BZIP2), "compressed with bzip2"),
    "lzma member": (method(zipfile.ZIP_LZMA), "compressed with lzma"),
    "encrypted member": (
        lambda t: patch_central(make_wheel(t / "h", "demo", "1.0"), "demo/__init__.py", 8, b"\1"),
        "is encrypted",
    ),
    "compression method 99": (
        lambda t: patch_central(
            make_wheel(t / "i", "demo", "1.0"), "demo/__init__.py", 10, b"\x63\x00"
        ),
        "AES-encrypted",
    ),
    "RECORD hash mismatch": (record_mismatch, "hash differs from RECORD"),
    "duplicate member": (
        lambda t: duplicate_member(make_wheel(t / "j", "demo", "1.0")),
        "in the zip twice",
    ),
    # What pip itself refuses to install (pip's parse_wheel, pip/_internal/utils/wheel.py): the
    # CLI tests run pip on these (PIP_REFUSED).
    "Wheel-Version 2.0": (
        lambda t: make_wheel(t / "k", "demo", "1.0", wheel_version="2.0"),
        "Wheel-Version 2.0 is a major version pip does not install",
    ),
    "Wheel-Version not numbers": (
        lambda t: make_wheel(t / "l", "demo", "1.0", wheel_version="1.0a"),
        "invalid Wheel-Version '1.0a'",
    ),
    "dist-info of another project": (
        lambda t: make_wheel(t / "m", "demo", "1.0", dist_info="other-1.0.dist-info"),
        "does not start with the project name 'demo'",
    ),
}
PIP_REFUSED = ("Wheel-Version 2.0", "Wheel-Version not numbers", "dist-info of another project")
# ... and wheels pip installs that look close to those (a newer minor Wheel-Version is a
# warning; a .dist-info whose canonical name starts with the project's is accepted).
PIP_ACCEPTED: dict[str, Callable[[Path], Path]] = {
    "Wheel-Version 1.9": lambda t: make_wheel(t, "demo", "1.0", wheel_version="1.9"),
    "Wheel-Version 1": lambda t: make_wheel(t, "demo", "1.0", wheel_version="1"),
    "dist-info with a longer name": lambda t: make_wheel(
        t, "demo", "1.0", dist_info="Demo_Plugins-1.0.dist-info"
    ),
}


def make_bomb(tmp: Path, zeros: int) -> Path:
    """A wheel whose one data member is ``zeros`` bytes of zeros (deflate: ~1000:1)."""
    w = make_wheel(tmp, "bomb", "1.0")
    with (
        zipfile.ZipFile(w, "a", compression=zipfile.ZIP_DEFLATED) as zf,
        zf.open("bomb/zeros.bin", "w") as f,
    ):
        for _ in range(zeros // MIB):
            f.write(bytes(MIB))
    return w


def duplicate_member(w: Path) -> Path:
    with pytest.warns(UserWarning), zipfile.ZipFile(w, "a") as zf:
        zf.writestr("demo/__init__.py", b"x = 2\n")
    return w
