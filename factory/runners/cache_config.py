"""The compile cache as a build sees it: the ``cache`` entry of the inside script's job
(sccache's dir and bound, ccache's settings in front of it) and the compiler wrappers that spell
site-packages and the Python include dir through fixed links in the run dir. Why they are what
they are: ``factory.build.compile_cache``, which owns the cache on the builder (its settings,
the remote, the stats); the runners take only this, so they import nothing of the build stage.
"""

from __future__ import annotations

from typing import Any

from factory.runners.base import INSIDE
from factory.units import parse_size

# The fixed links in every build container's run dir (the same inside paths on every run).
INSIDE_SITE_LINK = f"{INSIDE['run']}/site-packages"
INSIDE_INCLUDE_LINK = f"{INSIDE['run']}/python-include"
SCCACHE_SUBDIR = "sccache"
DIRECT_SUBDIR = "ccache"
DIRECT_SHARE = 4  # the direct layer gets 1/DIRECT_SHARE of the size bound
DIRECT_STATS_LOG = "ccache-stats.log"
# ccache's key holds the compiler's identity: nvcc's version and its host compiler's (or the
# C++ compiler's own, for the C++ wrapper, where %compiler% is it).
DIRECT_COMPILER_CHECK = "%compiler% --version; gcc --version"
WRAPPER_NAME = "nvcc-cached"
CXX_WRAPPER_NAME = "cxx-cached"

# A compiler through the cache, with the venv's site-packages and the interpreter's include dir
# spelled through fixed links. Every Python version then compiles an object with the same command
# and the same preprocessed text. The links are made on first use, atomically (ninja starts
# several compilers at once). With the direct layer on (CCACHE_DIR set, ccache in the image):
# ccache, which runs sccache on its misses (CCACHE_PREFIX); otherwise sccache alone.
_CACHED_COMPILER = r"""#!/bin/sh
# Written by factory.build.compile_cache: @WHAT@ through the compile cache, paths spelled one way.
set -eu
link="@LINK@"
inc_link="@INCLUDE_LINK@"
if [ ! -e "$link" ] || [ ! -e "$inc_link" ]; then
    paths=$(python -c 'import sysconfig; p = sysconfig.get_paths()
print(p["purelib"]); print(p["include"])')
    ln -sfn "$(printf '%s\n' "$paths" | sed -n 1p)" "$link.$$"
    mv -Tf "$link.$$" "$link"
    ln -sfn "$(printf '%s\n' "$paths" | sed -n 2p)" "$inc_link.$$"
    mv -Tf "$inc_link.$$" "$inc_link"
fi
site=$(readlink "$link")
inc=$(readlink "$inc_link")
for arg do
    shift
    case $arg in
        *"$site"*) arg=$(printf '%s\n' "$arg" | sed "s|$site|$link|g") ;;
    esac
    case $inc in
        */python3*) case $arg in
            *"$inc"*) arg=$(printf '%s\n' "$arg" | sed "s|$inc|$inc_link|g") ;;
        esac ;;
    esac
    set -- "$@" "$arg"
done
if [ -n "${CCACHE_DIR:-}" ] && command -v ccache >/dev/null 2>&1; then
    exec ccache @COMPILER@ "$@"
fi
exec sccache @COMPILER@ "$@"
"""
# The real nvcc: CUDA_HOME's is the factory's arch wrapper (factory/runners/inside/toolkit.py),
# which runs this one next.
NVCC_WRAPPER = _CACHED_COMPILER.replace("@WHAT@", "nvcc").replace(
    "@COMPILER@", '"${FACTORY_REAL_NVCC:-${CUDA_HOME:+$CUDA_HOME/bin/}nvcc}"'
)
# The host C++ compiler for .cpp objects (torch's ninja file takes it from $CXX): the extension's
# own C++ (flash_api.cpp, op registrations) reads torch's headers from site-packages as well.
# FACTORY_HOST_CXX is the compiler the build would have used without the cache.
CXX_WRAPPER = _CACHED_COMPILER.replace("@WHAT@", "the C++ compiler").replace(
    "@COMPILER@", '"${FACTORY_HOST_CXX:-c++}"'
)


def split_size(size: str) -> tuple[str, str]:
    """The bound of the whole cache -> (sccache's, the direct layer's), in the units each tool
    reads: sccache ``K`` (KiB), ccache ``KiB``."""
    total_kib = parse_size(size) // 1024
    direct_kib = total_kib // DIRECT_SHARE
    return f"{total_kib - direct_kib}K", f"{direct_kib}KiB"


def inside_config(*, root: str, size: str, normalize_paths: bool) -> dict[str, Any]:
    """The ``cache`` entry of inside.py's job: sccache's dir and bound, extra environment and the
    compiler wrappers to write. ``root`` is the cache dir as the build sees it.
    ``normalize_paths`` only where every build sees the same inside paths (the docker runner):
    elsewhere the links would differ per run and break same-cell hits; the direct layer (ccache,
    called by the wrappers) comes with them."""
    cache_size, direct_size = split_size(size) if normalize_paths else (size, "")
    env = {"SCCACHE_CACHE_SIZE": cache_size}
    config: dict[str, Any] = {
        "dir": f"{root}/{SCCACHE_SUBDIR}",
        "size": cache_size,
        "env": env,
    }
    if normalize_paths:
        run_dir = INSIDE_SITE_LINK.rsplit("/", 1)[0]

        def wrapper(name: str, text: str) -> dict[str, str]:
            text = text.replace("@LINK@", INSIDE_SITE_LINK)
            return {"path": f"{run_dir}/{name}",
                    "text": text.replace("@INCLUDE_LINK@", INSIDE_INCLUDE_LINK)}

        config["nvcc_wrapper"] = wrapper(WRAPPER_NAME, NVCC_WRAPPER)
        config["cxx_wrapper"] = wrapper(CXX_WRAPPER_NAME, CXX_WRAPPER)
        # ccache's settings: depend mode (the key from the compiler's own -MD depfile, no
        # preprocessor run), sccache behind it, one stats record per object in the run dir.
        config["direct"] = {
            "env": {
                "CCACHE_DIR": f"{root}/{DIRECT_SUBDIR}",
                "CCACHE_MAXSIZE": direct_size,
                "CCACHE_PREFIX": "sccache",
                "CCACHE_DEPEND": "1",
                "CCACHE_COMPILERCHECK": DIRECT_COMPILER_CHECK,
                "CCACHE_STATSLOG": f"{run_dir}/{DIRECT_STATS_LOG}",
            },
        }
    return config
