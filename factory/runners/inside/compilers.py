"""The factory's compiler wrappers: every nvcc and host C++ call of a build passes through here.

This file is written out as the wrapper itself (``<toolkit>/bin/nvcc`` and ``factory-c++``,
with a ``#!python -IS`` line), so it is self-contained: the standard library and nothing else.

nvcc: the cell's archs are what nvcc compiles, whatever the package asks for. A package that
hard-codes its ``-gencode`` list (causal-conv1d, mamba-ssm: nine archs with CUDA 13) would
otherwise compile every one of them in a one-arch cell, and ``TORCH_CUDA_ARCH_LIST`` changes
nothing. Targets outside the cell's archs are dropped (``-gencode``, ``--generate-code``,
``-arch``/``-code``); a call left with no SASS for any of the cell's archs fails in one line
(one that makes no device code, ``-E`` or ``-M``, passes as it is); a compile that names no arch
at all gets the cell's.

C++ standard: where torch needs one (``FACTORY_CXX_STD``, torch >= 2.13: C++20), a pinned
``-std=c++14/17`` (nvcc or the host compiler, also inside ``-Xcompiler``) is raised to it, and an
nvcc compile that names none gets it.

Configuration (the build's environment): ``FACTORY_CELL_ARCHS`` ("90,100"), ``FACTORY_CXX_STD``
("20" or empty), ``FACTORY_NVCC_NEXT`` / ``FACTORY_CXX_NEXT`` (the command each wrapper runs:
the real compiler, or the compile cache's wrapper in front of it), ``FACTORY_COMPILER_LOG`` (one
JSON line per call that was changed or refused, for the build's report).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

# An arch name: sm_90, sm_90a, sm_100f, compute_90, lto_90.
_TARGET_RE = re.compile(r"^(sm|compute|lto)_(\d+)([a-z]?)$")
# The options that choose targets, short and long spellings.
_GENCODE = ("-gencode", "--generate-code")
_ARCH = ("-arch", "--gpu-architecture")
_CODE = ("-code", "--gpu-code")
# Options that make nvcc produce device code for its targets.
_COMPILE = {"-c", "--compile", "-dc", "--device-c", "-dw", "--device-w", "-cubin", "--cubin",
            "-fatbin", "--fatbin", "-ptx", "--ptx", "-dlink", "--device-link"}
# Options that make nvcc stop before device code: preprocessing, dependency lists (not -MD/-MMD,
# which write the list beside a compile); a host compiler's -M/-MM through -Xcompiler likewise.
_NO_DEVICE_CODE = {"-E", "--preprocess", "-M", "--generate-dependencies", "-MM",
                   "--generate-nonsystem-dependencies"}
_HOST_DEPENDENCIES = {"-M", "-MM"}
# -std values below a standard (C++20: everything older).
_OLD_STD = re.compile(r"(-std=|--std=)(c|gnu)\+\+(98|03|0x|11|1y|14|1z|17)\b")
_STD_VALUE = re.compile(r"^(c|gnu)\+\+(98|03|0x|11|1y|14|1z|17)$")
_HOST_OPTS = ("-Xcompiler", "--compiler-options")
_SOURCE_RE = re.compile(r"\.(cu|cpp|cc|cxx|c|C)$")


class Refused(Exception):
    """A call that would compile none of the cell's archs (the message is the one line)."""


def _arch_number(name: str) -> tuple[str, int, str] | None:
    m = _TARGET_RE.match(name.strip())
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def _codes(value: str) -> list[str]:
    """'sm_90' / '[sm_90,compute_90]' / '"sm_90,compute_90"' -> the names."""
    value = value.strip().strip('"').strip("'").strip("[]")
    return [c.strip() for c in value.split(",") if c.strip()]


def _parse_gencode(value: str) -> tuple[str, list[str]]:
    """'arch=compute_90,code=[sm_90,compute_90]' -> ('compute_90', ['sm_90', 'compute_90'])."""
    value = value.strip().strip('"').strip("'")
    m = re.match(r"^arch=([^,]+),code=(.+)$", value)
    if not m:
        raise Refused(f"cannot read nvcc target {value!r}")
    return m.group(1), _codes(m.group(2))


def _option(argv: Sequence[str], i: int, names: tuple[str, ...]) -> tuple[str, int] | None:
    """The value of option ``argv[i]`` if it is one of ``names`` (``-x v`` or ``-x=v``), and how
    many tokens it takes."""
    arg = argv[i]
    for name in names:
        if arg == name and i + 1 < len(argv):
            return argv[i + 1], 2
        if arg.startswith(name + "="):
            return arg[len(name) + 1:], 1
    return None


def targets_of(argv: Sequence[str]) -> tuple[list[tuple[str, list[str]]], list[int], bool]:
    """The (virtual arch, codes) targets a call asks for, the indexes of the tokens that ask,
    and whether it asked for 'native', 'all' or 'all-major' (decided by the machine, not it)."""
    targets: list[tuple[str, list[str]]] = []
    spans: list[int] = []
    arch: str | None = None
    code: list[str] | None = None
    special = False
    i = 0
    while i < len(argv):
        for names, kind in ((_GENCODE, "gencode"), (_ARCH, "arch"), (_CODE, "code")):
            found = _option(argv, i, names)
            if found is None:
                continue
            value, width = found
            spans.extend(range(i, i + width))
            if kind == "gencode":
                targets.append(_parse_gencode(value))
            elif kind == "arch":
                if value in ("native", "all", "all-major"):
                    special = True
                else:
                    arch = value
            else:
                code = _codes(value)
            i += width
            break
        else:
            i += 1
    if arch is not None:
        parsed = _arch_number(arch)
        if parsed is None:
            raise Refused(f"cannot read nvcc arch {arch!r}")
        kind, number, suffix = parsed
        virtual = f"compute_{number}{suffix}"
        if code is None:  # -arch=sm_90: SASS and PTX for 90 (nvcc's own shorthand)
            code = [f"sm_{number}{suffix}", virtual] if kind == "sm" else [virtual]
        targets.append((virtual, code))
    elif code is not None:
        raise Refused("nvcc -code without -arch")
    return targets, spans, special


def _sass(targets: Sequence[tuple[str, list[str]]]) -> list[int]:
    found = set()
    for _, codes in targets:
        for c in codes:
            parsed = _arch_number(c)
            if parsed and parsed[0] == "sm":
                found.add(parsed[1])
    return sorted(found)


def _gencode(virtual: str, codes: Sequence[str]) -> str:
    code = codes[0] if len(codes) == 1 else "[" + ",".join(codes) + "]"
    return f"-gencode=arch={virtual},code={code}"


def _source(argv: Sequence[str]) -> str:
    for a in argv:
        if _SOURCE_RE.search(a) and not a.startswith("-"):
            return a
    for i, a in enumerate(argv[:-1]):
        if a == "-o":
            return argv[i + 1]
    return ""


def makes_no_device_code(argv: Sequence[str]) -> bool:
    """A preprocess-only or dependency-only call (``-E``, ``-M``, ``-MM``, their long forms, or
    a host compiler's ``-M``/``-MM`` through ``-Xcompiler``): nvcc compiles nothing."""
    for i, arg in enumerate(argv):
        if arg in _NO_DEVICE_CODE:
            return True
        host = _option(argv, i, _HOST_OPTS)
        if host and _HOST_DEPENDENCIES & {h.strip() for h in host[0].split(",")}:
            return True
    return False


def narrow(argv: Sequence[str], archs: Sequence[int]) -> tuple[list[str], dict[str, Any]]:
    """``argv`` (nvcc's arguments) with only the cell's ``archs`` as targets, and a record of
    what changed (empty when nothing did). Raises Refused when none of them would be compiled;
    a call that makes no device code (preprocessing, a dependency list) keeps its targets then:
    it compiles nothing to refuse."""
    cell = sorted(set(archs))
    targets, spans, special = targets_of(argv)
    compiles = any(a in _COMPILE for a in argv)
    wanted = ", ".join(f"sm_{a}" for a in cell)
    if not targets and not special:
        if not compiles:
            return list(argv), {}  # --version, -E, a probe: no device code
        injected = [_gencode(f"compute_{a}", [f"sm_{a}"]) for a in cell]
        return [*argv, *injected], {"asked": [], "compiled": cell, "injected": True}
    kept: list[tuple[str, list[str]]] = []
    for virtual, codes in targets:
        inside = [c for c in codes if (p := _arch_number(c)) is not None and p[1] in cell]
        if inside:
            kept.append((virtual, inside))
    if special:  # 'native'/'all': the cell's, whatever this machine has
        kept += [(f"compute_{a}", [f"sm_{a}"]) for a in cell
                 if a not in _sass(kept)]
    asked, compiled = _sass(targets), _sass(kept)
    if not compiled and makes_no_device_code(argv):
        return list(argv), {}
    if not compiled:
        what = ", ".join(f"sm_{a}" for a in asked) or "PTX only"
        raise Refused(f"nvcc would compile none of the cell's archs ({wanted}) for "
                      f"{_source(argv) or 'this call'}: the package asks for {what}")
    if kept == targets and not special:
        return list(argv), {}
    first = spans[0]
    rest = [a for i, a in enumerate(argv) if i not in set(spans)]
    position = sum(1 for i in range(first) if i not in set(spans))
    new = [*rest[:position], *(_gencode(v, c) for v, c in kept), *rest[position:]]
    return new, {"asked": asked, "compiled": compiled,
                 "dropped": sorted(set(asked) - set(compiled))}


def _raised(std: int, *, keep_family: bool) -> Callable[[re.Match[str]], str]:
    """The replacement for one old -std: 'c++20', or 'gnu++20' where the family is kept."""
    return lambda m: f"{m.group(1)}{m.group(2) if keep_family else 'c'}++{std}"


def raise_std(argv: Sequence[str], std: int | None, *, nvcc: bool) -> tuple[list[str], str]:
    """``argv`` with every -std below C++``std`` raised to it (nvcc only knows c++NN; a host
    compiler keeps gnu++ as gnu++); nvcc compiles that name none get one. Returns the new argv and
    what changed ('' for nothing)."""
    if not std or std < 20:
        return list(argv), ""
    out: list[str] = []
    changed: list[str] = []
    has_std = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if nvcc and arg in ("-std", "--std") and i + 1 < len(argv):
            has_std = True
            value = argv[i + 1]
            if _STD_VALUE.match(value):
                changed.append(f"{value} -> c++{std}")
                value = f"c++{std}"
            out += [arg, value]
            i += 2
            continue
        # a host flag (after -Xcompiler) keeps its gnu++; nvcc's own -std knows c++NN only
        host = not nvcc or arg.startswith(_HOST_OPTS) or (i > 0 and argv[i - 1] in _HOST_OPTS)
        if arg.startswith(("-std=", "--std=")) and not host:
            has_std = True
        new = _OLD_STD.sub(_raised(std, keep_family=bool(host)), arg)
        if new != arg:
            changed.append(f"{arg} -> {new}")
        out.append(new)
        i += 1
    if nvcc and not has_std and any(a in _COMPILE for a in argv):
        out.append(f"-std=c++{std}")
        changed.append(f"-std=c++{std} added")
    return out, "; ".join(changed)


def _log(record: dict[str, Any]) -> None:
    path = os.environ.get("FACTORY_COMPILER_LOG")
    if not path:
        return
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one short write with O_APPEND: lines never interleave
        finally:
            os.close(fd)
    except OSError:
        pass


def _cell_archs() -> list[int]:
    return [int(a) for a in os.environ.get("FACTORY_CELL_ARCHS", "").split(",") if a.strip()]


def main(argv: Sequence[str]) -> int:
    """Run as ``nvcc`` or as the host C++ compiler (the name it was called by decides)."""
    tool = "nvcc" if os.path.basename(argv[0]) == "nvcc" else "c++"
    args = list(argv[1:])
    std_text = os.environ.get("FACTORY_CXX_STD", "")
    std = int(std_text) if std_text.isdigit() else None
    record: dict[str, Any] = {}
    try:
        if tool == "nvcc":
            args, record = narrow(args, _cell_archs())
        args, std_change = raise_std(args, std, nvcc=tool == "nvcc")
    except Refused as exc:
        _log({"tool": tool, "source": _source(args), "refused": str(exc)})
        sys.stderr.write(f"factory: {exc}\n")
        return 1
    if std_change:
        record["std"] = std_change
    if record:
        _log({"tool": tool, "source": _source(args), **record})
    nxt = shlex.split(os.environ.get("FACTORY_NVCC_NEXT" if tool == "nvcc" else
                                     "FACTORY_CXX_NEXT", ""))
    if not nxt:
        sys.stderr.write(f"factory: the {tool} wrapper has no compiler to run "
                         f"(FACTORY_{'NVCC' if tool == 'nvcc' else 'CXX'}_NEXT unset)\n")
        return 127
    os.execvp(nxt[0], [*nxt, *args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
