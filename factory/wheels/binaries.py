"""What a wheel's binaries hold, read from the binaries themselves: the GPU code in each
extension (cuobjdump: SASS and PTX per arch), the CPU of every ELF file, and the glibc they
need against the floor the platform tag promises."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from factory.errors import EngineError, VerifyError, WheelError
from factory.matrix.cell import sm_names
from factory.matrix.manylinux import manylinux_name
from factory.matrix.tags import platform_of_plat
from factory.process import run_program
from factory.toolchain.cross import CPU_PLATFORMS
from factory.wheels.floor import BinaryFloor, promised_glibc
from factory.wheels.reader import WheelInfo
from factory.wheels.report import Check

_CUBIN_RE = re.compile(r"\bsm_(\d+)([a-z]?)\.cubin\b")
_PTX_RE = re.compile(r"\b(?:sm|compute)_(\d+)([a-z]?)\.ptx\b")
_NO_DEVICE_CODE = "does not contain device code"


def check_floor(filename: str, floor: BinaryFloor) -> Check:
    """The platform tag promises a glibc; the binaries must need no newer one."""
    promised = promised_glibc(filename)
    if promised is None or floor.glibc is None:
        return Check(name="glibc", ok=True, skipped=promised is None,
                     detail=f"binaries: {floor.why()}"
                     + ("" if promised is not None else "; the tag promises no manylinux floor"))
    tag = manylinux_name(promised)
    if floor.glibc > promised:
        return Check(name="glibc", ok=False,
                     detail=f"the tag promises {tag} but the binaries need {floor.why()}")
    return Check(name="glibc", ok=True, detail=f"tag {tag}; binaries need {floor.why()}")


# -- cuobjdump ------------------------------------------------------------------------------------
def find_cuobjdump() -> Path:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (a dependency), else CUDA_HOME or PATH."""
    try:
        files = importlib.metadata.files("nvidia-cuda-cuobjdump") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "cuobjdump" and f.parent.name == "bin":
            path = Path(str(f.locate()))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "cuobjdump").is_file():
        return Path(cuda_home) / "bin" / "cuobjdump"
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    raise EngineError(
        "cuobjdump not found: cannot read the GPU archs in the wheel",
        tip="pip install nvidia-cuda-cuobjdump (a factory dependency), or put CUDA on PATH",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceCode:
    """The fatbin contents of one shared object, as cuobjdump lists them."""

    member: str  # path inside the wheel
    sass: tuple[str, ...]  # 'sm_100', 'sm_90a' (sorted, unique)
    ptx: tuple[str, ...]  # 'sm_90' for compute_90 PTX

    @property
    def sass_archs(self) -> frozenset[int]:
        return frozenset(int(re.sub(r"\D", "", s)) for s in self.sass)


def list_device_code(so_path: Path, member: str, *, cuobjdump: Path) -> DeviceCode:
    """SASS and PTX of one ELF file. A file without device code gives empty lists."""
    found: dict[str, tuple[str, ...]] = {}
    for flag, regex in (("--list-elf", _CUBIN_RE), ("--list-ptx", _PTX_RE)):
        proc = run_program(
            [cuobjdump, flag, so_path],
            error=VerifyError,
            what=f"cuobjdump {flag} {member}",
            check=False,
        )
        if proc.returncode != 0:
            if _NO_DEVICE_CODE in proc.stdout:
                found[flag] = ()
                continue
            line = proc.stdout.strip().splitlines()[-1:] or ["no output"]
            raise VerifyError(
                f"cuobjdump {flag} {member} failed (exit {proc.returncode}): {line[0][:300]}"
            )
        found[flag] = tuple(
            sorted({f"sm_{m.group(1)}{m.group(2)}" for m in regex.finditer(proc.stdout)})
        )
    return DeviceCode(member=member, sass=found["--list-elf"], ptx=found["--list-ptx"])


def _device_code(info: WheelInfo, *, cuobjdump: Path) -> list[DeviceCode]:
    out = []
    with (
        zipfile.ZipFile(info.path) as zf,
        tempfile.TemporaryDirectory(prefix="factory-cuobjdump-") as tmp,
    ):
        for i, member in enumerate(info.extensions):
            with zf.open(member) as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            target = Path(tmp) / f"{i}-{Path(member).name}"
            with zf.open(member) as fin, target.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            out.append(list_device_code(target, member, cuobjdump=cuobjdump))
            target.unlink()
    return out


def check_archs(
    info: WheelInfo,
    want: Iterable[int] | None,
    *,
    allow_ptx: bool = False,
    cuobjdump: Path | None = None,
) -> Check:
    if want is None:
        return Check(
            name="archs",
            ok=False,
            detail="the requested arch set is unknown: the tag has no sm "
            "marker and no recipe default arch set is known for this package",
        )
    want_set = frozenset(want)
    codes = _device_code(info, cuobjdump=cuobjdump or find_cuobjdump())
    with_code = [c for c in codes if c.sass or c.ptx]
    wanted = sm_names(sorted(want_set))
    if not with_code:
        return Check(
            name="archs",
            ok=False,
            detail=f"no GPU code in any of {len(codes)} ELF file(s); wanted {wanted}",
        )
    problems = []
    for c in with_code:
        if c.sass_archs != want_set:
            problems.append(f"{c.member} has SASS {', '.join(c.sass) or 'none'}, wanted {wanted}")
        if c.ptx and not allow_ptx:
            problems.append(
                f"{c.member} carries PTX {', '.join(c.ptx)} (JIT code nobody asked for)"
            )
    if problems:
        return Check(name="archs", ok=False, detail="; ".join(problems))
    ptx = sorted({p for c in with_code for p in c.ptx})
    return Check(
        name="archs",
        ok=True,
        detail=f"SASS {wanted} in {len(with_code)} file(s)"
        + (f", PTX {', '.join(ptx)}" if ptx else ", no PTX"),
    )


# -- the CPU of every ELF file ---------------------------------------------------------------------
def elf_machine(header: bytes) -> int | None:
    """e_machine of an ELF header (its first 20 bytes), None when it is not ELF."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


def tag_cpus(info: WheelInfo) -> set[str]:
    """The CPUs the wheel's platform tags name ('aarch64'); WheelError for a tag naming none."""
    return {platform_of_plat(p) for p in info.platforms}


def check_cpu(info: WheelInfo) -> Check:
    """Every ELF file in the wheel is for the CPU its platform tag names (a cross build that
    fell back to the builder's own compiler produces x86-64 objects in an aarch64 wheel)."""
    try:
        cpus = tag_cpus(info)
    except WheelError as exc:
        return Check(name="cpu", ok=False, detail=exc.message)
    if len(cpus) != 1 or not cpus <= set(CPU_PLATFORMS):
        return Check(name="cpu", ok=False, detail=f"platform tags name CPUs {sorted(cpus)}")
    cpu = CPU_PLATFORMS[cpus.pop()]
    by_machine = {p.elf_machine: p.elf_name for p in CPU_PLATFORMS.values()}
    wrong, count = [], 0
    with zipfile.ZipFile(info.path) as zf:
        for member in zf.namelist():
            with zf.open(member) as fh:
                machine = elf_machine(fh.read(20))
            if machine is None:
                continue
            count += 1
            if machine != cpu.elf_machine:
                wrong.append(f"{member} is {by_machine.get(machine, f'machine {machine}')}")
    if not count:
        return Check(name="cpu", ok=False, detail="no ELF file in the wheel")
    if wrong:
        return Check(name="cpu", ok=False,
                     detail=f"wanted {cpu.elf_name}: " + "; ".join(wrong[:3])
                     + (f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""))
    return Check(name="cpu", ok=True, detail=f"{count} ELF file(s), all {cpu.elf_name}")
