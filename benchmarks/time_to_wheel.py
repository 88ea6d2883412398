"""Time to wheel: from a torch release appearing on the index to a wheel a host can install.

Measured, for the bundled example on this builder: a PyPI stand-in on loopback serves torch
2.14.1 (last night's newest; its cell stands published), then torch 2.99.0 appears (the real
2.14.1 wheel re-versioned: tests/pypi_standin.py), and the nightly's real commands run:
``factory lock``, ``factory build --missing --publish --cache``, ``factory index rebuild``;
then pip installs the new wheel from ``factory serve`` and torch 2.99.0 from the stand-in into
a clean venv, and the example imports there. Then a quiet night (nothing new) is timed too.

Predicted, for flash-attn on the repo's builders (.github/builders.toml): ``factory schedule``
(the planner's per-cell model) on the cells the default matrix's rules give for the newest
torch release, with nothing of them in the store.

    python benchmarks/time_to_wheel.py                  # warm: the shared venvs, compile cache
    python benchmarks/time_to_wheel.py --cold           # a fresh venv dir and compile cache
    python benchmarks/time_to_wheel.py --json results.json

Needs the docker engine, the base image and the cp311 wheelhouse (`docker/setup-host.sh`); the
CUDA toolkit is fetched from PyPI first when it is not there.
One heavy build: run it alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ops_builds import publish_build  # noqa: E402
from time_to_wheel import NEW_TORCH, PACKAGE, Setup, installed, standin_setup  # noqa: E402

CACHE = REPO / ".cache" / "factory"


def measured(*, cold: bool) -> dict[str, Any]:
    from factory.matrix.load import load_matrix
    from factory.toolchain.toolkit import materialize_cuda_home

    # the CUDA toolkit from the real PyPI first, as the test's fixture makes it (the stand-in
    # serves the wheelhouse only); a toolkit already there costs nothing
    old_id = f"{PACKAGE}-0.1.0-torch2.14.1-cu130-sm100-cp311"
    example = load_matrix(REPO / "matrix.toml").find(old_id)
    materialize_cuda_home(example.toolchain, CACHE / "toolkits")
    scratch = Path(tempfile.mkdtemp(prefix="time-to-wheel-"))
    venvs = scratch / "venvs" if cold else CACHE / "venvs"
    out: dict[str, Any] = {"cold": cold}
    try:
        with standin_setup(wheelhouse=CACHE / "wheelhouse", cache=CACHE / "time-to-wheel",
                           venvs=venvs, root=scratch / "run") as s:
            if cold:
                _cold_compile_cache(s)
            s.factory("lock", "lock", "--matrix", str(s.matrix)).check()
            old = load_matrix(s.matrix).find(f"{PACKAGE}-0.1.0-torch2.14.1-cu130-sm100-cp311")
            publish_build(s.store, scratch / "last-night", old)
            s.release(CACHE / "time-to-wheel")
            t0 = time.monotonic()
            steps = s.nightly()
            with s.served() as index:
                install = s.install(index).check()
            total = time.monotonic() - t0
            got = installed(install)
            assert got[PACKAGE].endswith("torch2.99sm100"), got
            out["release"] = {st.name: round(st.seconds, 1) for st in [*steps, install]}
            out["release"]["total"] = round(total, 1)
            out["build_detail"] = _build_lines(steps[1].stderr)
            t1 = time.monotonic()
            quiet = s.nightly()
            out["quiet"] = {st.name: round(st.seconds, 1) for st in quiet}
            out["quiet"]["total"] = round(time.monotonic() - t1, 1)
            out["torch"] = got["torch"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _cold_compile_cache(s: Setup) -> None:
    text = s.matrix.read_text()
    s.matrix.write_text(text.replace(str(CACHE / "compile-cache"),
                                     str(s.root / "compile-cache")))


def _build_lines(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines()
            if "built " in line or "attempt" in line.lower() and "compile" in line.lower()][-6:]


def predicted() -> list[dict[str, Any]]:
    """flash-attn's cells for each of the two newest torch releases in the default matrix
    (what that release brought), scheduled on .github/builders.toml with none of them built."""
    from factory.matrix.load import load_matrix
    from factory.upstream.facts import shipped_snapshot

    out = []
    for version in [str(v) for v in shipped_snapshot().torch_versions()[-2:]][::-1]:
        with tempfile.TemporaryDirectory() as tmp:
            text = (REPO / "matrix.toml").read_text().replace(
                'torch = ["latest:2"]', f'torch = ["{version}"]')
            text = text.split("\n[[include]]\n")[0]  # the one-off cells are no release's
            matrix = Path(tmp) / "matrix.toml"
            matrix.write_text(text.replace('source = "tests/example_ext"',
                                           f'source = "{REPO / "tests" / "example_ext"}"'))
            cells = load_matrix(matrix).cells_of(["flash-attn"])
            r = subprocess.run(
                [sys.executable, "-m", "factory", "schedule", "--matrix", str(matrix),
                 "--builders", str(REPO / ".github" / "builders.toml"), "--package",
                 "flash-attn", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600)
            if r.returncode != 0:
                raise SystemExit(r.stderr)
            doc = json.loads(r.stdout)
        out.append({"torch": version, "cells": len(cells),
                    "cudas": sorted({pc.cell.cuda for pc in cells}),
                    "makespan_s": doc["makespan_seconds"],
                    "group_bound_s": doc["group_bound_seconds"],
                    "fluid_bound_s": doc["lower_bound_seconds"], "unplaced": len(doc["unplaced"])})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true",
                        help="a fresh venv dir and compile cache (a builder that never saw it)")
    parser.add_argument("--predict-only", action="store_true", help="only the flash-attn figure")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {"predicted_flash_attn": predicted()}
    if not args.predict_only:
        results["example"] = measured(cold=args.cold)
    for p in results["predicted_flash_attn"]:
        print(f"flash-attn, torch {p['torch']} (CUDA {', '.join(p['cudas'])}): {p['cells']} "
              f"cells on .github/builders.toml, predicted makespan {p['makespan_s'] / 60:.0f} "
              f"min (whole-group bound {p['group_bound_s'] / 60:.0f} min, fluid "
              f"{p['fluid_bound_s'] / 60:.0f} min)")
    if "example" in results:
        e = results["example"]
        print(f"example, torch {NEW_TORCH} appears ({'cold' if e['cold'] else 'warm'}):")
        for k, v in e["release"].items():
            print(f"    {k:8} {v:8.1f} s")
        print("a quiet night:")
        for k, v in e["quiet"].items():
            print(f"    {k:8} {v:8.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
