"""Bad input, property-based: malformed matrix.toml files, malformed wheels and random command
lines. Each must end in one ``ERROR`` line on stderr (optionally one ``TIP`` line), a non-zero
exit code that is not the internal-error code, no traceback, and an unchanged store.

Most examples go through ``factory.cli.main(argv)`` in this process (fast); a handful through a
real ``python -m factory``. Examples are derandomized (the same ones every CI run) and bounded
so the file runs in well under a minute; ``FACTORY_FUZZ_SCALE=N`` runs N times as many,
with fresh random ones, when hunting for bugs.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_fixtures
import tomli_w
from cli_fixtures import BASE_MATRIX, assert_one_line_error, store_digest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from index_wheels import make_wheel

from factory.cli import COMMANDS, main
from factory.matrix.cell import parse_arch, parse_cuda, parse_python, parse_version

workspace = cli_fixtures.workspace
SCALE = int(os.environ.get("FACTORY_FUZZ_SCALE", "1"))


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        derandomize=SCALE == 1,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_in_process(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _cwd(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exits (--help) must not happen here
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def refused(workspace: Path, argv: list[str]) -> str:
    """Run, check the one-line error and the untouched store; return the error line."""
    before = store_digest(workspace)
    code, _, err = run_in_process(argv, workspace)
    assert_one_line_error(code, err, argv)
    assert store_digest(workspace) == before, f"{argv!r} changed the store"
    return err.splitlines()[0]


# -- matrix.toml ----------------------------------------------------------------------------------
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_scalars = (
    _text
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.datetimes()
)
_toml_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


def _unparseable(parse: Any) -> Any:
    def fails(value: str) -> bool:
        try:
            parse(value)
        except Exception:
            return True
        return False

    return _text.filter(fails)


# (where in the base matrix, the strategy of values that can never be valid there)
_BAD_VALUES = {
    ("axes", "torch"): st.lists(_unparseable(lambda v: parse_version(v, "torch")), min_size=1,
                                max_size=3),
    ("axes", "cuda"): st.lists(_unparseable(parse_cuda), min_size=1, max_size=3),
    ("axes", "python"): st.lists(_unparseable(parse_python), min_size=1, max_size=3),
    ("axes", "archs"): st.lists(_unparseable(parse_arch), min_size=1, max_size=3)
    | st.just([[]]) | st.just([]) | st.just([["10.0"], "9.0"])
    | st.lists(st.integers(min_value=10**6, max_value=2**63 - 1).map(str), min_size=1)
    | st.just(["10.0", "not-an-arch"]),
    ("packages", "demo-ext", "versions"): st.lists(
        _unparseable(lambda v: parse_version(v, "demo-ext")), min_size=1, max_size=3
    ) | st.just(["1.0+local"]) | st.just([1.5]),
    ("settings",): st.lists(_scalars, max_size=3) | _scalars,
    ("axes",): st.lists(_scalars, max_size=3) | _scalars,
    ("packages",): st.lists(_scalars, max_size=3) | _scalars | st.just({}),
    ("packages", "demo-ext"): st.lists(_scalars, max_size=3) | _scalars,
    ("include",): _scalars | st.lists(_scalars, min_size=1, max_size=3),
    ("version",): st.integers().filter(lambda v: v != 1) | _text,
    ("settings", "toolkit"): st.integers() | st.lists(_text.filter(
        lambda t: t not in ("pypi", "image", "system")), min_size=1) | st.just({}),
    ("settings", "runner"): _text.filter(lambda t: t not in ("docker", "local", "cibuildwheel"))
    | st.integers() | st.lists(_text, max_size=2),
    ("settings", "memory"): _text.filter(lambda t: t.strip() != "auto" and not t[:1].isdigit())
    | st.lists(_scalars, max_size=2) | st.booleans(),
    ("settings", "cpus"): st.integers(max_value=-1) | _text | st.floats(allow_nan=False),
    ("settings", "store"): st.integers() | st.lists(_text, max_size=2) | st.booleans(),
    ("settings", "images"): _scalars | st.just({"not-a-python": "img"}) | st.just({"3.12": 5}),
    ("settings", "compile-cache"): st.lists(_scalars, min_size=1, max_size=2)
    | st.just({"no-such-key": 1}) | st.just({"size": "lots"}),
    ("torch-indexes",): _scalars | st.just({"13.0": "ftp://x"}) | st.just({"x.y": "https://x"}),
    ("packages", "demo-ext", "source"): st.integers() | st.just("") | st.just("no/such/dir"),
    ("packages", "demo-ext", "sha256"): st.integers() | _text.filter(lambda t: len(t) != 64),
    ("packages", "demo-ext", "recipe"): _text.filter(
        lambda t: t not in ("torch-extension", "flash-attn")),
}


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@st.composite
def bad_value_matrix(draw: st.DrawFn) -> bytes:
    path = draw(st.sampled_from(sorted(_BAD_VALUES)))
    return tomli_w.dumps(_set(BASE_MATRIX, path, draw(_BAD_VALUES[path]))).encode()


_TABLES = {
    (): {"version", "settings", "axes", "packages", "include", "exclude", "torch-indexes"},
    ("settings",): set(),  # filled below from the code's own list
    ("axes",): {"torch", "cuda", "archs", "python"},
    ("packages", "demo-ext"): {"recipe", "versions", "source", "sha256", "torch", "cuda", "archs",
                               "python"},
}


@st.composite
def unknown_key_matrix(draw: st.DrawFn) -> bytes:
    from factory.matrix.settings import SETTINGS_KEYS

    where = draw(st.sampled_from(sorted(_TABLES)))
    allowed = SETTINGS_KEYS if where == ("settings",) else _TABLES[where]
    key = draw(_text.filter(lambda k: k not in allowed))
    return tomli_w.dumps(_set(BASE_MATRIX, (*where, key), draw(_toml_values))).encode()


@st.composite
def random_document(draw: st.DrawFn) -> bytes:
    """A random TOML structure with at least one key the matrix does not know."""
    doc = draw(st.dictionaries(_text, _toml_values, max_size=5))
    doc[draw(_text.filter(lambda k: k not in _TABLES[()]))] = draw(_toml_values)
    return tomli_w.dumps(doc).encode()


@st.composite
def broken_bytes(draw: st.DrawFn) -> bytes:
    """The valid matrix with invalid UTF-8, a line no TOML parser accepts, or a cut string."""
    good = tomli_w.dumps(BASE_MATRIX).encode()
    lines = good.split(b"\n")
    at = draw(st.integers(min_value=0, max_value=len(lines)))
    kind = draw(st.sampled_from(["non-utf8", "syntax", "unterminated", "nul", "deep"]))
    if kind == "non-utf8":
        junk = draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc", b"\xfe\xff"])
        )
        insert = b'junk = "' + junk + b'"'
    elif kind == "syntax":
        insert = b"= " + draw(st.binary(max_size=10)).replace(b"\n", b" ")
    elif kind == "unterminated":
        insert = b'unterminated = "' + draw(_text).encode().replace(b'"', b"").replace(b"\\", b"")
    elif kind == "nul":
        insert = b'nul = "a\x00b"'
    else:  # nesting far beyond anything real: the parser must not blow the stack
        depth = draw(st.integers(min_value=200, max_value=5000))
        insert = b"deep = " + b"[" * depth + b"]" * depth
        lines.insert(0, insert)  # a top-level key (unknown): first line, outside any table
        return b"\n".join(lines)
    lines.insert(at, insert)
    return b"\n".join(lines)


@st.composite
def huge_matrix(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["long-version", "huge-int", "many-values", "long-key"]))
    if kind == "long-version":
        doc = _set(BASE_MATRIX, ("axes", "torch"), ["2." + "1" * draw(st.integers(300, 100_000))])
    elif kind == "huge-int":
        doc = _set(BASE_MATRIX, ("axes", "cuda"), [draw(st.integers(10**6, 2**63 - 1))])
    elif kind == "many-values":
        doc = _set(BASE_MATRIX, ("axes", "python"),
                   [f"3.{i}" for i in range(draw(st.integers(100, 1000)))] + ["x"])
    else:
        doc = _set(BASE_MATRIX, ("settings", "k" * draw(st.integers(1000, 100_000))), 1)
    return tomli_w.dumps(doc).encode()


MATRIX_COMMANDS = [
    ["matrix"],
    ["matrix", "--json"],
    ["plan", "demo-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"],
    ["build", "--all", "--dry-run"],
    ["request", "demo-ext==0.1.0", "--torch", "2.14.1", "--cuda", "13.0", "--arch", "10.0",
     "--python", "3.11", "--print-cell"],
]
_bad_matrices = st.one_of(
    bad_value_matrix(), unknown_key_matrix(), random_document(), broken_bytes(), huge_matrix()
)


@fuzz_settings(400)
@given(data=_bad_matrices, command=st.sampled_from(MATRIX_COMMANDS))
def test_malformed_matrix_files_fail_in_one_line(
    workspace: Path, data: bytes, command: list[str]
) -> None:
    path = workspace / "bad-matrix.toml"
    path.write_bytes(data)
    refused(workspace, [*command, "--matrix", str(path)])


# -- wheels ---------------------------------------------------------------------------------------
_member_names = st.sampled_from([
    "../x", "../../etc/passwd", "demo_ext/../../x", "/abs/path", "/etc/cron.d/x", "a/../../b",
    "C:/windows/x", "demo_ext\\..\\..\\x", "c:evil",
]) | st.builds(  # zipfile cuts a name at a NUL: keep them out, or '..' is cut off too
    lambda a, b: f"{a}/../../{b}", *[_text.filter(lambda t: t and "\x00" not in t)] * 2
)


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@st.composite
def bad_wheel(draw: st.DrawFn, tmp: Path) -> Path:
    """One malformed wheel file (or path) that no publish may accept."""
    kind = draw(st.sampled_from([
        "truncated", "not-a-zip", "empty", "name-mismatch", "version-mismatch", "no-record",
        "no-metadata", "no-wheel-file", "traversal", "two-dist-infos", "no-dist-info",
        "huge-filename", "huge-member", "bad-filename", "missing-file", "directory",
        "metadata-not-utf8", "corrupt-member",
    ]))
    d = tmp / kind
    d.mkdir(parents=True, exist_ok=True)
    version = draw(st.sampled_from(["1.0", "0.1.0+cu130torch2.14", "2.8.3.post2"]))
    if kind == "truncated":
        w = make_wheel(d, "demo", version, payload_bytes=draw(st.integers(0, 5000)))
        data = w.read_bytes()
        w.write_bytes(data[: int(len(data) * draw(st.floats(0, 0.999)))])
    elif kind == "not-a-zip":
        w = d / "demo-1.0-py3-none-any.whl"
        w.write_bytes(draw(st.binary(min_size=1, max_size=2000)).replace(b"PK", b"pk"))
    elif kind == "empty":
        w = d / "demo-1.0-py3-none-any.whl"
        w.write_bytes(b"")
    elif kind == "name-mismatch":
        other = draw(st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True))
        assume(other != "demo")
        w = make_wheel(d, "demo", version, metadata_name=other)
    elif kind == "version-mismatch":
        other = draw(st.sampled_from(
            ["1.1", "0.0", "9!1.0", "not a version", " ", "1.0-", "1.0.dev0", "1" * 5000]
        ))
        w = make_wheel(d, "demo", version, metadata_version=other)
    elif kind in ("no-record", "no-metadata", "no-wheel-file"):
        w = make_wheel(d, "demo", version, skip_record=kind == "no-record")
        if kind != "no-record":
            gone = "METADATA" if kind == "no-metadata" else "WHEEL"
            with zipfile.ZipFile(w) as zf:
                members = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/" + gone)}
            _zip(w, members)
    elif kind == "traversal":
        w = make_wheel(d, "demo", version, extra_members={draw(_member_names): b"evil"})
    elif kind == "two-dist-infos":
        w = make_wheel(d, "demo", version, extra_members={"other-1.0.dist-info/METADATA": b"x"})
    elif kind == "no-dist-info":
        w = _zip(d / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""})
    elif kind == "huge-filename":
        w = make_wheel(d, "d" * draw(st.integers(200, 230)), "1.0")
    elif kind == "huge-member":
        w = make_wheel(d, "demo", version,
                       extra_members={"../" + "a" * draw(st.integers(256, 20_000)): b"x"})
    elif kind == "bad-filename":
        name = draw(st.sampled_from([
            "demo.whl", "demo-1.0.whl", "demo-x-y-z.zip", "-1.0-py3-none-any.whl",
            "demo-not_a_version-py3-none-any.whl", "demo-1.0-py3-none-any.whl.zip",
            ".hidden-1.0-py3-none-any.whl", "demo-1.0-py3-none-any..whl",
            "dëmo-1.0-py3-none-any.whl",
        ]))
        w = make_wheel(d, "demo", "1.0", filename=name)
    elif kind == "missing-file":
        w = d / draw(st.sampled_from(["nope-1.0-py3-none-any.whl", "x" * 300 + ".whl"]))
    elif kind == "directory":
        w = d / "demo-1.0-py3-none-any.whl"
        w.mkdir(exist_ok=True)
    elif kind == "metadata-not-utf8":
        w = make_wheel(d, "demo", version)
        with zipfile.ZipFile(w) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        meta = next(n for n in members if n.endswith("/METADATA"))
        members[meta] = b"Metadata-Version: 2.1\nName: \xff\xfe\nVersion: \x80\n\n"
        _zip(w, members)
    else:  # corrupt-member: flip a byte inside the stored payload; the CRC no longer matches
        w = make_wheel(d, "demo", version, payload_bytes=2000)
        data = bytearray(w.read_bytes())
        at = data.find(b"payload.bin") + len("payload.bin") + 30 + draw(st.integers(0, 1000))
        data[at] ^= 0xFF
        w.write_bytes(bytes(data))
    return w


@fuzz_settings(250)
@given(data=st.data())
def test_malformed_wheels_are_not_published(workspace: Path, data: st.DataObject) -> None:
    tmp = workspace / "bad-wheels"
    good = make_wheel(workspace / "good", "fine", "1.0")
    wheel = data.draw(bad_wheel(tmp))
    argv = data.draw(st.sampled_from([
        ["publish", str(wheel)],
        ["publish", "--store", str(workspace / "store"), str(good), str(wheel)],
        ["publish", "--json", str(wheel)],
    ]))
    refused(workspace, argv)


@fuzz_settings(120)
@given(data=st.data())
def test_malformed_wheels_fail_verification(workspace: Path, data: st.DataObject) -> None:
    wheel = data.draw(bad_wheel(workspace / "bad-verify"))
    flags = data.draw(st.sampled_from([["--no-import"], ["--no-import", "--json"], []]))
    refused(workspace, ["verify", *flags, str(wheel)])


# -- random command lines -------------------------------------------------------------------------
# Never generated: what leaves the process or the fuzz (help, version, tracebacks on purpose).
_FORBIDDEN = {"-h", "--help", "--version", "--debug"}
_tokens = _text.filter(lambda t: t not in _FORBIDDEN and not t.startswith(("-h", "--h", "--v",
                                                                          "--deb")))
_flag = st.from_regex(r"--no-such-[a-z]{1,8}", fullmatch=True)
# not a size: "" and "auto" ask for detection, so they are not bad values of --memory
_bad_memory = _tokens.filter(
    lambda t: t and t.strip().lower() != "auto" and not t.strip()[:1].isdigit())


@st.composite
def bad_command_line(draw: st.DrawFn) -> list[str]:
    kind = draw(st.sampled_from(["no-command", "unknown-option", "bad-value", "garbage-args"]))
    if kind == "no-command":  # an unknown subcommand (or none: just global flags)
        head = draw(_tokens.filter(lambda t: t not in COMMANDS))
        return draw(st.sampled_from([[head], [head, *draw(st.lists(_tokens, max_size=4))],
                                     ["-v"], []]))
    command = draw(st.sampled_from(sorted(COMMANDS)))
    if kind == "unknown-option":
        args = draw(st.lists(_tokens, max_size=3))
        return [command, *args, draw(_flag)]
    if kind == "bad-value":
        return draw(st.sampled_from([
            ["plan", draw(_tokens)],
            ["plan", "demo-ext-0.1.0-torch2.14.1-cu130-sm100-cp311", "--memory",
             draw(_bad_memory)],
            ["plan", "demo-ext-0.1.0-torch2.14.1-cu130-sm100-cp311", "--cpus", draw(_tokens)],
            ["plan", "demo-ext-0.1.0-torch2.14.1-cu130-sm100-cp311", "--cpus", "0"],
            ["plan", "demo-ext-0.1.0-torch2.14.1-cu130-sm100-cp311", "--memory",
             "9" * draw(st.integers(400, 5000)) + draw(st.sampled_from(["", "g", "k"]))],
            ["show", draw(_tokens)],
            ["show", draw(_tokens) + ".whl"],
            ["yank", draw(_tokens), "--reason", draw(_tokens)],
            ["yank", "demo_ext-0.1.0+cu130torch2.14-py3-none-any.whl"],  # no --reason
            ["build", draw(_tokens), "--dry-run"],
            ["build", "--dry-run"],  # neither cells nor --all
            ["build", "--all", "--dry-run", "--memory", draw(_bad_memory)],
            ["build", "--all", "--dry-run", "--cpus", draw(_tokens)],
            ["index", draw(_tokens.filter(lambda t: t not in ("rebuild", "verify")))],
            ["index", "verify", "--store", draw(st.sampled_from(["gs://x/y", "s3://", "ftp://x"]))],
            ["serve", "--port", draw(_tokens.filter(lambda t: not t.strip().isdigit()))],
            ["serve", "--port", "99999", "--store", "store"],
            ["retain", "--keep", draw(_tokens)],
            ["retain", "--keep", "-1", "--dry-run"],
            ["cache", draw(_tokens.filter(lambda t: t not in ("stats", "clear")))],
            ["request", draw(_tokens), "--torch", draw(_tokens), "--cuda", draw(_tokens),
             "--arch", draw(_tokens), "--python", draw(_tokens), "--print-cell"],
            ["request", "demo-ext==0.1.0", "--torch", "2.14.1", "--cuda", "13.0", "--arch",
             draw(_tokens.filter(lambda t: not t.strip()[:1].isdigit())), "--python", "3.11",
             "--print-cell"],
            ["matrix", "--matrix", draw(_tokens.filter(lambda t: t.strip() not in ("", ".")))
             + "-missing.toml"],
            ["publish"],
            ["verify"],
        ]))
    # garbage-args: a command given only random positional words it cannot take
    words = draw(st.lists(_tokens.filter(lambda t: not t.startswith("-") and t), min_size=1,
                          max_size=4))
    command = draw(st.sampled_from(["plan", "show", "index", "cache", "publish", "verify",
                                    "yank", "retain"]))
    if command in ("publish", "verify"):
        words = [w + "-no-such-file.whl" for w in words]
    return [command, *words]


@fuzz_settings(400)
@given(argv=bad_command_line())
def test_random_command_lines_fail_in_one_line(workspace: Path, argv: list[str]) -> None:
    refused(workspace, argv)


