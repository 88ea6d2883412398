"""Toolchain per cell: where torch and nvcc come from, checked against each other before a build.

The CUDA toolkit must match ``torch.version.cuda`` (major.minor): torch's extension builder
refuses a different major and only warns on a different minor, and a wheel built that way is a
variant nobody asked for. Sources for nvcc, tried in order:

1. ``pypi``: NVIDIA's CUDA 13.x component wheels (``nvidia-cuda-nvcc`` ships the full nvcc).
   The 12.x ``-cu12`` wheels ship only ptxas, so they cannot compile.
2. ``image``: a builder image with NVIDIA's toolkit (``factory image cuda X.Y`` from NVIDIA's
   redistributable archives, or ``docker/Dockerfile.cuda``), any version.
3. ``system``: a matching toolkit already on the host (``/usr/local/cuda-X.Y``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import os
import re
import shutil
import subprocess
from pathlib import Path

from packaging.version import Version

from factory.errors import ConfigError, ToolchainError
from factory.matrix.cell import Cell, parse_cuda, sm_name
from factory.tomlread import tomllib

# The CUDA component wheels that together make a CUDA_HOME able to build torch extensions.
CUDA13_COMPONENTS = (
    "nvidia-cuda-nvcc",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
)


@functools.cache
def _cuda_archs() -> dict[str, str]:
    text = importlib.resources.files("factory.data").joinpath("cuda_archs.toml").read_text()
    table = tomllib.loads(text)["arch_min_cuda"]
    return {str(k): str(v) for k, v in table.items()}


def arch_min_cuda(sm: int) -> str | None:
    """The lowest CUDA whose nvcc compiles code for sm_N (None: not in the table)."""
    return _cuda_archs().get(str(sm))


def check_cell_archs(cell: Cell) -> None:
    """Raise ConfigError when the cell's CUDA cannot compile one of its archs. (Whether torch
    ships that CUDA is the facts' question: ``Facts.build_for``.)"""
    cmaj, cmin = cell.cuda_tuple
    for sm in cell.archs:
        need = arch_min_cuda(sm)
        if need and parse_cuda(need) > (cmaj, cmin):
            raise ConfigError(
                f"{sm_name(sm)} needs CUDA >= {need}, but the cell asks for CUDA {cell.cuda} "
                f"({cell.id})"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toolchain:
    cuda: str  # "13.0"
    nvcc_source: str  # "pypi" | "image" | "system"
    nvcc_requirements: tuple[str, ...]  # pip requirements for the pypi source
    system_path: str | None  # CUDA_HOME for the system source
    image: str | None  # builder image for the image source
    torch_requirement: str  # "torch==2.14.1"
    torch_index: str | None  # None: PyPI's default build; else PyTorch's per-CUDA index

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def resolve_toolchain(
    cell: Cell,
    *,
    torch_index: str | None = None,
    prefer: tuple[str, ...] = ("pypi", "image", "system"),
    system_root: Path = Path("/usr/local"),
) -> Toolchain:
    """Where nvcc and torch come from. ``torch_index``: None for PyPI's torch build, else the
    per-CUDA index the cell's torch build is on (the facts or the lock say which)."""
    check_cell_archs(cell)
    cmaj, cmin = cell.cuda_tuple
    torch_req = f"torch=={cell.torch}" + (f"+{cell.cuda_tag}" if torch_index else "")
    for source in prefer:
        if source == "pypi" and cmaj >= 13:
            nxt = f"{cmaj}.{cmin + 1}"
            reqs = tuple(f"{p}>={cell.cuda},<{nxt}" for p in CUDA13_COMPONENTS)
            return Toolchain(
                cuda=cell.cuda, nvcc_source="pypi", nvcc_requirements=reqs, system_path=None,
                image=None, torch_requirement=torch_req, torch_index=torch_index,
            )
        if source == "image":
            return Toolchain(
                cuda=cell.cuda, nvcc_source="image", nvcc_requirements=(), system_path=None,
                image=cuda_image_name(cell.cuda, cell.python), torch_requirement=torch_req,
                torch_index=torch_index,
            )
        if source == "system":
            path = find_system_cuda(cell.cuda, system_root=system_root)
            if path is not None:
                return Toolchain(
                    cuda=cell.cuda, nvcc_source="system", nvcc_requirements=(),
                    system_path=str(path),
                    image=None, torch_requirement=torch_req, torch_index=torch_index,
                )
    raise ToolchainError(
        f"no CUDA {cell.cuda} toolkit source for {cell.id} (tried {', '.join(prefer)})",
        tip=f"CUDA 12.x needs the builder image ('factory image cuda {cell.cuda} --python "
        f"{cell.python}') or a system toolkit",
    )


def cuda_image_name(cuda: str, python: str) -> str:
    """The builder image of the 'image' source for one Python: the toolkit stacked on the
    matrix's builder image for that Python, so cells of one CUDA with two Pythons need two
    images. ``factory image cuda X.Y --python A.B`` makes it."""
    return f"factory-cuda:{cuda}-py{python}"


def find_system_cuda(cuda: str, *, system_root: Path = Path("/usr/local")) -> Path | None:
    """A toolkit on this host whose nvcc reports exactly ``cuda`` (major.minor), looked for where
    torch's builder looks: $CUDA_HOME, the directory above ``nvcc`` on PATH, then the usual
    install directories."""
    candidates: list[Path] = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    candidates += [system_root / f"cuda-{cuda}", system_root / "cuda"]
    want = Version(cuda)
    for root in candidates:
        nvcc = root / "bin" / "nvcc"
        # a wrapper script on PATH is not a toolkit: it needs the headers beside it
        if not nvcc.exists() or not (root / "include" / "cuda_runtime.h").exists():
            continue
        try:
            if nvcc_version(nvcc) == want:
                return root
        except ToolchainError:
            continue
    return None


def nvcc_version(nvcc: Path) -> Version:
    """Parse ``nvcc --version`` ('release 13.0, V13.0.88')."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolchainError(f"cannot run {nvcc}: {exc}") from None
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise ToolchainError(f"cannot read the CUDA version from {nvcc} --version")
    return Version(m.group(1))
