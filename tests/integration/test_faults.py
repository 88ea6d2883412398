"""Faults while publishing, and two builders on one cell.

* A full disk under a local store (a small tmpfs; needs root): whatever stage the space runs out
  in, what was published stays byte for byte, nothing half-written is left, the index never
  loses a committed wheel, and once there is room ``factory index rebuild`` completes the rest.
* S3 errors (an S3 API server on loopback with a fault-injecting layer in front): a request
  kind that keeps failing, a transient failure, the server stopped between uploads. Nothing
  published is lost; the next publish or ``factory index rebuild`` completes the wheel.
* Two builders on one cell: the per-cell lock makes the second wait, and a waiter that finds
  the cell published by the first skips it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from index_fixtures import S3_ENV, _SerialWrites
from index_wheels import variant_wheel

from factory.cli import main
from factory.errors import StoreError
from factory.index import rebuild_index, verify_index
from factory.index.publish import publish
from factory.store import LocalStore, Store
from factory.store.s3 import S3Store

REPO = Path(__file__).resolve().parents[2]


def _committed(store: Store) -> dict[str, str]:
    """filename -> sha256 of every committed wheel."""
    return {e.filename: e.sha256 for e in store.wheels()}


def _problems_only_about(store: Store, filenames: set[str]) -> list[str]:
    """The index problems that name none of ``filenames`` (wheels, or their new variant)."""
    return [p for p in verify_index(store).problems if not any(f in p for f in filenames)]


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


# -- a full disk ----------------------------------------------------------------------------------
@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs; unmounted afterwards (the test fails if it cannot be)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill_to(disk: Path, free: int) -> None:
    """Grow or shrink a hidden filler file (the store lists no dot-files) until ``free`` bytes
    (rounded to pages) are left."""
    filler = disk / ".filler"
    size = filler.stat().st_size if filler.exists() else 0
    target = max(0, size + _free(disk) - free)
    with open(filler, "ab") as f:
        f.truncate(0)
        remaining = target
        chunk = b"\0" * 65536
        while remaining > 0:
            try:
                remaining -= f.write(chunk[: min(len(chunk), remaining)])
                f.flush()
            except OSError:
                break


def test_a_full_disk_mid_publish_loses_nothing(tiny_disk: Path, tmp_path: Path) -> None:
    store = LocalStore(tiny_disk / "store")
    publish(store, [variant_wheel(tmp_path / "w", "fa-demo", f"1.{i}", "2.14") for i in range(3)])
    published = _committed(store)
    page = 4096
    outcomes: dict[str, str] = {}
    # Leave room for the wheel and then 0..12 more pages: the space runs out while writing the
    # wheel, its .metadata, its entry, or one of the index pages, or not at all.
    for extra_pages in range(-2, 13):
        wheel = variant_wheel(tmp_path / "big", "fa-demo", f"2.{extra_pages + 2}", "2.14",
                              payload_bytes=30_000)
        before = {k: store.read(f"files/fa-demo/{k}") for k in published}
        _fill_to(tiny_disk, wheel.stat().st_size + extra_pages * page)
        try:
            publish(store, [wheel])
        except StoreError as exc:
            assert "No space left on device" in exc.message and "\n" not in exc.message
            outcomes[wheel.name] = "failed"
        else:
            outcomes[wheel.name] = "published"
            published[wheel.name] = _committed(store)[wheel.name]
        # What was published before is untouched, on the pages, and nothing half-written stays.
        assert {k: store.read(f"files/fa-demo/{k}") for k in before} == before
        failed = {n for n, o in outcomes.items() if o == "failed"}
        assert _problems_only_about(store, failed) == []
        assert not [p for p in (tiny_disk / "store").rglob(".tmp-*")]
    assert "failed" in outcomes.values() and "published" in outcomes.values(), outcomes
    # Through the command line, a full disk is one line with the store's exit code.
    wheel = variant_wheel(tmp_path / "big", "fa-demo", "3.0", "2.14", payload_bytes=30_000)
    _fill_to(tiny_disk, 0)
    code, err = _cli(["publish", "--store", str(tiny_disk / "store"), str(wheel)])
    assert code == StoreError.exit_code and err.startswith("ERROR ") and len(err.splitlines()) == 1
    outcomes[wheel.name] = "failed"
    # Room again: the rebuild completes every wheel whose upload got through; none is lost.
    (tiny_disk / ".filler").unlink()
    assert _cli(["index", "rebuild", "--store", str(tiny_disk / "store")])[0] == 0
    verdict = verify_index(store)
    assert verdict.ok and verdict.pending == (), verdict.problems
    after = _committed(store)
    assert {k: after.get(k) for k in published} == published  # 0 lost
    for name, outcome in outcomes.items():
        if outcome == "failed" and name not in after:  # the wheel never made it: publish again
            assert publish(store, [tmp_path / "big" / name]).published == (name,)
    assert verify_index(store).ok and len(_committed(store)) == 3 + len(outcomes)


# -- S3 errors ------------------------------------------------------------------------------------
_S3_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>InternalError</Code><Message>injected by the test</Message></Error>"
)
Rule = Callable[[str, str, str], bool]  # (method, path, query) -> fail this request?


class _Faults:
    """In front of the S3 API server: answers the requests a rule selects with an S3 500."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.rule: Rule | None = None
        self.budget: int | None = None  # fail only this many, then pass (a transient fault)
        self.injected = 0
        self.lock = threading.Lock()

    def fail(self, rule: Rule | None, budget: int | None = None) -> None:
        with self.lock:
            self.rule, self.budget, self.injected = rule, budget, 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with self.lock:
            hit = self.rule is not None and self.rule(
                environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                environ.get("QUERY_STRING", ""),
            ) and (self.budget is None or self.injected < self.budget)
            if hit:
                self.injected += 1
        if hit:
            start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
            return [_S3_ERROR]
        return self.app(environ, start_response)


class FaultyS3:
    """An S3 API server (moto) on a fixed loopback port that can be stopped and started."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.faults = _Faults(_SerialWrites(DomainDispatcherApplication(create_backend_app)))
        self.port = 0
        self.server: Any = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        from werkzeug.serving import make_server

        self.server = make_server("127.0.0.1", self.port, self.faults, threaded=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            assert self.thread is not None
            self.thread.join()
            self.server = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, attempts: int = 2) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
            config=Config(retries={"max_attempts": attempts, "mode": "standard"},
                          connect_timeout=2, read_timeout=20),
        )


@pytest.fixture(scope="module")
def faulty_s3() -> Iterator[FaultyS3]:
    s3 = FaultyS3()
    s3.start()
    try:
        yield s3
    finally:
        s3.faults.fail(None)
        s3.stop()


@pytest.fixture
def s3_store(faulty_s3: FaultyS3) -> Iterator[S3Store]:
    faulty_s3.faults.fail(None)
    if faulty_s3.server is None:
        faulty_s3.start()
    client = faulty_s3.client()
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield S3Store(bucket, "pkgs", client=client)
    faulty_s3.faults.fail(None)
    if faulty_s3.server is None:
        faulty_s3.start()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)


def _put(suffix: str) -> Rule:
    return lambda method, path, query: method == "PUT" and path.endswith(suffix)


FAULTS: dict[str, Rule] = {
    "wheel upload": _put(".whl"),
    "metadata upload": _put(".whl.metadata"),
    "commit (entry)": _put(".entry.json"),
    "project pages": lambda m, p, q: m == "PUT" and "/simple/fa-demo/" in p,
    "root pages": lambda m, p, q: m == "PUT" and p.endswith(("/simple/index.html",
                                                              "/simple/index.json")),
    "listings": lambda m, p, q: m == "GET" and "list-type=2" in q,
    "every request": lambda m, p, q: True,
}


@pytest.mark.integration
@pytest.mark.parametrize("completion", ["publish", "rebuild"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_s3_error_mid_publish_loses_nothing(
    fault: str, completion: str, faulty_s3: FaultyS3, s3_store: S3Store, tmp_path: Path
) -> None:
    earlier = [variant_wheel(tmp_path / "w", "fa-demo", f"1.{i}", "2.14") for i in range(3)]
    publish(s3_store, earlier)
    published = _committed(s3_store)
    data = {w.name: s3_store.read(f"files/fa-demo/{w.name}") for w in earlier}
    new = variant_wheel(tmp_path / "new", "fa-demo", "2.0", "2.13")  # a new variant: more pages
    faulty_s3.faults.fail(FAULTS[fault])
    with pytest.raises(StoreError) as info:
        publish(s3_store, [new])
    assert faulty_s3.faults.injected >= 1 and "\n" not in info.value.message
    faulty_s3.faults.fail(None)
    # Nothing published is lost or changed; the index is wrong at most about the new wheel.
    assert {n: s3_store.read(f"files/fa-demo/{n}") for n in data} == data
    assert {k: v for k, v in _committed(s3_store).items() if k != new.name} == published
    assert _problems_only_about(s3_store, {new.name, "cu130-torch2.13"}) == []
    # The next publish, or an index rebuild, completes it.
    if completion == "publish":
        publish(s3_store, [new])
    else:
        rebuild_index(s3_store)
        if new.name not in _committed(s3_store):  # the upload itself never got through
            publish(s3_store, [new])
    verdict = verify_index(s3_store)
    assert verdict.ok and verdict.pending == (), verdict.problems
    assert _committed(s3_store) == {**published, new.name: _committed(s3_store)[new.name]}


@pytest.mark.integration
def test_a_transient_s3_error_is_retried(faulty_s3: FaultyS3, s3_store: S3Store,
                                         tmp_path: Path) -> None:
    wheel = variant_wheel(tmp_path, "fa-demo", "1.0", "2.14")
    faulty_s3.faults.fail(_put(".whl"), budget=1)  # one 500, then the upload goes through
    assert publish(s3_store, [wheel]).published == (wheel.name,)
    assert faulty_s3.faults.injected == 1
    assert verify_index(s3_store).ok


@pytest.mark.integration
def test_the_s3_server_stopped_between_uploads(faulty_s3: FaultyS3, s3_store: S3Store,
                                               tmp_path: Path) -> None:
    first = variant_wheel(tmp_path, "fa-demo", "1.0", "2.14")
    publish(s3_store, [first])
    second = variant_wheel(tmp_path, "fa-demo", "1.1", "2.14")
    faulty_s3.stop()
    try:
        with pytest.raises(StoreError, match="failed"):
            publish(s3_store, [second])
    finally:
        faulty_s3.start()  # the same port: the client finds it again
    assert _committed(s3_store) == {first.name: _committed(s3_store)[first.name]}
    assert verify_index(s3_store).ok
    assert publish(s3_store, [second]).published == (second.name,)
    assert verify_index(s3_store).ok and set(_committed(s3_store)) == {first.name, second.name}


# -- two builders on one cell ---------------------------------------------------------------------
_LOCKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from factory.build.pipeline import _cell_lock
    from factory.logger import Log, configure
    configure()  # a program: it installs the handler, as the CLI does
    work, me, events = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    with _cell_lock(work, Log()):
        with open(events, "a") as f:
            f.write(me + " holds\\n")
        if me == "first":
            while not (work / "release").exists():
                time.sleep(0.05)
        with open(events, "a") as f:
            f.write(me + " done\\n")
""")


def test_two_builders_on_one_cell_take_turns(tmp_path: Path) -> None:
    """Two processes on the same cell's work dir: the second waits until the first is done."""
    work = tmp_path / "work"
    work.mkdir()
    events = tmp_path / "events"
    script = tmp_path / "locker.py"
    script.write_text(_LOCKER.format(repo=str(REPO)))
    cmd = [sys.executable, str(script), str(work)]
    first = subprocess.Popen([*cmd, "first", str(events)], stderr=subprocess.PIPE, text=True)
    second = None
    try:
        for _ in range(600):
            if events.exists() and "first holds" in events.read_text():
                break
            assert first.poll() is None
            time.sleep(0.05)
        second = subprocess.Popen([*cmd, "second", str(events)], stderr=subprocess.PIPE,
                                  text=True)
        assert second.stderr is not None
        line = second.stderr.readline()  # blocks until the second builder says it waits
        assert "another builder holds this cell; waiting for it" in line
        assert second.poll() is None and "second" not in events.read_text()
        (work / "release").touch()
        assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
        assert events.read_text().splitlines() == [
            "first holds", "first done", "second holds", "second done"
        ]
    finally:
        for proc in (first, second):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                if proc.stderr:
                    proc.stderr.close()


def _demo_matrix(tmp_path: Path) -> Any:
    """A one-cell matrix of a package no recipe knows (the build itself is stubbed)."""
    from factory.matrix.load import load_matrix

    (tmp_path / "matrix.toml").write_text(textwrap.dedent("""
        [settings]
        work-dir = "work"
        [axes]
        torch = ["2.14.1"]
        cuda = ["13.0"]
        archs = [["10.0"]]
        python = ["3.11"]
        [packages.demo-ext]
        versions = ["0.1.0"]
    """))
    return load_matrix(tmp_path / "matrix.toml")


def test_the_waiting_builder_skips_a_cell_the_first_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_cell in two threads with the build itself stubbed: one builds, the other waits on
    the cell lock, then finds the content key published and skips."""
    import factory.build.pipeline as build
    from factory.build.pipeline import BuildOptions, BuildOutcome, build_cell
    from factory.logger import Log

    matrix = _demo_matrix(tmp_path)
    pc = matrix.cells[0]
    published = threading.Event()
    entered = threading.Event()
    release = threading.Event()
    builds: list[str] = []

    def fake_build(matrix: Any, pc: Any, opts: Any, log: Any, **kw: Any) -> BuildOutcome:
        builds.append(threading.current_thread().name)
        entered.set()
        assert release.wait(timeout=120)
        published.set()  # what publish does for the next builder to see
        return BuildOutcome(cell_id=pc.cell.id, status="built")

    monkeypatch.setattr(build, "_build_locked", fake_build)
    monkeypatch.setattr(build, "_already_published", lambda pc, opts: published.is_set())
    opts = BuildOptions(store=str(tmp_path / "store"), publish=True)
    outcomes: dict[str, BuildOutcome] = {}
    logs = {"one": io.StringIO(), "two": io.StringIO()}

    def builder(name: str) -> None:
        outcomes[name] = build_cell(matrix, pc, opts, Log(stream=logs[name]))

    one = threading.Thread(target=builder, args=("one",), name="one")
    one.start()
    assert entered.wait(timeout=120)
    two = threading.Thread(target=builder, args=("two",), name="two")
    two.start()
    for _ in range(1200):  # until the second says it waits on the lock
        if "waiting for it" in logs["two"].getvalue():
            break
        time.sleep(0.05)
    assert "another builder holds this cell; waiting for it" in logs["two"].getvalue()
    assert "two" not in outcomes
    release.set()
    one.join(timeout=120)
    two.join(timeout=120)
    assert builds == ["one"]
    assert outcomes["one"].status == "built"
    assert outcomes["two"].status == "skipped" and outcomes["two"].detail == "already published"


def test_a_malformed_history_record_in_the_store_does_not_stop_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records of other builders are untrusted input: one that is not a record (here `[]`
    and a cell with no archs) is skipped with a line naming it, and the build goes on."""
    import factory.build.pipeline as build
    from factory.build.pipeline import BuildOptions, BuildOutcome, build_cell
    from factory.logger import Log

    matrix = _demo_matrix(tmp_path)
    pc = matrix.cells[0]
    store = LocalStore(tmp_path / "store")
    store.put_new("history/records/a.json", b"[]")
    no_archs = (b'{"version": 1, "cell": {"package": "demo-ext", "version": "0.1.0", '
                b'"torch": "2.14.1", "cuda": "13.0", "archs": [], "python": "3.11"}, '
                b'"nvcc_threads": 1, "max_jobs": 1}')
    store.put_new("history/records/b.json", no_archs)

    def fake_build(matrix: Any, pc: Any, opts: Any, log: Any, **kw: Any) -> BuildOutcome:
        assert kw["lease"], "the build runs holding the cell's lease"
        return BuildOutcome(cell_id=pc.cell.id, status="built")

    monkeypatch.setattr(build, "_build_locked", fake_build)
    out = io.StringIO()
    outcome = build_cell(matrix, pc, BuildOptions(store=str(store.root), publish=True),
                         Log(stream=out))
    assert outcome.status == "built"
    lines = out.getvalue()
    assert "skipped history/records/a.json: corrupt history record" in lines
    assert "skipped history/records/b.json: corrupt history record" in lines
