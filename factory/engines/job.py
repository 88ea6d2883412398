"""What every engine's job runs: one ``factory build`` of a group's cells, in order, with the
local runner inside the allocation the engine made (its cgroup is the cap the planner reads),
publishing to the shared store. The same command on Slurm, in a Kubernetes pod and in a
queue worker; only how the allocation is asked for differs."""

from __future__ import annotations

import dataclasses
import re
import shlex

from factory.errors import UsageError
from factory.matrix.cell import sm_id
from factory.planning.work import Refused, Work, WorkGroup
from factory.runners import ENGINE_RUNNER


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobCommand:
    """How a job starts the factory and which flags its build gets."""

    factory: tuple[str, ...] = ("factory",)  # the program (and its leading args) on the node
    matrix: str  # the matrix as the job sees it
    store: str
    cache: bool = True  # the compile cache: a group's later cells take its kernels
    lease_ttl: float | None = None
    extra: tuple[str, ...] = ()  # more flags for factory build, as given

    def argv(self, group: WorkGroup) -> list[str]:
        out = [*self.factory, "build", *group.cells, "--matrix", self.matrix,
               "--runner", ENGINE_RUNNER, "--publish", "--store", self.store]
        if self.cache:
            out.append("--cache")
        if self.lease_ttl is not None:
            out += ["--lease-ttl", f"{self.lease_ttl:g}"]
        return out + list(self.extra)

    def shell(self, group: WorkGroup) -> str:
        return " ".join(shlex.quote(a) for a in self.argv(group))


def local_runner_work(work: Work) -> Work:
    """The groups the local runner can build: a cell whose CUDA comes in a builder image
    (CUDA 12.x from ``factory image cuda``) needs the docker runner, which an engine's
    allocation does not have; such groups move to the refused, with the reason."""
    keep, refused = [], list(work.refused)
    for g in work.groups:
        image = next((pc.toolchain for pc in g.planned if pc.toolchain.nvcc_source == "image"),
                     None)
        if image is None:
            keep.append(g)
            continue
        refused.append(Refused(name=g.name, cells=g.cells, reason=(
            f"CUDA {image.cuda} comes in image {image.image}, which the local runner of an "
            "engine's job does not use (give the matrix a system or PyPI toolkit for it)")))
    return dataclasses.replace(work, groups=tuple(keep), refused=tuple(refused))


def factory_command(text: str) -> tuple[str, ...]:
    """``--factory "CMD ARGS"``: how a node starts the factory (default ``factory``)."""
    parts = tuple(shlex.split(text))
    if not parts:
        raise UsageError("--factory must name a program (e.g. 'factory' or "
                         "'/opt/factory/.venv/bin/python -m factory')")
    return parts


_UNSAFE = re.compile(r"[^a-z0-9]+")


def job_name(group: WorkGroup, *, limit: int = 63) -> str:
    """A name every engine accepts (a DNS label: lower case, digits and '-', at most 63
    characters): the group's package, version, torch, CUDA, archs and CPU, shortened in the
    middle where needed, then the start of its id, which keeps it unique."""
    first = group.planned[0].cell
    stem = "-".join([first.package, first.version, f"t{first.torch}",
                     f"cu{first.cuda.replace('.', '')}",
                     sm_id(first.archs), group.machine])
    stem = _UNSAFE.sub("-", stem.lower()).strip("-")
    short = group.id[:9]
    room = limit - len(short) - 1
    if len(stem) > room:
        head = room // 3
        stem = f"{stem[:head].rstrip('-')}-{stem[len(stem) - (room - head - 1):].lstrip('-')}"
    return f"{stem}-{short}"
