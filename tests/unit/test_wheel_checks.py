"""The strict checks every wheel passes before publish (factory.wheels.checks): each refusal,
one line, nothing stored; the tags, names and size caps."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Callable
from pathlib import Path

import index_fixtures
import pytest
from index_wheels import make_wheel

from factory.errors import WheelError
from factory.index.publish import publish
from factory.store import LocalStore
from factory.wheels.checks import WheelLimits, check_filename, check_wheel

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec

MIB = 1024**2


def _patch_bytes(path: Path, old: bytes, new: bytes) -> Path:
    data = path.read_bytes()
    assert data.count(old) == 2  # the local header and the central directory
    path.write_bytes(data.replace(old, new))
    return path


def _patch_central(path: Path, member: str, offset: int, value: bytes) -> Path:
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


def _symlink_member(tmp: Path) -> Path:
    w = make_wheel(tmp / "s", "demo", "1.0")
    with zipfile.ZipFile(w, "a") as zf:
        info = zipfile.ZipInfo("demo/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    return w


def _method(kind: int) -> Callable[[Path], Path]:
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


def _record_mismatch(tmp: Path) -> Path:
    w = make_wheel(tmp / "r", "demo", "1.0")
    with zipfile.ZipFile(w) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["demo/__init__.py"] = b"print('changed after RECORD was written')\n"
    with zipfile.ZipFile(w, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return w


def _metadata(tmp: Path, extra: str, sub: str) -> Path:
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
    "two Name headers": (lambda t: _metadata(t, "\nName: other", "e"), "invalid METADATA"),
    "NUL in a member name": (
        lambda t: _patch_bytes(
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
    "symlink member": (_symlink_member, "is a symlink"),
    "bzip2 member": (_method(zipfile.ZIP_BZIP2), "compressed with bzip2"),
    "lzma member": (_method(zipfile.ZIP_LZMA), "compressed with lzma"),
    "encrypted member": (
        lambda t: _patch_central(make_wheel(t / "h", "demo", "1.0"), "demo/__init__.py", 8, b"\1"),
        "is encrypted",
    ),
    "compression method 99": (
        lambda t: _patch_central(
            make_wheel(t / "i", "demo", "1.0"), "demo/__init__.py", 10, b"\x63\x00"
        ),
        "AES-encrypted",
    ),
    "RECORD hash mismatch": (_record_mismatch, "hash differs from RECORD"),
    "duplicate member": (
        lambda t: _dup(make_wheel(t / "j", "demo", "1.0")),
        "in the zip twice",
    ),
}


def _dup(w: Path) -> Path:
    with pytest.warns(UserWarning), zipfile.ZipFile(w, "a") as zf:
        zf.writestr("demo/__init__.py", b"x = 2\n")
    return w


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused(case: str, tmp_path: Path) -> None:
    make, expected = REFUSED[case]
    wheel = make(tmp_path)
    with pytest.raises(WheelError, match=expected) as info:
        check_wheel(wheel)
    assert "\n" not in info.value.message
    store_dir = tmp_path / "store"
    with pytest.raises(WheelError):
        publish(LocalStore(store_dir), [wheel])
    assert not (store_dir / "files").exists()


def test_a_correct_wheel_passes(tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path,
        "flash-attn",
        "2.8.3+cu130torch2.14",
        tag="cp311-cp311-manylinux_2_28_x86_64",
        requires_python=">=3.9",
        requires=["torch==2.14.*"],
    )
    checked = check_wheel(wheel)
    assert checked.info.wheel_tags == ("cp311-cp311-manylinux_2_28_x86_64",)
    assert b"Requires-Python: >=3.9" in checked.metadata


@pytest.mark.parametrize(
    "name",
    [
        "demo-1.0-py3-none-any.whl",
        "demo-1.0-cp313-cp313t-musllinux_1_2_aarch64.whl",
        "demo-1.0-cp39-abi3-macosx_11_0_arm64.whl",
        "demo-1.0-pp310-pypy310_pp73-manylinux2014_x86_64.whl",
        "demo-1.0-py2.py3-none-win_amd64.whl",
    ],
)
def test_real_tags_are_valid(name: str) -> None:
    check_filename(name)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("demo-1.0-py3-none-linux_sparc.whl", "platform"),
        ("demo-1.0-py3-bogus-any.whl", "ABI"),
        ("demo-1.0-python3-none-any.whl", "interpreter"),
        ("d\0emo-1.0-py3-none-any.whl", "unsafe"),
        ("d" * 300 + "-1.0-py3-none-any.whl", "too long"),
        (".hidden-1.0-py3-none-any.whl", "unsafe"),
        ("demo-1.0-py3-none-any.whl.exe", "invalid"),
    ],
)
def test_bad_filenames(name: str, reason: str) -> None:
    with pytest.raises(WheelError, match=reason):
        check_filename(name)


def _bomb(tmp: Path, zeros: int) -> Path:
    """A wheel whose one data member is ``zeros`` bytes of zeros (deflate: ~1000:1)."""
    w = make_wheel(tmp, "bomb", "1.0")
    with (
        zipfile.ZipFile(w, "a", compression=zipfile.ZIP_DEFLATED) as zf,
        zf.open("bomb/zeros.bin", "w") as f,
    ):
        for _ in range(zeros // MIB):
            f.write(bytes(MIB))
    return w


def test_size_and_ratio_caps(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path, 32 * MIB)
    with pytest.raises(WheelError, match="a zip bomb"):
        check_wheel(bomb, WheelLimits(ratio_from=MIB, max_ratio=50))
    with pytest.raises(WheelError, match="unpacks to more than"):
        check_wheel(bomb, WheelLimits(max_unpacked=16 * MIB))
    # Under the default limits the ratio is not checked below 256 MiB (RECORD is, and the
    # member added after RECORD was written is not listed in it).
    with pytest.raises(WheelError, match="not in RECORD"):
        check_wheel(bomb)
