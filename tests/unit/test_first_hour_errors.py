"""The mistakes a newcomer makes in the first hour: each is one line naming the thing (exit code
of its error class, no traceback), and read-only commands never create a store."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX, REPO
from http_fixtures import pages, serving

from factory.cli import main
from factory.errors import CellError, ConfigError, StoreError, UsageError

MATRIX = "version = 1\n" + FLASH_ATTN_MATRIX


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    rc = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.splitlines()


def _one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("ERROR ")]
    assert len(errors) == 1, lines
    assert all(line.startswith(("ERROR ", "TIP ")) for line in lines), lines
    return errors[0]


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["index", "verify"],
        ["index", "rebuild"],
        ["matrix", "--missing"],
        ["serve", "--port", "0"],
        ["retain", "--keep", "1"],
        ["yank", "x-1.0-py3-none-any.whl", "--reason", "r"],
    ],
)
def test_a_store_that_does_not_exist_is_named_and_not_made(
    command: list[str], matrix: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "no" / "such-store"
    extra = ["--matrix", str(matrix)] if command[0] == "matrix" else []
    rc, lines = _cli(capsys, *command, *extra, "--store", str(store))
    assert rc == StoreError.exit_code
    assert f"store {store} does not exist" in _one_error(lines)
    assert not store.exists() and not store.parent.exists()


def test_an_unknown_package_gets_a_did_you_mean(
    matrix: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines = _cli(capsys, "matrix", "--matrix", str(matrix), "--package", "flash_atn")
    assert rc == CellError.exit_code
    assert "package 'flash_atn' is not in the matrix (did you mean 'flash-attn'?)" in _one_error(
        lines
    )
    rc, lines = _cli(
        capsys, "build", "--all", "--dry-run", "--matrix", str(matrix), "--package", "nosuch"
    )
    assert rc == CellError.exit_code and "'nosuch' is not in the matrix" in _one_error(lines)


@pytest.fixture
def simple_index() -> Iterator[str]:
    """A PEP 503 page for flash-attn listing only 2.8.3.post2."""
    link = b'<a href="../../f/flash_attn-2.8.3.post2.tar.gz">flash_attn-2.8.3.post2.tar.gz</a>'
    with serving(pages({"/simple/flash-attn/": link})) as url:
        yield url + "simple/"


def test_a_version_that_does_not_exist_fails_the_dry_run(
    matrix: Path,
    simple_index: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", simple_index)
    # a cell outside the matrix is refused by build; a one-off request checks the sdist
    rc, lines = _cli(capsys, "build", "flash-attn-9.9.9-torch2.14.1-cu130-sm100-cp311",
                     "--dry-run", "--matrix", str(matrix))
    assert rc == CellError.exit_code and "is not a cell of the matrix" in _one_error(lines)
    rc, lines = _cli(capsys, "request", "flash-attn==9.9.9", "--torch", "2.14.1", "--cuda",
                     "13.0", "--arch", "10.0", "--python", "3.11", "--print-cell",
                     "--matrix", str(matrix))
    assert rc == CellError.exit_code
    line = _one_error(lines)
    assert (
        "flash-attn 9.9.9 has no sdist on" in line
        and "the matrix has flash-attn 2.8.3.post2" in line
    )


def test_a_local_source_is_built_only_as_its_matrix_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ext").mkdir()
    path = tmp_path / "matrix.toml"
    path.write_text(
        MATRIX.replace('recipe = "flash-attn"', 'recipe = "torch-extension"\nsource = "ext"')
        .replace("flash-attn", "my-ext")
        .replace("2.8.3.post2", "0.1.0")
    )
    rc, lines = _cli(capsys, "request", "my-ext==0.2.0", "--torch", "2.14.1", "--cuda", "13.0",
                     "--arch", "10.0", "--python", "3.11", "--print-cell", "--matrix", str(path))
    assert rc == CellError.exit_code and "my-ext 0.2.0 is not in the matrix" in _one_error(lines)


def test_every_matrix_problem_is_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(
        MATRIX.replace('python = ["3.11"]', 'python = ["3.11"]\n[settings]\nmemroy = "8g"')
        + '[packages.other]\nversions = ["1.0"]\nsource = "missing-dir"\n'
        + '[[exclude]]\npackage = "nosuch"\n'
    )
    rc, lines = _cli(capsys, "matrix", "--matrix", str(path))
    assert rc == ConfigError.exit_code
    errors = [line for line in lines if line.startswith("ERROR ")]
    assert len(errors) == 3, lines
    assert "unknown key 'memroy' in [settings] (did you mean 'memory'?)" in errors[0]
    assert f"looked for {tmp_path / 'missing-dir'}" in errors[1]
    assert "[[exclude]] #1 names unknown package 'nosuch'" in errors[2]


def test_an_s3_endpoint_that_is_down_is_named_with_a_tip(
    matrix: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("FACTORY_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    rc, lines = _cli(capsys, "matrix", "--missing", "--matrix", str(matrix), "--store", "s3://b/p")
    assert rc == StoreError.exit_code
    assert f"cannot reach the S3 endpoint {endpoint}" in _one_error(lines)
    assert any(line.startswith("TIP ") and "FACTORY_S3_ENDPOINT_URL" in line for line in lines)


def test_s3_clients_connect_with_a_short_timeout() -> None:
    from factory.store.s3 import CONNECT_TIMEOUT_S, s3_client

    assert (
        s3_client(endpoint="http://127.0.0.1:9").meta.config.connect_timeout
        == CONNECT_TIMEOUT_S
        <= 5
    )


def test_a_bad_image_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = _cli(capsys, "image", "base", "--name", "bad name!")
    assert rc == UsageError.exit_code and "'bad name!' is not a valid image name" in _one_error(
        lines
    )


def test_an_image_name_that_says_another_suite_or_python_is_refused_before_docker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory-base:<suite>-py<X.Y> name is what builds trust: `image base` makes it as it
    says or refuses it, in one line, without asking docker."""
    from factory.commands import image

    def no_docker(*_: object, **__: object) -> str:
        raise AssertionError("refused before docker")

    monkeypatch.setattr(image, "ensure_builder_image", no_docker)
    monkeypatch.setattr(image, "ensure_base_image", no_docker)
    rc, lines = _cli(capsys, "image", "base", "--name", "factory-base:bookworm-py3.13",
                     "--suite", "trixie")
    assert rc == UsageError.exit_code
    assert "factory-base:bookworm-py3.13 is a Debian bookworm image, but --suite says trixie" \
        in _one_error(lines)
    assert "TIP drop --suite, or name it factory-base:trixie-py3.13" in lines
    rc, lines = _cli(capsys, "image", "base", "--name", "factory-base:bookworm-py3.12")
    assert rc == UsageError.exit_code
    assert "can build CPython 3.11, 3.13 into an image, not 3.12" in _one_error(lines)


def test_image_base_makes_a_python_image_with_its_cpython(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`factory image base --name factory-base:bookworm-py3.13` once imported plain bookworm
    under that name (the factory's own tip for a missing builder image); it is now the builder
    image with CPython 3.13, and any other name stays a plain base of --suite."""
    from factory.commands import image

    made: list[tuple[str, ...]] = []
    monkeypatch.setattr(image, "ensure_builder_image",
                        lambda name, *, work_dir: made.append(("builder", name)) or name)
    monkeypatch.setattr(image, "ensure_base_image",
                        lambda name, *, suite, work_dir: made.append(("base", name, suite)) or name)
    work = ["--work-dir", str(tmp_path)]
    assert main(["image", "base", "--name", "factory-base:bookworm-py3.13", *work]) == 0
    assert main(["image", "base", "--name", "factory-base:trixie", *work]) == 0
    assert main(["image", "base", "--name", "mine:1", "--suite", "trixie", *work]) == 0
    assert main(["image", "base", "--name", "mine:2", *work]) == 0
    assert made == [("builder", "factory-base:bookworm-py3.13"), ("builder", "factory-base:trixie"),
                    ("base", "mine:1", "trixie"), ("base", "mine:2", "bookworm")]
    capsys.readouterr()


def test_the_shipped_matrix_still_loads() -> None:
    from factory.matrix.load import load_matrix

    assert load_matrix(REPO / "matrix.toml").cells


# -- toolchains: shown per cell, checked before any download ---------------------------------
CU128 = MATRIX.replace('torch = ["2.14.1"]', 'torch = ["2.10.0"]').replace(
    'cuda = ["13.0"]', 'cuda = ["12.8"]'
)


@pytest.fixture
def no_cuda_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from factory.build.readiness import ReadinessChecker

    monkeypatch.setattr(ReadinessChecker, "_image_here", lambda self, image: False)


def test_matrix_shows_a_missing_toolchain_and_the_command_that_makes_it(
    tmp_path: Path, no_cuda_image: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(CU128)
    assert main(["matrix", "--matrix", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "here      missing: image factory-cuda:12.8-py3.11 does not exist; "
        "make it: factory image cuda 12.8 --python 3.11 (offline: --from MIRROR-DIR)"
    ) in out
    assert "1 cell(s), 1 without a toolchain here" in out


def test_build_fails_fast_or_skips_a_cell_without_its_toolchain(
    tmp_path: Path, no_cuda_image: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from factory.errors import ToolchainError

    path = tmp_path / "matrix.toml"
    path.write_text(
        CU128.replace("[axes]", f'[settings]\nwheelhouse = "{tmp_path / "wh"}"\n[axes]')
    )
    cell = "flash-attn-2.8.3.post2-torch2.10.0-cu128-sm100-cp311"
    rc, lines = _cli(capsys, "build", cell, "--matrix", str(path))
    assert rc == ToolchainError.exit_code
    assert f"{cell}: no toolchain here (image factory-cuda:12.8-py3.11 does not exist)" in (
        _one_error(lines)
    )
    tip = "TIP make it: factory image cuda 12.8 --python 3.11"
    assert any(line.startswith(tip) for line in lines)
    rc, lines = _cli(capsys, "build", "--all", "--unbuildable", "fail", "--matrix", str(path))
    assert rc == ToolchainError.exit_code
    assert main(["build", "--all", "--matrix", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"skipped {cell}: no toolchain here" in captured.out + captured.err
    assert not (tmp_path / "wh").exists()  # nothing was downloaded
    assert main(["build", cell, "--dry-run", "--matrix", str(path)]) == 0
    assert (
        "toolchain    missing: image factory-cuda:12.8-py3.11 does not exist; make it: factory "
        "image cuda 12.8 --python 3.11"
    ) in capsys.readouterr().out


def _cu128(tmp_path: Path, pythons: str, settings: str = "") -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(
        CU128.replace('python = ["3.11"]', f"python = [{pythons}]").replace(
            "[axes]", f"{settings}\n[axes]"
        )
    )
    return path


def _ready(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, str]]:
    import json

    assert main(["matrix", "--json", "--matrix", str(path)]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    return {c["python"]: {**c["toolchain_ready"], "image": c["toolchain"]["image"]}
            for c in cells}


def test_the_cuda_image_command_names_the_cells_python_and_a_base_that_has_it(
    tmp_path: Path, no_cuda_image: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = _ready(_cu128(tmp_path, '"3.11", "3.12", "3.13"'), capsys)
    assert {py: r["image"] for py, r in ready.items()} == {
        py: f"factory-cuda:12.8-py{py}" for py in ("3.11", "3.12", "3.13")
    }
    assert ready["3.11"]["command"] == (
        "factory image cuda 12.8 --python 3.11 (offline: --from MIRROR-DIR)"
    )
    # factory-base:bookworm has 3.11 only: 3.13 gets the image the factory makes with it, 3.12
    # (no Debian release ships it) an image of the user's
    assert ready["3.13"]["command"] == (
        "factory image cuda 12.8 --python 3.13 --base factory-base:bookworm-py3.13"
    )
    assert ready["3.12"]["command"] == (
        "factory image cuda 12.8 --python 3.12 --base IMAGE (one with python3.12)"
    )
    assert "(factory-base:bookworm) has Python 3.11, not 3.12" in ready["3.12"]["detail"]
    ready = _ready(
        _cu128(tmp_path, '"3.12"', '[settings.images]\n"3.12" = "registry.example/py312:1"'),
        capsys,
    )
    assert ready["3.12"]["command"] == (
        "factory image cuda 12.8 --python 3.12 (offline: --from MIRROR-DIR)"
    )


def test_a_cell_whose_builder_image_lacks_its_python_is_shown_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CUDA 13 cells need no CUDA image, but their builds still run python3.X in the builder
    image for their Python: factory-base:bookworm has only 3.11."""
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX.replace('python = ["3.11"]', 'python = ["3.11", "3.12", "3.13"]'))
    ready = _ready(path, capsys)
    assert ready["3.11"]["state"] == "on first build"
    assert ready["3.13"]["state"] == "missing"
    assert ready["3.13"]["command"] == (
        'set [settings.images] "3.13" = "factory-base:bookworm-py3.13" (the first build makes it)'
    )
    assert ready["3.12"]["command"] == 'set [settings.images] "3.12" = an image with python3.12'
    assert "(factory-base:bookworm) has Python 3.11, not 3.12" in ready["3.12"]["detail"]
    path.write_text(path.read_text().replace(
        "[axes]", '[settings.images]\n"3.13" = "factory-base:bookworm-py3.13"\n[axes]'))
    assert _ready(path, capsys)["3.13"]["state"] == "on first build"


@pytest.fixture
def image_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """``factory image cuda`` in tmp_path with its docker and download steps recorded."""
    from factory.commands import image

    steps: list[tuple[str, ...]] = []

    def fetch(cuda: str, dest: Path, **kw: object) -> Path:
        steps.append(("fetch", cuda))
        return dest / f"cuda-{cuda}"

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(image, "ensure_builder_image", lambda b: steps.append(("base", b)))
    monkeypatch.setattr(image, "fetch_toolkit", fetch)
    monkeypatch.setattr(image, "make_cuda_image", lambda home, cuda, *, base, name: steps.append(
        ("image", base, name)))
    return steps


def test_image_cuda_without_python_makes_the_images_the_matrixs_cells_use(
    tmp_path: Path, image_steps: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    from factory.matrix.load import load_matrix

    path = _cu128(tmp_path, '"3.11", "3.13"',
                  '[settings.images]\n"3.13" = "factory-base:bookworm-py3.13"')
    assert main(["image", "cuda", "12.8", "--from", str(tmp_path / "mirror")]) == 0
    made = [s[2] for s in image_steps if s[0] == "image"]
    assert made == sorted(pc.toolchain.image for pc in load_matrix(path).cells)
    assert image_steps == [
        ("base", "factory-base:bookworm"),
        ("base", "factory-base:bookworm-py3.13"),
        ("fetch", "12.8"),  # one toolkit for both
        ("image", "factory-base:bookworm", "factory-cuda:12.8-py3.11"),
        ("image", "factory-base:bookworm-py3.13", "factory-cuda:12.8-py3.13"),
    ]
    assert "image factory-cuda:12.8-py3.13 ready (CUDA 12.8 on factory-base:bookworm-py3.13 " \
        "for Python 3.13" in capsys.readouterr().out


def test_image_cuda_refuses_a_base_without_the_python_before_any_download(
    tmp_path: Path, image_steps: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    from factory.errors import ToolchainError

    _cu128(tmp_path, '"3.12"')
    rc, lines = _cli(capsys, "image", "cuda", "12.8", "--from", str(tmp_path / "mirror"))
    assert rc == ToolchainError.exit_code
    assert "factory-base:bookworm has Python 3.11, not 3.12" in _one_error(lines)
    assert image_steps == []  # no base made, nothing fetched
    rc, lines = _cli(capsys, "image", "cuda", "12.6")  # no cell of the matrix uses 12.6
    assert rc == UsageError.exit_code
    assert "no cell of the matrix uses CUDA 12.6" in _one_error(lines)
    _cu128(tmp_path, '"3.11", "3.13"')
    rc, lines = _cli(capsys, "image", "cuda", "12.8", "--name", "mine:1")
    assert rc == UsageError.exit_code and "one per Python (3.11, 3.13)" in _one_error(lines)
    assert image_steps == []


def test_commands_are_echoed_in_full_only_with_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sys

    from factory.process import run_command

    argv = [sys.executable, "-c", "pass", "--platform", "manylinux_2_28_x86_64"]
    monkeypatch.delenv("FACTORY_VERBOSE", raising=False)
    run_command(argv, log_path=tmp_path / "log")
    shown = capsys.readouterr().err.strip()
    assert shown == f"+ {Path(sys.executable).name} ..."
    assert "manylinux_2_28_x86_64" in (tmp_path / "log").read_text()  # the log has it all
    monkeypatch.setenv("FACTORY_VERBOSE", "1")
    run_command(argv)
    assert "--platform manylinux_2_28_x86_64" in capsys.readouterr().err
