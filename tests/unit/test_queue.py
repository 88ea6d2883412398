"""The work queue's protocol with stand-in builds (a fake wheel published per cell): workers
with different caps share one directory store, each group is claimed by one of them, nothing
is built twice, a stale lease of a dead worker is taken over once it expires, and a worker
that nothing fits stops at once. The real builds are in tests/integration/test_work_queue.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ops_builds
import pytest
from ops_builds import publish_build, write_matrix

from factory.build.job import BuildOptions
from factory.build.lease import CellLease
from factory.build.pipeline import BuildOutcome
from factory.cli import main
from factory.engines import queue
from factory.logger import Log
from factory.matrix.load import load_matrix
from factory.planning.budget import BudgetRequest
from factory.planning.memory_model import MemoryHistory, shipped_history_path
from factory.planning.work import plan_work
from factory.store import open_store
from factory.units import GIB

# the operations tests' matrix, built with the local runner (what a queue worker runs)
MATRIX = ops_builds.MATRIX.replace('store = "store"\n', 'store = "store"\nrunner = "local"\n')


class FakeBuilds:
    """build_cells that publishes a stand-in wheel per cell and records who built what."""

    def __init__(self, store: str, out: Path, *, seconds: float = 0.05) -> None:
        self.store, self.out, self.seconds = store, out, seconds
        self.built: list[tuple[str, str]] = []  # (worker thread, cell id)
        self.lock = threading.Lock()

    def __call__(self, cells: list[Any], *, matrix: Any, opts: BuildOptions,
                 log: Log) -> list[BuildOutcome]:
        out = []
        for pc in cells:
            time.sleep(self.seconds)
            with self.lock:
                self.built.append((threading.current_thread().name, pc.cell.id))
                where = self.out / threading.current_thread().name
                where.mkdir(parents=True, exist_ok=True)
                wheel = publish_build(self.store, where, pc)
            out.append(BuildOutcome(cell_id=pc.cell.id, status="built", wheel=wheel))
        return out


def _worker(matrix: Any, store: str, memory: int, cpus: int, results: dict[str, Any],
            **kwargs: Any) -> None:
    opts = BuildOptions(runner="local", store=store, publish=True,
                        budget=BudgetRequest(memory=memory, cpus=cpus))
    caps = queue.WorkerCaps(memory_bytes=memory, cpus=cpus, machine="x86_64")
    results[threading.current_thread().name] = queue.run_queue(
        matrix, caps=caps, opts=opts, log=Log(), poll=0.1,
        history=MemoryHistory.load(shipped_history_path()), **kwargs)


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBuilds:
    store = tmp_path / "store"
    store.mkdir()
    fake = FakeBuilds(str(store), tmp_path / "out")
    monkeypatch.setattr(queue, "build_cells", fake)
    return fake


def _run(workers: list[tuple[str, int, int]], matrix: Any, store: str,
         **kwargs: Any) -> dict[str, queue.QueueReport]:
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=_worker, name=name,
                                args=(matrix, store, memory, cpus, results), kwargs=kwargs)
               for name, memory, cpus in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


def test_three_workers_build_every_cell_once_and_a_small_one_builds_nothing(
        tmp_path: Path, fakes: FakeBuilds) -> None:
    matrix = load_matrix(write_matrix(tmp_path, MATRIX))
    results = _run([("big", 256 * GIB, 64), ("mid", 64 * GIB, 16), ("tiny", 2 * GIB, 2)],
                   matrix, fakes.store)
    cells = [c for _, c in fakes.built]
    assert sorted(cells) == sorted(pc.cell.id for pc in matrix.cells)  # each once
    assert {w for w, _ in fakes.built} <= {"big", "mid"}
    # a group's cells on one worker, in Python order
    for g in plan_work(matrix.cells, memory=256 * GIB, cpus=64,
                       history=MemoryHistory.load(shipped_history_path())).groups:
        by = [(w, c) for w, c in fakes.built if c in g.cells]
        assert len({w for w, _ in by}) == 1 and [c for _, c in by] == list(g.cells)
    assert results["tiny"].groups_built == 0
    assert len(results["tiny"].not_fitting) == 6
    assert all("needs at least" in line for line in results["tiny"].not_fitting)
    assert not any(r.failed for r in results.values())
    # the store says every cell is published, and no lease is left held
    store = open_store(fakes.store)
    assert {pc.content_key for pc in matrix.cells} <= store.published_content_keys()


def test_a_dead_workers_group_is_taken_over_when_its_lease_expires(
        tmp_path: Path, fakes: FakeBuilds) -> None:
    matrix = load_matrix(write_matrix(tmp_path, MATRIX))
    work = plan_work(matrix.cells, memory=64 * GIB, cpus=16,
                     history=MemoryHistory.load(shipped_history_path()), spread=False)
    first = work.groups[0]
    # a worker that claimed the longest group and died: its lease lives 2 s more
    dead = CellLease(open_store(fakes.store), content_key=first.id, cell=first.name,
                     holder="dead:1:x", ttl=2.0)
    assert dead.try_acquire() is None
    started = time.monotonic()
    results = _run([("heir", 64 * GIB, 16)], matrix, fakes.store, ttl=30.0)
    assert sorted(c for _, c in fakes.built) == sorted(pc.cell.id for pc in matrix.cells)
    assert time.monotonic() - started >= 1.5  # it waited for the dead lease
    assert results["heir"].groups_built == 6
    # the dead worker's group was the last it took (it waited, the others went first)
    assert [c for _, c in fakes.built][-len(first.cells):] == list(first.cells)


def test_without_wait_a_worker_stops_when_the_rest_is_held(tmp_path: Path,
                                                            fakes: FakeBuilds) -> None:
    matrix = load_matrix(write_matrix(tmp_path, MATRIX))
    history = MemoryHistory.load(shipped_history_path())
    work = plan_work(matrix.cells, memory=64 * GIB, cpus=16, history=history, spread=False)
    store = open_store(fakes.store)
    for g in work.groups[:2]:
        assert CellLease(store, content_key=g.id, cell=g.name, holder="other:1:y",
                         ttl=600).try_acquire() is None
    results = _run([("w", 64 * GIB, 16)], matrix, fakes.store, wait=False)
    built = {c for _, c in fakes.built}
    assert built == {c for g in work.groups[2:] for c in g.cells}
    assert results["w"].groups_built == 4


def test_work_command_errors_are_one_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix(tmp_path, MATRIX)
    for extra, message in ((["--lease-ttl", "0"], "--lease-ttl must be positive"),
                           (["--platform", "sparc"], "unknown --platform 'sparc'"),
                           (["--runner", "docker", "--uncapped"], "local runner only"),
                           (["--cpus", "0"], "--cpus must be at least 1")):
        rc = main(["work", "--matrix", str(path), "--store", str(tmp_path / "store"), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and err.count("\n") <= 2, err


def test_sigterm_stops_a_waiting_worker_in_one_line(tmp_path: Path) -> None:
    """SIGTERM (scancel, a pod deleted) unwinds the worker: one ERROR line, exit 143, and
    the worker's own claims are released on the way (the finally blocks run)."""
    path = write_matrix(tmp_path, MATRIX)
    store = tmp_path / "store"
    store.mkdir()
    work = plan_work(load_matrix(path).cells, memory=64 * GIB, cpus=16,
                     history=MemoryHistory.load(shipped_history_path()), spread=False)
    for g in work.groups:  # everything is claimed by a live worker: this one waits
        assert CellLease(open_store(str(store)), content_key=g.id, cell=g.name,
                         holder="other:1:z", ttl=600).try_acquire() is None
    env = {**os.environ, "FACTORY_MEMORY_HISTORY": str(shipped_history_path())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "factory", "work", "--matrix", str(path), "--store", str(store),
         "--memory", "64g", "--cpus", "16", "--runner", "local", "--poll", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:  # the log goes to stderr
        if "held by other workers; waiting" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    *before, last = err.strip().splitlines()
    assert last == "ERROR terminated (signal 15)"
    assert all("waiting" in ln for ln in before), before  # no traceback, no other error
