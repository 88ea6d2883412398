"""The docker runner against a real engine: one full build of the bundled example for sm_100,
an OOM under a tiny cap, a SIGKILLed factory, and the compile cache. Real compiles are few: the
example once, and the rest a single small .cu file (the 2 cores are shared)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import index_fixtures
import pytest
from conftest import REPO, write_tiny_cuda_ext

from factory.errors import EngineError
from factory.runners import INSIDE, BuildJob, get_runner
from factory.runners.docker import LABEL, OWNER_LABEL, DockerRunner, cleanup_stale
from factory.toolchain.wheelhouse import BUILD_FRONTEND_REQUIREMENT, SCCACHE_REQUIREMENT

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec

pytestmark = pytest.mark.docker
CELL = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kit:
    """What every build here shares: the wheelhouse, the toolkit, the venv with torch in it."""

    wheelhouse: Path
    cuda_home: Path | None
    requirements: tuple[str, ...]
    venv_root: Path

    def job(self, tmp: Path, src: Path, **changes: Any) -> BuildJob:
        job = BuildJob(
            cell_id=CELL,
            python="3.11",
            image="factory-base:bookworm",
            src_dir=src,
            out_dir=tmp / "out",
            wheelhouse=self.wheelhouse,
            cuda_home=self.cuda_home,
            requirements=self.requirements,
            env={"TORCH_CUDA_ARCH_LIST": "10.0", "MAX_JOBS": "2"},
            memory_limit_bytes=8 << 30,
            cpus=2,
            pids_limit=2048,
            log_path=tmp / "logs" / "build.log",
            venv_root=self.venv_root,
            timeout=3600,
        )
        return dataclasses.replace(job, **changes)


@pytest.fixture(scope="session")
def kit(
    base_image: str,
    wheelhouse_cp311: Path,
    cuda13_home: Path,
    build_requirements: tuple[str, ...],
    venv_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Kit:
    """Install torch into the shared venv once, with room to spare, before the capped builds."""
    kit = Kit(wheelhouse=wheelhouse_cp311, cuda_home=cuda13_home,
              requirements=(*build_requirements, BUILD_FRONTEND_REQUIREMENT, SCCACHE_REQUIREMENT),
              venv_root=venv_root)
    tmp = tmp_path_factory.mktemp("venv-setup")
    src = tmp / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "noop"\nversion = "0"\n'
    )
    result = DockerRunner().run(kit.job(tmp, src))
    assert result.exit_code == 0, result.log_path.read_text()[-3000:]
    return kit


def test_describe_has_the_caps(tmp_path: Path) -> None:
    kit = Kit(wheelhouse=tmp_path / "wh", cuda_home=tmp_path / "cuda",
              requirements=("torch==2.14.1",), venv_root=tmp_path / "venv")
    job = kit.job(tmp_path, tmp_path / "src", cache_dir=tmp_path / "cc")
    d = DockerRunner(client=object()).describe(job)
    c = d["container"]
    assert c["mem_limit"] == c["memswap_limit"] == 8 << 30  # no swap
    assert c["nano_cpus"] == 2_000_000_000 and c["pids_limit"] == 2048
    assert c["network_disabled"] is True and c["network_mode"] == "none"
    assert c["labels"][LABEL] == "1"
    vols = {v["bind"]: v["mode"] for v in c["volumes"].values()}
    assert vols[INSIDE["wheelhouse"]] == "ro" and vols[INSIDE["cuda"]] == "ro"
    assert vols[INSIDE["src"]] == "rw" and vols[INSIDE["cache"]] == "rw"
    assert d["inside_job"]["env"]["TORCH_CUDA_ARCH_LIST"] == "10.0"
    # the mount holds both layers of the compile cache, each in its own dir
    assert d["inside_job"]["cache"]["dir"] == f"{INSIDE['cache']}/sccache"
    assert d["inside_job"]["cache"]["direct"]["env"]["CCACHE_DIR"] == f"{INSIDE['cache']}/ccache"


def test_engine_down_is_an_engine_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    kit = Kit(wheelhouse=tmp_path, cuda_home=None, requirements=(), venv_root=tmp_path)
    with pytest.raises(EngineError) as info:
        get_runner("docker").run(kit.job(tmp_path, tmp_path))
    assert "\n" not in info.value.message and info.value.tip


def test_missing_image_is_an_engine_error(docker_engine: Any, tmp_path: Path) -> None:
    kit = Kit(wheelhouse=tmp_path, cuda_home=None, requirements=(), venv_root=tmp_path)
    with pytest.raises(EngineError, match="does not exist"):
        DockerRunner().run(kit.job(tmp_path, tmp_path, image="factory-no-such-image:0"))


@pytest.mark.slow
def test_example_builds_for_sm100_under_a_cap(kit: Kit, tmp_path: Path,
                                             no_leftover_containers: None) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "example_ext", src)
    lines: list[str] = []
    result = DockerRunner().run(kit.job(tmp_path, src), on_line=lines.append)
    log = result.log_path.read_text()
    assert result.exit_code == 0, log[-4000:]
    assert not result.oom_killed and result.oom_kill_count == 0
    assert result.wheel is not None
    assert result.wheel.name.startswith("factory_example_ext-0.1.0-cp311")
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
    assert any(n.startswith("factory_example_ext/_C") and n.endswith(".so") for n in names)
    # what the planner needs: compiler peak memory (not the page-cache-inflated cgroup peak)
    assert result.compile_peak_rss_bytes and 100 << 20 < result.compile_peak_rss_bytes < 8 << 30
    assert result.max_concurrent_compiles and 1 <= result.max_concurrent_compiles <= 2
    assert result.cgroup_peak_bytes and result.cgroup_anon_peak_bytes
    assert result.objects_total == 5 and result.objects_built == 5  # 4 .cu + bindings.cpp
    assert "-gencode=arch=compute_100,code=sm_100" in log
    assert any("[5/5]" in ln for ln in lines)
    # build/ stays in the source tree: an OOM retry resumes from its objects
    assert list((src / "build").rglob("*.o"))
    assert not list((tmp_path / "logs").glob(".factory-run-*"))  # the private run dir is gone


@pytest.mark.slow
def test_oom_is_detected_as_oom(kit: Kit, tmp_path: Path, no_leftover_containers: None) -> None:
    src = write_tiny_cuda_ext(tmp_path / "src", torch_headers=True)
    result = DockerRunner().run(kit.job(tmp_path, src, memory_limit_bytes=600 << 20))
    assert result.exit_code != 0
    assert result.oom_killed is True  # not merely a failed build
    assert result.wheel is None


def _container_pids(container_id: str) -> list[int]:
    """Host processes that live in the container's cgroup."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if container_id in Path(f"/proc/{entry}/cgroup").read_text():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _compiling(container: Any) -> bool:
    procs = container.top(ps_args="-eo pid,comm").get("Processes") or []
    return bool({p[-1] for p in procs} & {"cc1plus", "cicc", "nvcc", "ptxas", "cudafe++"})


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_factory_leaves_no_container_and_no_compiler(
    kit: Kit, tmp_path: Path, docker_engine: Any, sig: signal.Signals
) -> None:
    write_tiny_cuda_ext(tmp_path / "src", torch_headers=True)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        from integration.test_runner_docker import Kit
        from factory.runners.docker import DockerRunner
        kit = Kit(wheelhouse=Path({str(kit.wheelhouse)!r}), cuda_home=Path({str(kit.cuda_home)!r}),
                  requirements={kit.requirements!r}, venv_root=Path({str(kit.venv_root)!r}))
        tmp = Path({str(tmp_path)!r})
        DockerRunner().run(kit.job(tmp, tmp / "src"))
    """))
    parent = subprocess.Popen([sys.executable, str(driver)], start_new_session=True)
    container = None
    try:
        # Wait for a compiler inside this build's container, then kill the factory.
        for _ in range(1200):
            assert parent.poll() is None, "the build ended before it could be killed"
            mine = [c for c in docker_engine.containers.list(filters={"label": LABEL})
                    if c.labels.get(OWNER_LABEL, "").split(":")[1:2] == [str(parent.pid)]]
            if mine:
                container = mine[0]
                if _compiling(container):
                    break
            time.sleep(0.5)
        assert container is not None and _compiling(container), "no compiler ever ran"
        os.kill(parent.pid, sig)
        parent.wait()
        if sig == signal.SIGTERM:
            # SIGTERM unwinds like Ctrl-C: the runner removes its own container on the way out.
            assert not docker_engine.containers.list(all=True, filters={"id": container.id})
        else:
            # The engine closes the container's stdin; inside.py kills the build and exits.
            for _ in range(240):
                container.reload()
                if container.status != "running":
                    break
                time.sleep(0.5)
            assert container.status != "running", "the build kept running after the factory died"
            assert not _container_pids(container.id), "build processes outlived the factory"
            # The next run's cleanup removes the stopped container.
            assert container.name in cleanup_stale(docker_engine)
            assert not docker_engine.containers.list(all=True, filters={"id": container.id})
        assert not _container_pids(container.id)
        if sig == signal.SIGKILL:
            # ... and the next run resumes: the same source tree builds to the end.
            result = DockerRunner().run(kit.job(tmp_path, tmp_path / "src"))
            assert result.exit_code == 0 and result.wheel is not None, (
                result.log_path.read_text()[-3000:]
            )
    finally:
        if parent.poll() is None:
            parent.kill()
        if container is not None:
            subprocess.run(["docker", "rm", "-f", container.id], capture_output=True)


@pytest.mark.slow
def test_compile_cache_hits_on_a_rebuild_and_on_a_builder_that_pulled(
    kit: Kit, tmp_path: Path, no_leftover_containers: None, s3_spec: str, s3_env: dict[str, str]
) -> None:
    from factory.build import remote_cache
    from factory.build.compile_cache import RemoteCache

    cache = tmp_path / "cache"
    src = write_tiny_cuda_ext(tmp_path / "src", torch_headers=False)
    job = kit.job(tmp_path, src, cache_dir=cache)
    first = DockerRunner().run(job)
    assert first.exit_code == 0, first.log_path.read_text()[-4000:]
    assert first.cache_misses and first.cache_misses >= 1
    shutil.rmtree(src / "build")  # the same compile again, from scratch
    second = DockerRunner().run(job)
    assert second.exit_code == 0, second.log_path.read_text()[-4000:]
    assert second.cache_hits and second.cache_hits >= 1
    assert second.wheel is not None
    # The direct layer (ccache in the image) answered every object of the rebuild whole; its
    # misses in the first build went through sccache, which holds the stages.
    assert first.report["direct_cache"]["misses"] >= 1, first.report
    assert second.report["direct_cache"]["hits"] >= 1, second.report
    assert second.report["direct_cache"]["misses"] == 0, second.report
    assert any((cache / "sccache").rglob("*")), "sccache's part lives in the mounted directory"
    assert any((cache / "ccache").rglob("*")), "so does the direct layer's"
    # Another builder: an empty cache that pulled what this one pushed hits whole objects too.
    remote = RemoteCache.from_store(s3_spec, environ=s3_env)
    assert remote_cache.push(remote, cache).files >= 2
    other = tmp_path / "other-builder-cache"
    assert remote_cache.pull(remote, other).files >= 2
    shutil.rmtree(src / "build")
    third = DockerRunner().run(dataclasses.replace(job, cache_dir=other))
    assert third.exit_code == 0, third.log_path.read_text()[-4000:]
    assert third.report["direct_cache"]["hits"] >= 1, third.report
    assert third.report["direct_cache"]["misses"] == 0, third.report
