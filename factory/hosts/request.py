"""One-off requests: find a cell's wheel in the store by content key, or build and publish it,
then give the exact install line.

The store answers "already built" from the provenance manifests (their ``content_key``), so a
request for a published cell costs one listing and no compile. A missing cell goes through the
same build as the nightly matrix (``factory.build.pipeline.build_cells``) with publishing on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from factory.build.job import BuildOptions
from factory.build.pipeline import build_cells
from factory.engine import docker_client, image_exists
from factory.environment import INDEX_URL_ENV, env_value
from factory.errors import BuildError, EngineError, StoreError, ToolchainError, UsageError
from factory.hosts.choose import Choice
from factory.hosts.index_reader import IndexAccess
from factory.hosts.snippets import pip_command
from factory.matrix.cell import DEFAULT_PLATFORM, Cell, parse_arch_list
from factory.matrix.gpus import sm_of
from factory.matrix.load import Matrix, PlannedCell
from factory.planning.budget import BudgetRequest
from factory.runners import runner_kind
from factory.store import open_store, url_scheme
from factory.wheels.provenance import PublishedBuild, published_builds


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestResult:
    cell_id: str
    content_key: str
    wheel: str
    variant: str
    built: bool  # False: it was already published
    install: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_spec(spec: str) -> tuple[str, str]:
    """'flash-attn==2.8.3.post2' -> ('flash-attn', '2.8.3.post2'); exactly one pinned version."""
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise UsageError(
            f"cannot read the request {spec!r}", tip="write it like flash-attn==2.8.3.post2"
        ) from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
        raise UsageError(f"{spec!r} must pin exactly one version with ==",
                         tip="a request builds one cell: write it like flash-attn==2.8.3.post2")
    if req.extras or req.marker or req.url:
        raise UsageError(f"{spec!r}: extras, markers and URLs have no meaning for a build request")
    return canonicalize_name(req.name), specs[0].version


def request_cell(spec: str, *, torch: str, cuda: str, archs: Sequence[str], python: str,
                 platform: str = DEFAULT_PLATFORM) -> Cell:
    package, version = parse_spec(spec)
    # each value a compute capability list ('9.0;10.0') or a GPU's name ('B200', 'RTX PRO 6000')
    sms: set[int] = set()
    for a in archs:
        for part in str(a).split(","):
            named = sm_of(part)
            sms.update((named,) if named is not None else parse_arch_list(part))
    if not sms:
        raise UsageError("--arch needs at least one GPU arch, e.g. --arch 10.0")
    cell = Cell(package=package, version=version, torch=torch, cuda=cuda,
                archs=tuple(sorted(sms)), python=python, platform=platform)
    cell.check_plausible()
    return cell


def index_url_for(store_spec: str, index_url: str | None) -> str:
    """Where hosts install from. A local store holds its own pages, so it can be a file:// URL;
    an S3 store is served through some URL only the operator knows."""
    url = index_url or env_value(INDEX_URL_ENV)
    if url:
        return url.rstrip("/")
    if url_scheme(store_spec) is not None:
        raise UsageError(
            f"the install line needs the URL hosts reach {store_spec} through",
            tip=f"pass --index-url https://... or set {INDEX_URL_ENV}",
        )
    return Path(store_spec).resolve().as_uri()


def install_line(index_url: str, variant: str, wheel: str, cert: Path | None = None) -> str:
    """The pip line for hosts, as the doctor words it: the full version with its local tag
    ('==2.8.3.post2' alone would accept any variant, or PyPI's sdist), and what pip needs to
    use an http index by host name, or the CA bundle ``cert`` of an https one a private CA
    signed (the comment why goes first)."""
    name, version, _, _ = parse_wheel_filename(wheel)
    project = canonicalize_name(name)
    choice = Choice(project=project, wheel=wheel, variant=variant, why=None,
                    index_url=f"{index_url}/{variant}/simple/",
                    requirement=f"{project}=={version}")
    return "\n".join(pip_command([choice], IndexAccess(url=index_url, cert=cert), "python3"))


def find_published(store: Any, pc: PlannedCell) -> PublishedBuild | None:
    """The newest installable build with the cell's content key (or its wheel's filename: the
    cell of a new torch patch names the per-minor wheel already built); StoreError if all are
    yanked."""
    same = [b for b in published_builds(store, pc.cell.package)
            if b.manifest.content_key == pc.content_key or b.manifest.wheel == pc.wheel]
    live = [b for b in same if b.yanked is None]
    if live:
        return live[-1]  # published_builds is oldest first
    if same:
        b = same[-1]
        raise StoreError(
            f"{b.manifest.wheel} (the build of {pc.cell.id}) is yanked: "
            f"{b.yanked or 'no reason given'}",
            tip="pip still installs it with an exact == pin; publish a fixed build under a new "
            "recipe revision",
        )
    return None


def check_buildable_here(pc: PlannedCell, runner: str) -> None:
    """Fail before any work when the cell's toolkit lives in a builder image this host lacks
    (CUDA 12.x: NVIDIA's PyPI wheels for 12.x ship no nvcc)."""
    image = pc.toolchain.image
    if pc.toolchain.nvcc_source != "image" or image is None:
        return
    reason = None
    if not runner_kind(runner).image_toolkit:
        reason = f"the {runner} runner cannot use a builder image"
    else:
        try:
            if not image_exists(docker_client(timeout=30), image):
                reason = f"this host has no {image} image"
        except EngineError as exc:
            reason = exc.message
    if reason:
        raise ToolchainError(
            f"{pc.cell.id} needs the CUDA {pc.toolchain.cuda} builder image {image} ({reason})",
            tip="build that cell on a builder with the CUDA image, or request a CUDA 13.x cell",
        )


BuildFn = Callable[..., Any]
# 'factory request --check' (or a declined build): the cell is not published; like the
# doctor's "nothing fits", no error
NOT_PUBLISHED_EXIT = 1


def look_up(cell: Cell, *, matrix: Matrix, store_spec: str, index_url: str | None,
            cert: Path | None = None) -> tuple[PlannedCell, RequestResult | None]:
    """The cell as planned, and its published build's install line (None: not published)."""
    url = index_url_for(store_spec, index_url)  # before any work: an S3 store needs --index-url
    pc = matrix.find(cell.id, outside=True)
    found = find_published(open_store(store_spec), pc)
    if found is None:
        return pc, None
    return pc, RequestResult(cell_id=pc.cell.id, content_key=pc.content_key,
                             wheel=found.manifest.wheel, variant=pc.variant, built=False,
                             install=install_line(url, pc.variant, found.manifest.wheel, cert))


def request(
    cell: Cell,
    *,
    matrix: Matrix,
    store_spec: str,
    index_url: str | None,
    runner: str,
    budget: BudgetRequest,
    out_dir: Path | None,
    build: BuildFn | None = None,
    log: Any = None,
    confirm: Callable[[PlannedCell], bool] | None = None,
    cert: Path | None = None,
) -> RequestResult | None:
    """The published build's install line, else build and publish the cell first: after
    ``confirm`` says yes (None: without asking). None when it says no. ``cert``: the CA bundle
    hosts verify an https index with (the line passes it to pip)."""
    pc, published = look_up(cell, matrix=matrix, store_spec=store_spec, index_url=index_url,
                            cert=cert)
    if published is not None:
        return published
    check_buildable_here(pc, runner)
    if confirm is not None and not confirm(pc):
        return None
    store = open_store(store_spec)
    url = index_url_for(store_spec, index_url)
    if build is None:
        build = build_cells
    opts = BuildOptions(runner=runner, budget=budget, out_dir=out_dir or Path("dist"),
                        store=store_spec, publish=True)
    build([pc], matrix=matrix, opts=opts, log=log)
    found = find_published(store, pc)
    if found is None:
        raise BuildError(f"{pc.cell.id} was built but no build with content key {pc.content_key} "
                         f"is in {store.url}")
    return RequestResult(cell_id=pc.cell.id, content_key=pc.content_key,
                         wheel=found.manifest.wheel, variant=pc.variant, built=True,
                         install=install_line(url, pc.variant, found.manifest.wheel, cert))
