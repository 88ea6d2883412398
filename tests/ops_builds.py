"""Fake factory builds for the operations tests: a small valid wheel named and pinned like a real
build of a cell, with its provenance manifest, optionally published into a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from factory.matrix.load import PlannedCell, load_matrix
from factory.wheels.provenance import manifest_name, sha256_file, write_manifest
from factory.matrix.tags import local_tag

from index_wheels import make_wheel

REPO = Path(__file__).resolve().parent.parent

MATRIX = """\
version = 1
[settings]
store = "store"
[axes]
torch = ["2.14.1", "2.11.0"]
cuda = ["13.0"]
archs = [["9.0"], ["10.0"], ["12.0"]]
python = ["3.11", "3.12"]
[packages.flash-attn]
recipe = "flash-attn"
versions = ["2.8.3.post2"]
"""


def write_matrix(directory: Path, text: str = MATRIX) -> Path:
    path = directory / "matrix.toml"
    path.write_text(text)
    return path


def planned(matrix_path: Path) -> list[PlannedCell]:
    return list(load_matrix(matrix_path).cells)


def manifest_for(pc: PlannedCell, wheel: Path, *, created: str, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "wheel": wheel.name,
        "sha256": sha256_file(wheel),
        "cell": {**pc.cell.as_dict(), "id": pc.cell.id, "variant": pc.variant},
        "content_key": pc.content_key,
        "recipe": {"name": pc.recipe.name, "revision": pc.recipe.revision},
        "toolchain": pc.toolchain.as_dict(),
        "plan": {"max_jobs": 2, "nvcc_threads": 1, "memory_budget_bytes": 8 << 30,
                 "predicted_peak_bytes": 6 << 30, "per_job_bytes": 3 << 30,
                 "per_job_source": "measured", "reasons": ["2 CPUs"]},
        "attempts": [{"attempt": 1, "max_jobs": 2, "nvcc_threads": 1, "exit_code": 0, "oom_killed": False,
                      "wall_seconds": 85.0, "compile_peak_rss_bytes": 3 << 30, "objects_built": 5}],
        "build_seconds": 90.5,
        "peak_memory_bytes": 3 << 30,
        "log": "logs/attempt-1.log",
        "builder": {"hostname": "builder-1", "runner": "docker", "image": "factory-base:bookworm"},
        "created": created,
        "cache": {"hits": 0, "misses": 5},
    }
    doc.update(overrides)
    return doc


def fake_build(out_dir: Path, pc: PlannedCell, *, created: str = "2026-01-01T00:00:00+00:00",
               plat: str | None = None, salt: str = "", **overrides: Any) -> Path:
    """A wheel file as the build would leave it in ``out_dir``, with its manifest beside it;
    its platform tag is the planned wheel's unless ``plat`` names another."""
    cell = pc.cell
    plat = plat or pc.wheel[: -len(".whl")].rsplit("-", 1)[-1]
    local = local_tag(cuda=cell.cuda, torch_minor=cell.torch_minor, archs=cell.archs,
                      default_archs=pc.recipe.default_archs)
    tag = f"{cell.python_tag}-{cell.python_tag}-{plat}"
    wheel = make_wheel(out_dir, cell.package, f"{cell.version}+{local}", tag=tag,
                       requires=[f"torch=={cell.torch_minor}.*"],
                       extra_members={"build-id.txt": (created + salt).encode()})
    write_manifest(out_dir / manifest_name(wheel.name), manifest_for(pc, wheel, created=created, **overrides))
    return wheel


def publish_build(store: Path | str, out_dir: Path, pc: PlannedCell, **kwargs: Any) -> Path:
    from factory.index.publish import publish
    from factory.store import open_store

    wheel = fake_build(out_dir, pc, **kwargs)
    publish(open_store(str(store)), [wheel])
    return wheel


def factory_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real command line in a subprocess, with the test's environment plus ``env``."""
    full = dict(os.environ)
    full.pop("FACTORY_INDEX_URL", None)
    env = dict(env or {})
    extra_path = env.pop("PYTHONPATH", "")
    full["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(REPO), full.get("PYTHONPATH", "")) if p)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "factory", *args], cwd=cwd or REPO, env=full,
                          capture_output=True, text=True, timeout=timeout)
