"""Whether a cell's toolchain exists on this builder, and the exact command that makes it:
shown by ``factory matrix`` and ``build --dry-run``, and checked by ``build`` before any
download (a cell whose toolchain cannot be made here is skipped or fails fast)."""

from __future__ import annotations

import dataclasses
from typing import Any

from factory.engine import docker_client, image_exists
from factory.errors import EngineError, ToolchainError
from factory.matrix.load import PlannedCell
from factory.matrix.settings import Settings
from factory.runners import runner_flags, runner_kind
from factory.toolchain.images import make_command
from factory.toolchain.python_image import base_for_python, lacks_python


@dataclasses.dataclass(frozen=True, kw_only=True)
class Readiness:
    state: str  # "here" | "on first build" (made without asking) | "missing" | "unknown"
    detail: str
    command: str | None = None  # what makes it, when it is missing

    @property
    def buildable(self) -> bool:
        return self.state in ("here", "on first build", "unknown")

    def line(self) -> str:
        return f"{self.state}: {self.detail}" + (
            f"; make it: {self.command}" if self.command else ""
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ReadinessChecker:
    """One docker connection for many cells (none when no cell needs an image)."""

    def __init__(self, settings: Settings, *, runner: str | None = None) -> None:
        self.settings = settings
        self.kind = runner_kind(runner or settings.runner)
        self._client: Any = None
        self._engine_error: str | None = None
        self._images: dict[str, bool] = {}  # many cells share one image: ask docker once

    def _image_here(self, image: str) -> bool | None:
        if image in self._images:
            return self._images[image]
        if self._client is None and self._engine_error is None:
            try:
                self._client = docker_client(timeout=10)
            except EngineError as exc:
                self._engine_error = exc.message
        if self._client is None:
            return None

        self._images[image] = bool(image_exists(self._client, image))
        return self._images[image]

    def check(self, pc: PlannedCell) -> Readiness:
        tc = pc.toolchain
        if self.kind.image_toolkit and tc.nvcc_source != "image":
            lacking = self._builder_lacks_python(pc.cell.python)
            if lacking is not None:
                return lacking
        if tc.nvcc_source == "system":
            return Readiness(state="here", detail=f"CUDA {tc.cuda} at {tc.system_path}")
        if tc.nvcc_source == "pypi":
            home = self.settings.toolkits_dir / f"cuda-{tc.cuda}"
            if (home / "bin" / "nvcc").is_file():
                return Readiness(state="here", detail=f"CUDA {tc.cuda} at {home}")
            return Readiness(
                state="on first build",
                detail=f"CUDA {tc.cuda} from NVIDIA's PyPI wheels into {home}",
            )
        if tc.image is None:
            raise ToolchainError(f"toolchain of {pc.cell.id} names no image")
        if not self.kind.image_toolkit:
            return Readiness(
                state="missing",
                detail=f"CUDA {tc.cuda} comes in image {tc.image}, which the "
                f"{self.kind.name} runner does not use",
                command=f'a system CUDA {tc.cuda} toolkit (toolkit = ["system"]) or '
                + runner_flags(lambda k: k.image_toolkit),
            )
        here = self._image_here(tc.image)
        if here is None:
            return Readiness(state="unknown", detail=f"image {tc.image}: {self._engine_error}")
        if here:
            return Readiness(state="here", detail=f"CUDA {tc.cuda} in image {tc.image}")
        return self._missing_cuda_image(tc.image, cuda=tc.cuda, python=pc.cell.python)

    def _builder_lacks_python(self, python: str) -> Readiness | None:
        """Builds run ``python<X.Y>`` in the matrix's builder image for the cell's Python: one
        that, by its name, has another Python cannot build the cell."""
        base = self.settings.image_for(python)
        lacks = lacks_python(base, python)
        if lacks is None:
            return None
        other = base_for_python(base, python)
        return Readiness(
            state="missing",
            detail=f"the matrix's builder image for Python {python} ({base}) {lacks}",
            command=f'set [settings.images] "{python}" = "{other}" (the first build makes it)'
            if other else f'set [settings.images] "{python}" = an image with python{python}',
        )

    def _missing_cuda_image(self, image: str, *, cuda: str, python: str) -> Readiness:
        """The command that makes the cell's CUDA image: the toolkit goes onto the matrix's
        builder image for the cell's Python, so when that one lacks the Python, the command
        names a base that has it."""
        detail = f"image {image} does not exist"
        base = self.settings.image_for(python)
        lacks = lacks_python(base, python)
        if lacks is None:
            return Readiness(state="missing", detail=detail, command=make_command(image))
        other = base_for_python(base, python)
        return Readiness(
            state="missing",
            detail=f"{detail}, and the matrix's builder image for Python {python} ({base}) {lacks}",
            command=f"factory image cuda {cuda} --python {python} --base "
            + (other or f"IMAGE (one with python{python})"),
        )
