"""Cross-host safety through the store: two builder processes (separate work dirs) race for one
cell against S3 on loopback; a killed builder's lease is taken over after it expires; a builder
paused past its TTL (SIGSTOP) and resumed publishes nothing (local store and S3); concurrent
history records all survive the merge. The "build" is a quick stand-in (a sleep, then the
pipeline's publish step with a small wheel): what is tested is the protocol, not nvcc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import index_fixtures
from index_wheels import make_wheel

from factory.build.lease import CellLease
from factory.index import verify_index
from factory.store import open_store
from factory.matrix.cell import Cell
from factory.planning.memory_model import BuildMeasurement, MemoryHistory, ModelKey
from factory.planning.shared_history import merge_into, push

moto_endpoint = index_fixtures.moto_endpoint
s3_env = index_fixtures.s3_env
s3_spec = index_fixtures.s3_spec
store_spec = index_fixtures.store_spec

REPO = Path(__file__).resolve().parents[2]

# One builder: claim the cell, "build" (sleep), publish its own wheel through the pipeline's
# publish step (which renews the lease with a conditional write first); print what it did.
BUILDER = r"""
import sys, time
from pathlib import Path
from factory.build.lease import LeaseLost, hold_cell
from factory.build.pipeline import publish_built
from factory.store import open_store
from factory.logger import Log
spec, name, work, ttl, hold, wheel = sys.argv[1:7]
store = open_store(spec)
with hold_cell(store, content_key="k123", cell="demo-cell", ttl=float(ttl), poll=0.2,
               published=lambda: bool(store.wheels("demo")),
               on_wait=lambda lease: print("waiting for", lease.holder, flush=True)) as mine:
    if not mine:
        print("skipped", flush=True)
        sys.exit(0)
    print("building", flush=True)
    open(work + "/built", "w").write(name)
    time.sleep(float(hold))
    try:
        publish_built(store, Path(wheel), Log(stream=sys.stderr), lease=mine)
    except LeaseLost as exc:
        print("lost:", exc.message, flush=True)
        sys.exit(exc.exit_code)
    print("published", flush=True)
"""


def _builder(spec: str, name: str, work: Path, *, ttl: float = 60.0, hold: float = 1.5
             ) -> subprocess.Popen[str]:
    work.mkdir(parents=True, exist_ok=True)
    wheel = make_wheel(work, "demo", f"1.0+{name}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", BUILDER, spec, name, str(work), str(ttl),
                             str(hold), str(wheel)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=work)


def _published(spec: str) -> list[str]:
    return [e.version.split("+")[1] for e in open_store(spec).wheels("demo")]


def test_two_builders_race_for_one_cell_one_builds(s3_spec: str, tmp_path: Path) -> None:
    procs = [_builder(s3_spec, f"host{i}", tmp_path / f"host{i}") for i in (1, 2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    built = [(tmp_path / f"host{i}" / "built").exists() for i in (1, 2)]
    assert built.count(True) == 1, outs
    loser = outs[built.index(False)][0]
    assert "skipped" in loser and "waiting for" in loser and "building" not in loser
    assert _published(s3_spec) == [f"host{built.index(True) + 1}"]


def test_a_killed_builders_lease_is_taken_over_after_it_expires(s3_spec: str,
                                                                 tmp_path: Path) -> None:
    first = _builder(s3_spec, "doomed", tmp_path / "a", ttl=3.0, hold=600)
    assert first.stdout is not None and first.stdout.readline().strip() == "building"
    first.send_signal(signal.SIGKILL)  # no release, no publish: only expiry frees the cell
    first.wait(timeout=30)
    second = _builder(s3_spec, "heir", tmp_path / "b", ttl=3.0, hold=0.1)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "waiting for" in out and "building" in out and "published" in out
    assert _published(s3_spec) == ["heir"]


def test_a_builder_paused_past_its_ttl_does_not_publish_after_resuming(
    store_spec: str, tmp_path: Path
) -> None:
    """SIGSTOP the holder past its TTL: another builder takes the cell over. Resumed, the
    first builder finds its lease lost and publishes nothing; the new holder publishes."""
    paused = _builder(store_spec, "paused", tmp_path / "a", ttl=3.0, hold=5)
    heir = None
    try:
        assert paused.stdout is not None and paused.stdout.readline().strip() == "building"
        paused.send_signal(signal.SIGSTOP)
        heir = _builder(store_spec, "heir", tmp_path / "b", ttl=3.0, hold=3)
        assert heir.stdout is not None
        lines = [heir.stdout.readline().strip()]
        while lines[-1].startswith("waiting for") and len(lines) < 1000:  # until it takes over
            lines.append(heir.stdout.readline().strip())
        assert lines[0].startswith("waiting for") and lines[-1] == "building", lines
        paused.send_signal(signal.SIGCONT)
        out, err = paused.communicate(timeout=120)
        assert paused.returncode == 12, (out, err)
        assert "published" not in out
        lost = [line for line in out.splitlines() if line.startswith("lost:")]
        assert len(lost) == 1 and "names " in lost[0] and "not publishing" in lost[0], out
        rest, err = heir.communicate(timeout=120)
        assert heir.returncode == 0 and "published" in rest, err
    finally:
        for proc in (paused, heir):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()
    assert _published(store_spec) == ["heir"]
    assert verify_index(open_store(store_spec), deep=False).ok


def test_a_live_lease_is_not_taken_and_release_frees_it(store_spec: str) -> None:
    store = open_store(store_spec)
    now = [1000.0]
    a = CellLease(store, content_key="k1", cell="c", holder="a", ttl=60, clock=lambda: now[0])
    b = CellLease(store, content_key="k1", cell="c", holder="b", ttl=60, clock=lambda: now[0])
    assert a.try_acquire() is None
    held = b.try_acquire()
    assert held is not None and held.holder == "a"
    now[0] += 61  # a's lease expired (a was stopped): b takes it over, a's renew then fails
    assert b.try_acquire() is None
    assert a.renew() is False
    b.release()
    assert a.try_acquire() is None


def test_concurrent_history_records_are_merged_not_overwritten(store_spec: str,
                                                               tmp_path: Path) -> None:
    store = open_store(store_spec)
    cell = Cell(package="demo", version="1", torch="2.11.0", cuda="13.0", archs=(90,),
                python="3.12")
    peaks = [(i + 1) * 2**30 for i in range(12)]

    def one(peak: int) -> None:
        push(store, BuildMeasurement(cell=cell, nvcc_threads=1, max_jobs=1, cpus=4,
                                     peak_job_bytes=peak, object_seconds={f"o{peak}": 1.0},
                                     object_peaks={f"o{peak}": peak}))

    threads = [threading.Thread(target=one, args=(p,)) for p in peaks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = MemoryHistory.load(tmp_path / "mine.json")
    assert merge_into(history, store) == len(peaks)
    doc = history.as_document()
    rec = next(r for r in doc["memory"] if r["package"] == "demo")
    assert rec["builds"] == len(peaks)
    times = history.object_times(cell)
    assert times is not None  # every builder's object peak is there, none overwritten
    assert dict(times.peaks) == {f"o{p}": p for p in peaks}
    assert history.estimate(ModelKey.for_cell(cell, 1)).per_job_bytes >= peaks[0]
