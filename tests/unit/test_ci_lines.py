"""What a build prints in CI: the step summary in Markdown (checked by a Markdown parser), the
schedule's summary, and the error annotation of a failed command on GitHub Actions."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE_CELL, write_example_matrix
from markdown_it import MarkdownIt

from factory import actions
from factory.cli import main
from factory.commands import build as build_command
from factory.errors import BuildError, EngineError
from factory.logger import Log, cell_lines, configure

REPO = Path(__file__).resolve().parents[2]


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table of a GitHub-flavoured Markdown text: rows of cell texts (the header first)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    found: list[list[list[str]]] = []
    row: list[str] | None = None
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            found.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close" and row is not None:
            found[-1].append(row)
        elif tok.type in ("th_open", "td_open") and row is not None:
            inline = tokens[i + 1]
            row.append("".join(c.content for c in (inline.children or [])).strip())
    return found


@dataclasses.dataclass
class Outcome:
    cell_id: str
    status: str
    wheel: Path | None
    attempts: tuple[dict[str, Any], ...]
    seconds: float
    detail: str = ""


def test_the_build_summary_is_a_markdown_table() -> None:
    outcomes = [Outcome("flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311", "built",
                        Path("dist/flash_attn-2.8.3.post2+cu130torch2.14sm100-cp311.whl"),
                        ({"cache_hits": 70, "cache_misses": 3},), 5432.0),
                Outcome("x-1-torch2.14.1-cu130-sm100-cp312", "skipped", None, (), 0.4,
                        "already published")]
    failures = [("y-1-torch2.14.1-cu130-sm100-cp311",
                 BuildError("build failed | exit 1\nsecond line"))]
    md = build_command.summary_markdown(outcomes, failures, published=True)
    assert md.startswith("### factory build: 2 done, 1 failed\n")
    (table,) = tables(md)
    assert table[0] == ["cell", "status", "time", "attempts", "cache hits/misses", "wheel"]
    assert table[1] == ["flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311", "published",
                        "1h30m", "1", "70/3",
                        "flash_attn-2.8.3.post2+cu130torch2.14sm100-cp311.whl"]
    assert table[2][1:] == ["skipped", "0s", "", "", "already published"]
    # a pipe and a newline in a message stay inside their cell
    assert table[3] == ["y-1-torch2.14.1-cu130-sm100-cp311", "failed", "", "", "",
                        "build failed | exit 1 second line"]


def test_factory_build_appends_its_summary_on_actions(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    summary.write_text("earlier step\n")

    def fake_build(matrix: Any, pc: Any, *_: Any) -> Outcome:
        return Outcome(pc.cell.id, "built", None, (), 12.0)

    monkeypatch.setattr("factory.commands.build.start_run", lambda matrix, opts: object())
    monkeypatch.setattr("factory.commands.build.build_cell", fake_build)
    code = main(["build", "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311",
                 "--matrix", str(REPO / "matrix.toml")])
    assert code == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n### factory build: 1 done, 0 failed")
    assert tables(text)[0][1][:3] == ["factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311",
                                      "built", "12s"]


def test_side_by_side_builds_append_whole_blocks(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    blocks = [actions.markdown_table(["n"], [[f"{i}-{j}"] for j in range(200)]) for i in range(4)]
    threads = [threading.Thread(target=actions.append_summary, args=(b, summary)) for b in blocks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = tables(summary.read_text())
    assert len(found) == 4 and all(len({r[0].split("-")[0] for r in t[1:]}) == 1 for t in found)


def test_the_schedule_summary_is_markdown(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Two cells on the repo's builders: the default matrix's schedule takes minutes on a
    # 2-core machine and test_workflows already runs it.
    matrix = write_example_matrix(tmp_path / "matrix.toml", work_dir=tmp_path / "work",
                                  archs=("9.0", "10.0"))
    assert main(["schedule", "--builders", str(REPO / ".github/builders.toml"),
                 "--matrix", str(matrix), "--markdown"]) == 0
    md = capsys.readouterr().out
    (table,) = tables(md)
    assert table[0][:4] == ["builder", "slot", "memory", "CPUs"]
    assert len(table) > 1 and all(row[2].endswith("GiB") for row in table[1:])
    assert "Predicted makespan" in md


def test_a_failed_command_is_annotated_on_actions(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert main(["plan", "no-such-cell", "--matrix", str(REPO / "matrix.toml")]) != 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ERROR ")
    assert err[-1].startswith("::error title=factory plan::")
    monkeypatch.delenv("GITHUB_ACTIONS")
    main(["plan", "no-such-cell", "--matrix", str(REPO / "matrix.toml")])
    assert "::error" not in capsys.readouterr().err


def test_workflow_command_escapes() -> None:
    assert actions.error_annotation("50% done\nnext", title="a:b,c") == (
        "::error title=a%3Ab%2Cc::50%25 done%0Anext")
    assert actions.group_start("x\ny") == "::group::x%0Ay"


def test_the_access_log_is_combined_log_format() -> None:
    """host ident user [date] "request" status bytes "referer" "user-agent"; what a client
    sends in a quoted field cannot end it."""
    import re

    from factory.index.server_http import access_line

    headers = {"User-Agent": 'uv/0.13.9 "x"\nforged', "Referer": None}
    line = access_line(client="10.0.0.7", method="GET", target="/simple/flash-attn/?token=s",
                       version="HTTP/1.1", status=200, size=1234,
                       headers=type("H", (dict,), {"get": dict.get})(headers),
                       user="uploader", now=1796159325.0)
    clf = re.compile(r'^(\S+) - (\S+) \[(\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000)\] '
                     r'"(\S+) (\S+) (\S+)" (\d{3}) (\d+|-) "((?:[^"\\]|\\.)*)" '
                     r'"((?:[^"\\]|\\.)*)"$')
    m = clf.match(line)
    assert m, line
    assert m.groups()[:9] == ("10.0.0.7", "uploader", "01/Dec/2026:21:08:45 +0000", "GET",
                              "/simple/flash-attn/", "HTTP/1.1", "200", "1234", "-")
    assert m.group(10) == 'uv/0.13.9 \\"x\\"\\x0aforged' and "\n" not in line
    assert "token" not in line


def test_a_single_failed_build_is_in_the_summary_too(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    def failing_build(*_: Any) -> Outcome:
        raise BuildError("build failed (exit 1)")

    monkeypatch.setattr("factory.commands.build.start_run", lambda matrix, opts: object())
    monkeypatch.setattr("factory.commands.build.build_cell", failing_build)
    assert main(["build", "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311",
                 "--matrix", str(REPO / "matrix.toml")]) == BuildError.exit_code
    (table,) = tables(summary.read_text())
    assert table[1][:2] == ["factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311", "failed"]


EXT = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
EXT_SHORT = "factory-example-ext@cu130-torch2.14-sm100-cp311"
CONV = "causal-conv1d-1.7.0-torch2.14.1-cu130-sm100-cp311"
CONV_SHORT = "causal-conv1d@cu130-torch2.14-sm100-cp311"


def _builds(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> None:
    """build_cell as the pipeline runs it: each cell inside its cell_lines; those in
    ``failing`` raise. The runner's start is a stand-in."""
    def build(matrix: Any, pc: Any, opts: Any, log: Any, run: object) -> Outcome:
        with cell_lines(matrix.short_id(pc.cell), pc.cell.id):
            Log().step(f"cell {pc.cell.id}")
            if pc.cell.id in failing:
                raise BuildError("build failed (exit 1)", tip="the log: build.log")
        return Outcome(pc.cell.id, "built", None, (), 12.0)

    monkeypatch.setattr("factory.commands.build.start_run", lambda matrix, opts: object())
    monkeypatch.setattr("factory.commands.build.build_cell", build)


def test_the_lines_of_a_failed_build_end_naming_its_cell(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Builds side by side in one CI job: the final ERROR and TIP lines name the cell too."""
    _builds(monkeypatch, {EXT})
    assert main(["build", EXT, "--matrix", str(REPO / "matrix.toml")]) == BuildError.exit_code
    err = capsys.readouterr().err.splitlines()
    assert err[-2:] == [f"[{EXT_SHORT}] ERROR build failed (exit 1)",
                        f"[{EXT_SHORT}] TIP the log: build.log"]
    assert all(line.startswith(f"[{EXT_SHORT}] ") for line in err if line.strip())


def test_failed_and_summary_lines_name_their_cells(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _builds(monkeypatch, {CONV})
    assert main(["build", CONV, EXT, "--matrix", str(REPO / "matrix.toml")]) == 7
    err = capsys.readouterr().err.splitlines()
    failed = next(line for line in err if "FAILED" in line)
    assert failed.startswith(f"[{CONV_SHORT}] [") and f"FAILED {CONV}: build failed" in failed
    summary = err[next(i for i, line in enumerate(err) if line.endswith("] summary")):]
    assert not summary[0].startswith("[factory") and not summary[0].startswith("[causal")
    assert summary[1].startswith(f"[{EXT_SHORT}] ") and "built" in summary[1]
    assert summary[2].startswith(f"[{CONV_SHORT}] ") and "failed" in summary[2]
    assert len(summary) == 3


def test_a_one_cell_summary_names_the_cell_and_group_names_stay_bare(
        capsys: pytest.CaptureFixture[str]) -> None:
    configure()
    build_command.summarize(Log(), [Outcome(EXT, "built", None, (), 1.0)], [],
                            published_to=None)
    build_command.summarize(Log(), [], [("flash-attn-sm90 group", BuildError("x"))],
                            published_to=None)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"[{EXT_SHORT}] [") and err[0].endswith("] summary")
    assert err[1].startswith(f"[{EXT_SHORT}] ")
    assert err[2].endswith("] summary") and err[3].strip().startswith("failed    flash-attn-sm90")


def _two_cells(tmp_path: Path) -> tuple[Path, list[str]]:
    matrix = write_example_matrix(tmp_path / "m.toml", work_dir=tmp_path, archs=("9.0", "10.0"))
    return matrix, [EXAMPLE_CELL.replace("sm100", "sm90"), EXAMPLE_CELL]


def test_a_batch_starts_its_runner_once_and_a_failed_cell_stops_no_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    matrix, (sm90, sm100) = _two_cells(tmp_path)
    run, started, built = object(), [], []

    def start(matrix: Any, opts: Any) -> object:
        started.append(opts.runner)
        return run

    def build(matrix: Any, pc: Any, opts: Any, log: Any, given: object) -> Outcome:
        assert given is run  # the batch's runner and stores, not one per cell
        built.append(pc.cell.id)
        if pc.cell.id == sm90:
            raise BuildError("build failed (exit 1)")
        return Outcome(pc.cell.id, "built", None, (), 12.0)

    monkeypatch.setattr("factory.commands.build.start_run", start)
    monkeypatch.setattr("factory.commands.build.build_cell", build)
    assert main(["build", "--all", "--matrix", str(matrix)]) == BuildError.exit_code
    assert started == ["docker"] and sorted(built) == sorted([sm90, sm100])
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"FAILED {sm90}: build failed (exit 1)" in text
    assert f"built     {sm100} (12s)" in text and f"failed    {sm90}: build failed" in text


def test_a_runner_that_cannot_start_fails_every_cell(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    matrix, cells = _two_cells(tmp_path)

    def start(matrix: Any, opts: Any) -> object:
        raise EngineError("cannot connect to the docker engine")

    monkeypatch.setattr("factory.commands.build.start_run", start)
    monkeypatch.setattr("factory.commands.build.build_cell",
                        lambda *a: pytest.fail("built without a runner"))
    assert main(["build", "--all", "--matrix", str(matrix)]) == EngineError.exit_code
    text = "".join(capsys.readouterr())
    for cell in cells:
        assert f"FAILED {cell}: cannot connect to the docker engine" in text
        assert f"failed    {cell}: cannot connect to the docker engine" in text
