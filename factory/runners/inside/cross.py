"""A cross build's target: the target's torch and CUDA runtime unpacked for its platform, and
the build Python's configuration rewritten for the target's triplet where it has none."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from .log import Log
from .steps import clean_env, run_step
from .toolkit import toolkit_root


def prepare_target(
    cross: dict[str, Any], python: str, log: Log, report: dict[str, Any],
    cuda_home: str | None = None,
) -> tuple[int, dict[str, str]]:
    """A cross build: unpack the target's torch and CUDA runtime (``pip install --target`` for
    the target's platform tags: no emulation), once per requirement set; return the build's
    environment (factory.toolchain.cross says why each variable)."""
    target = Path(cross["target_dir"])
    stamp = target / ".factory-target"
    key = hashlib.sha256(
        json.dumps([cross["requirements"], cross["pip_args"]], sort_keys=True).encode()
    ).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != key:
        report["phase"] = "target"
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=False)
        t0 = time.monotonic()
        code = run_step(
            [python, "-m", "pip", "install", "--no-index", "--find-links", cross["wheelhouse"],
             "--target", str(target), *cross["pip_args"], *cross["requirements"]],
            env=clean_env({}), cwd=None, log=log,
        )
        report["target_install_seconds"] = round(time.monotonic() - t0, 1)
        if code != 0:
            return code, {}
        stamp.write_text(key + "\n")
    torch_include = target / "torch" / "include"
    includes = [torch_include, torch_include / "torch" / "csrc" / "api" / "include"]
    # CUDA 13 keeps thrust/cub/libcu++ in include/cccl, which nvcc adds from nvcc.profile for
    # its own target directory; with a cross -ccbin a system toolkit's nvcc did not (seen on the
    # GPU machine: torch's headers stop at thrust/complex.h), so it is named here
    cccl = toolkit_root(cuda_home) / "include" / "cccl"
    if cccl.is_dir():
        includes.append(cccl)
    libs = [target / "torch" / "lib"]
    for cudart in sorted(target.glob("nvidia/*/lib/libcudart.so.*")):
        # the runtime wheels ship only libcudart.so.N; -lcudart needs the unversioned name
        link = cudart.with_name("libcudart.so")
        if not link.exists():
            link.symlink_to(cudart.name)
        libs.append(cudart.parent)
    env = dict(cross["env"])
    code, extra_include, sysconfig_dir = _target_python_config(python, target, env, log)
    if code != 0:
        return code, {}
    includes += extra_include
    if sysconfig_dir:
        env["PYTHONPATH"] = sysconfig_dir
    inc = " ".join(f"-I{d}" for d in includes)
    env.update({
        "CFLAGS": inc, "CXXFLAGS": inc, "NVCC_PREPEND_FLAGS": inc,
        "LDFLAGS": " ".join(f"-L{d}" for d in dict.fromkeys(libs)),
    })
    log.line(f"factory: cross build for {cross['target']}: target torch from {target}")
    return 0, env


# Run by the build's Python: where its stdlib and headers are, and its build-time variables.
_PY_CONFIG = """
import importlib, json, sys, sysconfig
name = sysconfig._get_sysconfigdata_name()
json.dump({"stdlib": sysconfig.get_path("stdlib"), "include": sysconfig.get_path("include"),
           "vars": importlib.import_module(name).build_time_vars}, sys.stdout)
"""
_X86_ONLY_FLAG = re.compile(r"^(-m\S+|-fcf-protection\S*)$")


def _target_python_config(
    python: str, target: Path, env: dict[str, str], log: Log
) -> tuple[int, list[Path], str | None]:
    """What the target's Python headers and sysconfig data would give, for build Pythons that do
    not ship them (Debian has them as multiarch packages, libpython3.X-dev:arm64; a pyenv or
    standalone Python, or a GPU box without the package, has only its own): a sysconfigdata
    module made from the build Python's, for the target's triplet and compilers, and the
    multiarch pyconfig.h that Debian's pyconfig.h dispatcher includes. Both CPUs are LP64
    little-endian Linux: the values that differ are the names this rewrites."""
    name = env["_PYTHON_SYSCONFIGDATA_NAME"]
    triplet = name.removeprefix("_sysconfigdata__")
    proc = subprocess.run([python, "-c", _PY_CONFIG], capture_output=True, text=True,
                          env=clean_env({}))
    if proc.returncode != 0:
        log.line(f"factory: cannot read the build Python's configuration: {proc.stderr.strip()}")
        return proc.returncode, [], None
    info = json.loads(proc.stdout)
    extra_include: list[Path] = []
    header = Path(info["include"]) / "pyconfig.h"
    version = Path(info["include"]).name  # python3.11
    if header.is_file() and f"{triplet}/{version}/pyconfig.h" in header.read_text(errors="replace"):
        wanted = Path("/usr/include") / triplet / version / "pyconfig.h"
        if not wanted.is_file():
            own = next(Path("/usr/include").glob(f"*-linux-gnu/{version}/pyconfig.h"), None)
            if own is None:
                log.line(f"factory: {header} includes {wanted}, which is missing")
                return 1, [], None
            made = target / "_include" / triplet / version / "pyconfig.h"
            made.parent.mkdir(parents=True, exist_ok=True)
            made.write_text(own.read_text())
            extra_include.append(target / "_include")
            log.line(f"factory: no {wanted}: using {own} for {triplet}")
    if (Path(info["stdlib"]) / f"{name}.py").is_file():
        return 0, extra_include, None
    host_triplet = next((t for t in ("x86_64-linux-gnu", "aarch64-linux-gnu") if t != triplet), "")
    values = {}
    for key, value in info["vars"].items():
        if isinstance(value, str):
            value = value.replace(host_triplet, triplet)
            if "FLAGS" in key or key in ("OPT", "CONFIGURE_CFLAGS", "CFLAGSFORSHARED"):
                value = " ".join(t for t in value.split() if not _X86_ONLY_FLAG.match(t))
        values[key] = value
    # the compilers (with a glibc sysroot, the job's CC/CXX name its wrappers and win anyway)
    cc, cxx = env.get("CC", f"{triplet}-gcc"), env.get("CXX", f"{triplet}-g++")
    values.update({"CC": cc, "CXX": cxx, "LDSHARED": f"{cc} -shared",
                   "LDCXXSHARED": f"{cxx} -shared", "BLDSHARED": f"{cc} -shared",
                   "MULTIARCH": triplet})
    made_dir = target / "_sysconfig"
    made_dir.mkdir(parents=True, exist_ok=True)
    (made_dir / f"{name}.py").write_text(f"build_time_vars = {values!r}\n")
    log.line(f"factory: the build Python has no {name}: made one from its own for {triplet}")
    return 0, extra_include, str(made_dir)
