"""The compile cache: settings, the nvcc wrapper, stats parsing; and one real sccache + nvcc run
that proves a second Python version hits the cache."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cache_fixtures import HEADER, KERNEL, compile_in_a_fresh_server, fake_tools, free_port
from tools import module, need_nvcc, tool

from factory.build.compile_cache import (
    RemoteCache,
)
from factory.runners import cache_config

# -- settings -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_second_python_version_hits_the_cache(tmp_path: Path) -> None:
    sccache, nvcc = tool("sccache"), need_nvcc()
    src = tmp_path / "src/k.cu"  # one source path, as /factory/src in every container
    src.parent.mkdir()
    src.write_text(KERNEL)
    link = tmp_path / "run/site-packages"  # one link path, as /factory/run in every container
    link.parent.mkdir()
    wrapper = link.parent / "nvcc-cached"
    wrapper.write_text(cache_config.NVCC_WRAPPER.replace("@LINK@", str(link)).replace(
        "@INCLUDE_LINK@", str(link.parent / "python-include")))
    wrapper.chmod(0o755)
    base_env = {
        "HOME": str(tmp_path),
        "SCCACHE_DIR": str(tmp_path / "cache"),
        "SCCACHE_CACHE_SIZE": "1G",
        "SCCACHE_SERVER_PORT": str(free_port()),
        "SCCACHE_IDLE_TIMEOUT": "0",
        "CUDA_HOME": str(Path(nvcc).resolve().parent.parent),
    }
    results = []
    for version in ("3.11", "3.13"):
        # Each version: its own venv (site-packages under lib/python3.X) and Python include dir.
        site = tmp_path / f"venv{version}/lib/python{version}/site-packages"
        (site / "ext/include").mkdir(parents=True)
        (site / "ext/include/ext.h").write_text(HEADER)
        pyinc = tmp_path / f"include/python{version}"
        pyinc.mkdir(parents=True)
        (pyinc / "Python.h").write_text(f'#define PY_VERSION "{version}"\n')
        bin_dir = tmp_path / f"bin{version}"
        fake_tools(bin_dir, site, pyinc)
        (bin_dir / "ccache").unlink()  # sccache alone (the direct layer: test_runner_docker)
        (bin_dir / "sccache").unlink()  # the real one here
        (bin_dir / "sccache").symlink_to(sccache)
        for old_link in (link, link.parent / "python-include"):
            if old_link.is_symlink():
                old_link.unlink()  # a fresh run dir, as in a new container
        env = {**base_env, "PATH": f"{bin_dir}:/usr/bin:/bin"}
        out = tmp_path / f"build/temp.cpython-{version.replace('.', '')}"
        out.mkdir(parents=True)
        argv = [
            str(wrapper),
            "-MD",
            "-MF",
            f"{out}/k.o.d",
            f"-I{site}/ext/include",
            f"-I{pyinc}",
            "-c",
            str(src),
            "-o",
            f"{out}/k.o",
            "-O2",
            "-gencode=arch=compute_80,code=sm_80",
        ]
        results.append(compile_in_a_fresh_server(sccache, argv, env, cwd=tmp_path))
        assert (out / "k.o").is_file()
    first, second = results
    assert first.object_misses == 1 and first.object_hits == 0
    # The second Python version: the whole object from the cache, nothing compiled again.
    assert second.object_hits == 1 and second.misses == 0
    assert second.max_cache_size == 1024**3  # the bound reached the server
    k311 = (tmp_path / "build/temp.cpython-311/k.o").read_bytes()
    k313 = (tmp_path / "build/temp.cpython-313/k.o").read_bytes()
    assert k311 == k313


@pytest.mark.slow
def test_remote_cache_shares_between_builders(tmp_path: Path) -> None:
    """Two builders with their own disk caches and one S3 remote (moto on loopback): what the
    first compiled, the second gets from S3."""
    sccache, nvcc = tool("sccache"), need_nvcc()
    module("moto.server", "moto")
    boto3 = module("boto3", "boto3")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        for _ in range(100):  # the server needs a moment to listen
            try:
                client.create_bucket(Bucket="wheels")
                break
            except Exception:
                time.sleep(0.1)
        remote = RemoteCache.from_store(
            "s3://wheels/index", environ={"FACTORY_S3_ENDPOINT_URL": endpoint}
        )
        src = tmp_path / "k.cu"
        src.write_text(KERNEL.replace("#include <ext.h>", HEADER))
        results = []
        for builder in ("a", "b"):
            env = {
                "HOME": str(tmp_path),
                "PATH": f"{Path(nvcc).parent}:/usr/bin:/bin",
                "SCCACHE_DIR": str(tmp_path / f"disk-{builder}"),
                "SCCACHE_IDLE_TIMEOUT": "0",
                "SCCACHE_SERVER_PORT": str(free_port()),
                **creds,
                **remote.env(),
            }
            argv = [
                sccache,
                nvcc,
                "-c",
                str(src),
                "-o",
                str(tmp_path / f"{builder}.o"),
                "-gencode=arch=compute_80,code=sm_80",
            ]
            results.append(compile_in_a_fresh_server(sccache, argv, env, cwd=tmp_path))
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="wheels").get("Contents", [])]
    finally:
        server.terminate()
        server.wait(timeout=10)
    first, second = results
    assert first.object_misses == 1
    assert second.object_hits == 1 and second.misses == 0  # builder b's disk was empty
    assert keys and all(k.startswith("index/compile-cache/") for k in keys)
