"""The compile cache: settings, the nvcc wrapper, stats parsing; and one real sccache + nvcc run
that proves a second Python version hits the cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from cache_fixtures import fake_tools

from factory.build import compile_cache
from factory.build.compile_cache import (
    CacheSettings,
    RemoteCache,
    cache_settings,
    parse_stats,
)
from factory.errors import ConfigError
from factory.matrix.load import load_matrix
from factory.matrix.settings import Settings, sccache_size
from factory.runners import cache_config
from factory.runners.cache_config import inside_config
from factory.store.s3 import s3_client

# The shape of `sccache --show-stats --stats-format json` (0.16), from a real second compile whose
# object missed but whose nvcc stages hit.
STATS = {
    "stats": {
        "compile_requests": 2,
        "cache_hits": {
            "counts": {"CUBIN": 1, "PTX": 1, "CUDA (Device code)": 1},
            "adv_counts": {"cubin [ptxas]": 1, "ptx [cicc]": 1, "cuda [cudafe++]": 1},
        },
        "cache_misses": {
            "counts": {"CUDA": 2, "C++": 1, "PTX": 1, "CUBIN": 1, "CUDA (Device code)": 1},
            "adv_counts": {
                "cuda [nvcc]": 2,
                "c++ [gcc]": 1,
                "ptx [cicc]": 1,
                "cubin [ptxas]": 1,
                "cuda [cudafe++]": 1,
            },
        },
        "cache_errors": {"counts": {}, "adv_counts": {}},
    },
    "cache_location": 'Local disk: "/factory/cache"',
    "cache_size": 196688,
    "max_cache_size": 21474836480,
    "version": "0.16.0",
}


# -- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,want",
    [("20G", "20G"), ("500m", "500M"), ("10GiB", "10G"), ("4096", "4K"), ("1.5G", "1536M")],
)
def test_cache_size_in_sccache_notation(tmp_path: Path, text: str, want: str) -> None:
    s = cache_settings(Settings.from_table(
        {"work-dir": "w", "compile-cache": {"size": text}}, root=tmp_path))
    assert s.size == want


@pytest.mark.parametrize("text", ["", "0G", "-1G", "20X", "G"])
def test_cache_size_rejects_others(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"\[settings.compile-cache\] size: "):
        Settings.from_table({"work-dir": "w", "compile-cache": {"size": text}}, root=tmp_path)


def test_sccache_size_takes_the_largest_whole_unit() -> None:
    assert sccache_size(20 * 1024**3) == "20G"
    assert sccache_size(512 * 1024**2) == "512M"
    assert sccache_size(1025 * 1024) == "1025K"
    assert sccache_size(4097) == "4097"


def test_cache_settings_defaults_next_to_work_dir(tmp_path: Path) -> None:
    s = cache_settings(Settings.from_table({"work-dir": ".cache/factory/work"}, root=tmp_path))
    assert s == CacheSettings(
        dir=tmp_path / ".cache/factory/compile-cache", size="20G", remote=None
    )


def test_cache_settings_table(tmp_path: Path) -> None:
    s = cache_settings(Settings.from_table(
        {"work-dir": "w", "compile-cache": {"dir": "cc", "size": "5g"}}, root=tmp_path
    ))
    assert (s.dir, s.size) == (tmp_path / "cc", "5G")
    with pytest.raises(ConfigError, match="unknown key 'szie'.*did you mean 'size'"):
        Settings.from_table({"compile-cache": {"szie": "5G"}}, root=tmp_path)


def test_remote_cache_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FACTORY_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    s = cache_settings(Settings.from_table(
        {"store": "s3://wheels/index", "compile-cache": {"remote": "store"}}, root=tmp_path
    ))
    assert s.remote == RemoteCache(
        bucket="wheels",
        prefix="index/compile-cache",
        endpoint="http://127.0.0.1:9000",
        region="eu-west-1",
    )
    # the S3 store's own client reads the same endpoint and region (one home: store/s3.py)
    client = s3_client()
    assert (client.meta.endpoint_url, client.meta.region_name) == (s.remote.endpoint,
                                                                   s.remote.region)
    env = s.remote.env()
    assert env["SCCACHE_MULTILEVEL_CHAIN"] == "disk,s3"  # the local disk stays the first level
    assert env["SCCACHE_S3_KEY_PREFIX"] == "index/compile-cache"
    assert env["SCCACHE_S3_USE_SSL"] == "false"
    with pytest.raises(ConfigError, match="s3://"):
        cache_settings(Settings.from_table(
            {"store": "index/store", "compile-cache": {"remote": "store"}}, root=tmp_path
        ))


def test_inside_config_carries_the_bound_and_the_wrapper() -> None:
    cfg = inside_config(root="/factory/cache", size="8G", normalize_paths=True)
    # a quarter of the bound for the direct layer, the rest for sccache; each in its own dir
    assert cfg["dir"] == "/factory/cache/sccache"
    assert cfg["size"] == cfg["env"]["SCCACHE_CACHE_SIZE"] == f"{6 * 1024**2}K"
    direct = cfg["direct"]["env"]
    assert direct["CCACHE_DIR"] == "/factory/cache/ccache"
    assert direct["CCACHE_MAXSIZE"] == f"{2 * 1024**2}KiB"
    assert direct["CCACHE_PREFIX"] == "sccache" and direct["CCACHE_DEPEND"] == "1"
    assert direct["CCACHE_STATSLOG"].startswith("/factory/run/")
    assert cfg["nvcc_wrapper"]["path"] == "/factory/run/nvcc-cached"
    for wrapper in (cfg["nvcc_wrapper"], cfg["cxx_wrapper"]):
        assert 'link="/factory/run/site-packages"' in wrapper["text"]
        assert 'inc_link="/factory/run/python-include"' in wrapper["text"]
        assert not re.search(r"@[A-Z_]+@", wrapper["text"])  # every placeholder filled
    assert cfg["cxx_wrapper"]["path"] == "/factory/run/cxx-cached"
    plain = inside_config(root="/c", size="8G", normalize_paths=False)
    assert "nvcc_wrapper" not in plain and "cxx_wrapper" not in plain and "direct" not in plain
    assert plain["dir"] == "/c/sccache" and plain["size"] == "8G"  # sccache alone: all of it


def test_split_size_adds_up() -> None:
    sccache, direct = cache_config.split_size("1000M")
    assert int(sccache[:-1]) + int(direct[:-3]) == 1000 * 1024
    assert int(direct[:-3]) == 1000 * 1024 // 4


def test_docker_job_turns_the_wrapper_on(tmp_path: Path) -> None:
    from factory.runners.base import BuildJob
    from factory.runners.docker import DockerRunner

    job = BuildJob(
        cell_id="c",
        python="3.13",
        image="factory-base:bookworm-py3.13",
        src_dir=tmp_path,
        out_dir=tmp_path / "o",
        wheelhouse=tmp_path,
        cuda_home=None,
        requirements=(),
        log_path=tmp_path / "l.log",
        cache_dir=tmp_path / "cc",
        cache_size="7G",
    )
    inside = DockerRunner(client=object()).inside_job(job)
    assert inside["python"] == "python3.13"  # the cell's interpreter, not the image's python3
    assert inside["cache"]["env"]["SCCACHE_CACHE_SIZE"] == f"{7 * 1024**2 * 3 // 4}K"
    assert inside["cache"]["dir"] == "/factory/cache/sccache"
    assert inside["cache"]["direct"]["env"]["CCACHE_DIR"] == "/factory/cache/ccache"
    assert inside["cache"]["nvcc_wrapper"]["path"].startswith("/factory/run/")


# -- images per Python version ---------------------------------------------------------------------

MATRIX = """
[settings]
base-image = "factory-base:bookworm"
[settings.images]
"3.13" = "factory-base:trixie"
[axes]
torch = ["2.14.1"]
cuda = ["13.0"]
archs = [["10.0"]]
python = ["3.11", "3.13"]
[packages.factory-example-ext]
recipe = "torch-extension"
versions = ["0.1.0"]
source = "."
"""


def test_images_per_python_version() -> None:
    m = load_matrix(text=MATRIX)
    assert m.settings.image_for("3.13") == "factory-base:trixie"
    assert m.settings.image_for("cp313") == "factory-base:trixie"
    assert m.settings.image_for("3.11") == "factory-base:bookworm"
    wheels = {pc.cell.python: pc.wheel for pc in m.cells}
    # The platform tag is the cell's glibc floor (torch's 2_28 by default), whatever the image.
    assert wheels["3.11"].endswith("manylinux_2_28_x86_64.whl")
    assert wheels["3.13"].endswith("manylinux_2_28_x86_64.whl")
    # With manylinux = "auto" it follows the glibc of the cell's own image.
    auto = load_matrix(text=MATRIX.replace("[settings]\n", '[settings]\nmanylinux = "auto"\n'))
    wheels = {pc.cell.python: pc.wheel for pc in auto.cells}
    assert wheels["3.11"].endswith("manylinux_2_36_x86_64.whl")
    assert wheels["3.13"].endswith("manylinux_2_41_x86_64.whl")


def test_images_table_is_checked() -> None:
    with pytest.raises(ConfigError, match="unparseable Python version"):
        load_matrix(text=MATRIX.replace('"3.13" = "factory-base:trixie"', '"py3" = "x"'))


def test_python_image_names() -> None:
    from factory.toolchain.python_image import parse_image

    assert parse_image("factory-base:bookworm-py3.13") == ("bookworm", "3.13")
    assert parse_image("factory-base:trixie") == ("trixie", None)


# -- stats --------------------------------------------------------------------------------


def test_parse_stats_counts_objects_and_steps() -> None:
    s = parse_stats(json.dumps(STATS))
    assert (s.hits, s.misses) == (3, 6)
    assert (s.object_hits, s.object_misses) == (0, 3)  # cuda [nvcc] x2 and c++ [gcc]
    assert s.by_step["ptx [cicc]"] == (1, 1)
    assert s.max_cache_size == 20 * 1024**3
    assert "cubin [ptxas] 1/2" in s.summary()


def test_stats_from_a_report_without_the_cache() -> None:
    assert compile_cache.stats_from_report({"exit_code": 0}) is None
    assert compile_cache.stats_from_report({"sccache": STATS}) == parse_stats(STATS)


def test_recorded_builds_reads_the_latest_report(tmp_path: Path) -> None:
    logs = tmp_path / "cell-a" / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1.log.report.json").write_text(json.dumps({"sccache": STATS}))
    (tmp_path / "cell-b" / "logs").mkdir(parents=True)  # never built with the cache
    builds = compile_cache.recorded_builds(tmp_path)
    assert [b["cell"] for b in builds] == ["cell-a"]
    assert builds[0]["hits"] == 3


def test_clear_empties_but_keeps_the_dir(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_bytes(b"12345")
    (tmp_path / "y").write_bytes(b"1")
    gone = compile_cache.clear(tmp_path)
    assert (gone.files, gone.bytes) == (2, 6)
    assert tmp_path.is_dir() and not any(tmp_path.iterdir())


def test_cache_command_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from factory.cli import main

    text = MATRIX.replace(
        "[settings.images]", '[settings.compile-cache]\nsize = "3G"\n[settings.images]'
    )
    (tmp_path / "matrix.toml").write_text(text)
    assert main(["cache", "stats", "--json", "--matrix", str(tmp_path / "matrix.toml")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1
    assert out["cache"]["size"] == "3G" and out["cache"]["bound_bytes"] == 3 * 1024**3


# -- the nvcc wrapper ----------------------------------------------------------------------


def _wrapper_setup(tmp_path: Path, text: str, python: str) -> tuple[Path, Path, Path]:
    """A venv's site-packages, the run dir's links and the wrapper; fake python, sccache and
    ccache."""
    site = tmp_path / f"venv/lib/python{python}/site-packages"
    site.mkdir(parents=True)
    include = tmp_path / f"usr/include/python{python}"
    include.mkdir(parents=True)
    link = tmp_path / "run/site-packages"
    link.parent.mkdir()
    wrapper = tmp_path / "run/wrapper"
    wrapper.write_text(text.replace("@LINK@", str(link)).replace(
        "@INCLUDE_LINK@", str(tmp_path / "run/python-include")))
    wrapper.chmod(0o755)
    fake_tools(tmp_path / "bin", site, include)
    return site, link, wrapper


@pytest.mark.parametrize("direct", [False, True])
def test_wrapper_spells_site_packages_through_the_link(tmp_path: Path, direct: bool) -> None:
    site, link, wrapper = _wrapper_setup(tmp_path, cache_config.NVCC_WRAPPER, "3.13")
    include = tmp_path / "usr/include/python3.13"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CUDA_HOME": "/opt/cuda"}
    if direct:
        env["CCACHE_DIR"] = str(tmp_path / "ccache")
    out = subprocess.run(
        [str(wrapper), f"-I{site}/torch/include", f"-I{include}", "-c", "a b.cu"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [
        "ccache" if direct else "sccache",  # the direct layer runs sccache itself on a miss
        "/opt/cuda/bin/nvcc",
        f"-I{link}/torch/include",
        f"-I{tmp_path / 'run/python-include'}",
        "-c",
        "a b.cu",
    ]
    assert os.readlink(link) == str(site)
    assert os.readlink(tmp_path / "run/python-include") == str(include)


@pytest.mark.parametrize("host_cxx", [None, "g++-12"])
def test_cxx_wrapper_runs_the_builds_own_compiler_through_the_link(
    tmp_path: Path, host_cxx: str | None
) -> None:
    site, link, wrapper = _wrapper_setup(tmp_path, cache_config.CXX_WRAPPER, "3.11")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    if host_cxx:
        env["FACTORY_HOST_CXX"] = host_cxx
    out = subprocess.run(
        [str(wrapper), "-MMD", f"-I{site}/torch/include", "-c", "ops.cpp"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert out == ["sccache", host_cxx or "c++", "-MMD", f"-I{link}/torch/include", "-c",
                   "ops.cpp"]


# -- integration: real sccache and nvcc ------------------------------------------------------------


def test_direct_stats_count_objects_from_ccaches_stats_log(tmp_path: Path) -> None:
    from factory.runners.inside.cache import direct_stats as _direct_stats

    # records as ccache 4.7 writes them (a miss, a hit, and a call it could not cache)
    log = tmp_path / "ccache-stats.log"
    log.write_text(
        "# csrc/add.cu\ncache_miss\ndirect_cache_miss\nlocal_storage_read_miss\n"
        "local_storage_write\nlocal_storage_write\n"
        "# csrc/relu.cu\ndirect_cache_hit\nlocal_storage_hit\nlocal_storage_read_hit\n"
        "local_storage_read_hit\n"
        "# conftest.c\ncompiler_check_failed\n"
    )
    assert _direct_stats(str(log)) == {"hits": 1, "misses": 1, "uncacheable": 1}
    assert _direct_stats(str(tmp_path / "absent")) == {"hits": 0, "misses": 0, "uncacheable": 0}


def test_stats_from_a_report_with_the_direct_layer() -> None:
    stats = compile_cache.stats_from_report(
        {"sccache": STATS, "direct_cache": {"hits": 4, "misses": 1, "uncacheable": 0}})
    assert stats is not None and (stats.direct_hits, stats.direct_misses) == (4, 1)
    assert stats.summary().startswith("4 of 5 objects whole (ccache); sccache ")
    only_direct = compile_cache.stats_from_report({"direct_cache": {"hits": 2, "misses": 0}})
    assert only_direct is not None and only_direct.direct_hits == 2 and only_direct.hits == 0
