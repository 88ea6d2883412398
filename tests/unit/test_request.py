"""`factory matrix --missing` and `factory request`: a store with some cells published lists
exactly the rest; a published cell is answered from the store with no build; a missing one is
built (the build function is faked here, except in the docker end-to-end test) and published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ops_builds import REPO, factory_cli, planned, publish_build, write_matrix

from factory import cli
from factory.matrix.load import PlannedCell

SPEC = "flash-attn==2.8.3.post2"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, list[PlannedCell]]:
    matrix = write_matrix(tmp_path)
    cells = planned(matrix)
    store = tmp_path / "store"
    for i in (0, 3, 5, 10):
        publish_build(store, tmp_path / f"dist{i}", cells[i])
    return matrix, store, cells


def _args(pc: PlannedCell) -> list[str]:
    c = pc.cell
    return [f"{c.package}=={c.version}", "--torch", c.torch, "--cuda", c.cuda,
            "--arch", ",".join(f"{a // 10}.{a % 10}" for a in c.archs), "--python", c.python]


def test_missing_lists_exactly_the_rest(setup: tuple[Path, Path, list[PlannedCell]]) -> None:
    matrix, store, cells = setup
    assert len(cells) == 12
    r = factory_cli("matrix", "--matrix", str(matrix), "--missing", "--json", "--store", str(store))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    want = [pc.cell.id for i, pc in enumerate(cells) if i not in (0, 3, 5, 10)]
    assert [c["id"] for c in doc["cells"]] == want
    assert doc["include"] == [{"cell": cid} for cid in want]


def test_published_cell_prints_the_install_line_without_building(
    setup: tuple[Path, Path, list[PlannedCell]]
) -> None:
    matrix, store, cells = setup
    pc = cells[3]
    r = factory_cli("request", *_args(pc), "--matrix", str(matrix), "--store", str(store),
                    "--index-url", "http://index.example:8080/")
    assert r.returncode == 0, r.stderr
    version = pc.wheel.split("-")[1]
    why, line = r.stdout.splitlines()  # plain http by name: pip must be told to trust it
    assert why.startswith("# plain http to index.example:8080: pip uses an http index only on ")
    assert line == ("python3 -m pip install --trusted-host index.example:8080 --extra-index-url "
                    f"http://index.example:8080/{pc.variant}/simple/ flash-attn=={version}")
    assert "already published, nothing to build" in r.stderr
    # Without --index-url a local store names itself, as a file:// URL pip can read.
    r = factory_cli("request", *_args(pc), "--matrix", str(matrix), "--store", str(store), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["built"] is False and doc["content_key"] == pc.content_key
    assert doc["install"].startswith(
        f"python3 -m pip install --extra-index-url {store.resolve().as_uri()}/")


def test_an_https_index_of_a_private_ca_gets_its_cert_on_the_line(
    setup: tuple[Path, Path, list[PlannedCell]]
) -> None:
    """--cert FILE (a path on the hosts, as the doctor's): pip is told the CA, and why."""
    matrix, store, cells = setup
    pc = cells[3]
    ca = "/etc/ssl/certs/team-ca.pem"
    for check in ([], ["--check"]):
        r = factory_cli("request", *_args(pc), "--matrix", str(matrix), "--store", str(store),
                        "--index-url", "https://index.example/", "--cert", ca, *check)
        assert r.returncode == 0, r.stderr
        why, line = r.stdout.splitlines()
        assert why.startswith("# a private CA signed the index's certificate: pip checks it")
        assert line == (f"python3 -m pip install --cert {ca} --extra-index-url "
                        f"https://index.example/{pc.variant}/simple/ "
                        f"flash-attn=={pc.wheel.split('-')[1]}")
    # over plain http there is no certificate to check: the line is the one without --cert
    r = factory_cli("request", *_args(pc), "--matrix", str(matrix), "--store", str(store),
                    "--index-url", "http://127.0.0.1:8080/", "--cert", ca)
    assert r.returncode == 0 and "--cert" not in r.stdout, r.stdout + r.stderr


def test_rerun_of_a_published_cell_never_calls_the_build(
    setup: tuple[Path, Path, list[PlannedCell]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix, store, cells = setup
    import factory.hosts.request

    def must_not_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("build_cells was called for a published cell")

    monkeypatch.setattr(factory.hosts.request, "build_cells", must_not_build)
    for pc in (cells[0], cells[10]):
        code = cli.main(["request", *_args(pc), "--matrix", str(matrix), "--store", str(store)])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert out.out.strip().endswith(pc.wheel.split("-")[1])


def test_missing_cell_is_built_with_publish_then_answered(
    setup: tuple[Path, Path, list[PlannedCell]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    matrix, store, cells = setup
    import factory.hosts.request

    calls: list[tuple[list[str], Any]] = []

    def fake_build_cells(planned_cells: list[PlannedCell], *, matrix: Any, opts: Any, log: Any = None) -> list[Any]:
        calls.append(([p.cell.id for p in planned_cells], opts))
        for p in planned_cells:
            publish_build(opts.store, tmp_path / "built", p)
        return []

    monkeypatch.setattr(factory.hosts.request, "build_cells", fake_build_cells)
    pc = cells[1]
    args = ["request", *_args(pc), "--matrix", str(matrix), "--store", str(store),
            "--index-url", "http://i", "--yes"]
    assert cli.main(args) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == (f"python3 -m pip install --trusted-host i --extra-index-url "
                                        f"http://i/{pc.variant}/simple/ "
                                        f"flash-attn=={pc.wheel.split('-')[1]}")
    assert "built and published" in out.err
    ((ids, opts),) = calls
    assert ids == [pc.cell.id] and opts.publish is True and opts.store == str(store)
    # The second time it is in the store: no second build.
    assert cli.main(args) == 0
    assert len(calls) == 1


def test_cuda12_cell_fails_in_one_line_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import factory.hosts.request

    monkeypatch.setattr(factory.hosts.request, "build_cells", lambda *a, **k: pytest.fail("build called"))
    args = ["request", SPEC, "--torch", "2.10.0", "--cuda", "12.8", "--arch", "10.0", "--python", "3.12",
            "--matrix", str(REPO / "matrix.toml"), "--store", str(tmp_path / "store")]
    r = factory_cli(*args)
    assert r.returncode == 5, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-2].startswith("ERROR flash-attn-2.8.3.post2-torch2.10.0-cu128-sm100-cp312 needs the CUDA 12.8 "
                                "builder image")
    assert lines[-1].startswith("TIP ") and "Traceback" not in r.stderr
    assert cli.main(args[:-2] + ["--store", str(tmp_path / "store"), "--runner", "local"]) == 5
    assert "the local runner cannot use a builder image" in capsys.readouterr().err


def test_bad_requests_are_usage_errors(tmp_path: Path) -> None:
    base = ["--torch", "2.14.1", "--cuda", "13.0", "--arch", "10.0", "--python", "3.11",
            "--store", str(tmp_path)]
    r = factory_cli("request", "flash-attn>=2.8", *base)
    assert r.returncode == 2 and "must pin exactly one version" in r.stderr
    r = factory_cli("request", "flash-attn==2.8.3.post2", *base[:-2], "--store", "s3://bucket/prefix")
    assert r.returncode == 2 and "--index-url" in r.stderr
    r = factory_cli("request", "flash-attn==2.8.3.post2", *base[:4], "--arch", "12.0", "--cuda", "12.6",
                    "--python", "3.11", "--store", str(tmp_path))
    assert r.returncode == 4 and "Traceback" not in r.stderr  # the cell's fault, not the matrix's
    assert r.stderr.strip().splitlines()[-2].startswith("ERROR sm_120 needs CUDA >= 12.8")


def test_yanked_only_build_is_reported(setup: tuple[Path, Path, list[PlannedCell]]) -> None:
    matrix, store, cells = setup
    from factory.index.publish import yank
    from factory.store import open_store

    yank(open_store(str(store)), cells[5].wheel, "bad kernels")
    r = factory_cli("request", *_args(cells[5]), "--matrix", str(matrix), "--store", str(store))
    assert r.returncode == 11 and "is yanked: bad kernels" in r.stderr


def test_print_cell_for_the_request_workflow() -> None:
    r = factory_cli("request", SPEC, "--torch", "2.10.0", "--cuda", "12.8", "--arch", "10.0",
                    "--python", "3.12", "--print-cell", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cell"] == "flash-attn-2.8.3.post2-torch2.10.0-cu128-sm100-cp312"
    assert doc["runner"] == "mem-256g" and doc["variant"] == "cu128-torch2.10-sm100"




def test_request_asks_before_it_builds_and_can_only_look(
    setup: tuple[Path, Path, list[PlannedCell]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No wheel yet: without a terminal and without --yes, one line and no build; on a terminal
    a 'no' builds nothing, a 'yes' builds; --check never builds and says so by its exit code."""
    import io

    import factory.hosts.request

    matrix, store, cells = setup
    built: list[str] = []

    def fake_build_cells(planned_cells: Any, *, matrix: Any, opts: Any,
                         log: Any = None) -> list[Any]:
        built.extend(p.cell.id for p in planned_cells)
        for p in planned_cells:
            publish_build(opts.store, tmp_path / "built", p)
        return []

    monkeypatch.setattr(factory.hosts.request, "build_cells", fake_build_cells)
    pc = cells[1]
    args = ["request", *_args(pc), "--matrix", str(matrix), "--store", str(store)]
    assert cli.main([*args, "--check"]) == 1
    assert "not published" in capsys.readouterr().err and built == []
    assert cli.main(args) == 2  # stdin is no terminal here
    err = capsys.readouterr().err
    assert f"ERROR {pc.cell.id} is not published in {store}" in err and "--yes" in err
    assert built == []

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    assert cli.main(args) == 1
    assert "Build and publish it now" in capsys.readouterr().err and built == []
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    assert cli.main(args) == 0 and built == [pc.cell.id]
    assert capsys.readouterr().out.startswith("python3 -m pip install ")
    assert cli.main([*args, "--check"]) == 0  # now it is there: its line, still no build
    assert capsys.readouterr().out.startswith("python3 -m pip install ") and built == [pc.cell.id]


def test_a_gpu_name_is_its_arch() -> None:
    from factory.hosts.request import request_cell

    cell = request_cell(SPEC, torch="2.14.1", cuda="13.0", archs=["B200", "rtx pro 6000"],
                        python="3.11")
    assert cell.archs == (100, 120)
