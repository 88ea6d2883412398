"""The memory model: shipped seeds, fallback chain, peaks not means, atomic shared history."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from factory.environment import HISTORY_ENV
from factory.errors import ConfigError, StoreError
from factory.matrix.cell import Cell
from factory.planning.history_file import history_path, shipped_history_path
from factory.planning.memory_model import (
    INFERRED_MARGIN,
    RECENT_PEAKS,
    BuildMeasurement,
    MemoryHistory,
    ModelKey,
)
from factory.planning.ninja_log import (
    compile_span,
    ninja_counts,
    object_key,
    read_entries,
    read_ninja_log,
    stages_of,
)
from factory.planning.planner import _predict
from factory.planning.record import record_build

GB = 10**9


def fa_cell(**over: object) -> Cell:
    values: dict[str, object] = {
        "package": "flash-attn", "version": "2.8.3.post2", "torch": "2.14.1", "cuda": "13.0",
        "archs": (100,), "python": "3.11",
    }
    values.update(over)
    return Cell(**values)  # type: ignore[arg-type]


def doc(memory: list[dict[str, object]] | None = None, **defaults: object) -> dict[str, object]:
    return {
        "version": 1,
        "defaults": defaults or {"*": {"per_arch_bytes": 5 * GB}},
        "memory": memory or [],
        "objects": [],
    }


def rec(peak: int, **key: object) -> dict[str, object]:
    base: dict[str, object] = {"package": "p", "version": "1.0", "cuda": "13.0",
                               "concurrent_archs": 1, "nvcc_threads": 1}
    base.update(key)
    return {**base, "recent_peaks": [peak], "builds": 1}


def key(**over: object) -> ModelKey:
    values: dict[str, object] = {"package": "p", "version": "1.0", "cuda": "13.0",
                                 "concurrent_archs": 1, "nvcc_threads": 1}
    values.update(over)
    return ModelKey(**values)  # type: ignore[arg-type]


def test_shipped_history_is_version_1_and_seeded_from_the_measurements() -> None:
    data = json.loads(shipped_history_path().read_text())
    assert data["version"] == 1
    h = MemoryHistory.load(shipped_history_path())
    est = h.estimate(ModelKey.for_cell(fa_cell(), 1), model_key="flash-attn")
    assert est.exact
    # measured (factory/data/flash-attn-2.8.3.post2_sm90_h200_*): ~4.3-4.5 GB per job for one
    # arch, 4.4 GB peak RSS for one sm_100 kernel.
    assert 4.3 * GB <= est.per_job_bytes <= 4.7 * GB
    two = h.estimate(ModelKey.for_cell(fa_cell(archs=(90, 100)), 2), model_key="flash-attn")
    assert two.exact and two.per_job_bytes >= 2 * 4.5 * GB


def test_shipped_object_times_are_the_16_job_log() -> None:
    times = MemoryHistory.load(shipped_history_path()).object_times(fa_cell(archs=(90,)))
    assert times is not None
    assert len(times.seconds) == 73
    assert round(sum(times.seconds.values())) == 16212
    longest = max(times.seconds, key=lambda k: times.seconds[k])
    assert longest == "csrc/flash_attn/src/flash_fwd_split_hdim64_fp16_sm80"


def test_the_sm100_cell_has_its_own_shipped_objects() -> None:
    # the flagship cell built twice on the 2-core builder (loaded, then idle): the idle
    # rebuild's 73 objects' seconds, each object's larger sampled peak of the two, and the three
    # real runs of these objects (the two builds and the H200 sm_100 run), the loaded build's
    # and the H200 run's own times kept with them
    times = MemoryHistory.load(shipped_history_path()).object_times(fa_cell(), cpus=2)
    assert times is not None and times.archs == (100,)
    assert len(times.seconds) == len(times.peaks) == 73
    assert (times.max_jobs, times.cpus) == (2, 2)
    assert sum(times.seconds.values()) == pytest.approx(7291.2, abs=1.0)  # the rebuild's
    assert max(times.peaks.values()) > 6.5 * 2**30  # flash_bwd_hdim256, as measured alone
    assert [(r.max_jobs, r.date, bool(r.seconds), r.supplied_times) for r in times.runs] == [
        (9, "2026-11-29", True, False), (2, "2026-12-01", True, False),
        (2, "2026-12-02", False, True)]


def test_model_key_counts_archs_compiled_at_once() -> None:
    four = fa_cell(archs=(80, 90, 100, 120))
    assert ModelKey.for_cell(four, 4).concurrent_archs == 4
    assert ModelKey.for_cell(four, 2).concurrent_archs == 2
    assert ModelKey.for_cell(fa_cell(), 4).concurrent_archs == 1


def test_exact_record_answers_with_its_peak() -> None:
    h = MemoryHistory(doc([rec(3 * GB)]), path=None)
    est = h.estimate(key())
    assert est.exact and est.per_job_bytes == 3 * GB


def test_other_threads_same_concurrency_is_used_without_margin() -> None:
    h = MemoryHistory(doc([rec(3 * GB, nvcc_threads=4)]), path=None)
    est = h.estimate(key())
    assert not est.exact and est.per_job_bytes == 3 * GB


def test_other_cuda_then_other_version_get_a_margin() -> None:
    h = MemoryHistory(doc([rec(3 * GB, cuda="12.8")]), path=None)
    est = h.estimate(key())
    assert est.per_job_bytes == int(3 * GB * (1 + INFERRED_MARGIN))
    assert "CUDA 12.8" in est.source
    h = MemoryHistory(doc([rec(3 * GB, version="0.9", cuda="12.8")]), path=None)
    assert "version 0.9" in h.estimate(key()).source


def test_other_arch_count_scales_per_arch() -> None:
    h = MemoryHistory(doc([rec(10 * GB, concurrent_archs=2, nvcc_threads=2)]), path=None)
    est = h.estimate(key(concurrent_archs=3, nvcc_threads=3))
    assert est.per_job_bytes == int(15 * GB * (1 + INFERRED_MARGIN))


def test_unknown_package_falls_back_to_recipe_default_then_star() -> None:
    h = MemoryHistory(doc(**{"torch-extension": {"per_arch_bytes": 2 * GB},
                             "*": {"per_arch_bytes": 5 * GB}}), path=None)
    assert h.estimate(key(), model_key="torch-extension").per_job_bytes == 2 * GB
    assert h.estimate(key(concurrent_archs=2), model_key="nope").per_job_bytes == 10 * GB
    assert "'*'" in h.estimate(key(), model_key="nope").source


def test_no_default_at_all_is_a_config_error() -> None:
    h = MemoryHistory({"version": 1, "defaults": {}, "memory": []}, path=None)
    with pytest.raises(ConfigError):
        h.estimate(key())


def test_wrong_version_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "h.json"
    p.write_text(json.dumps({"version": 2}))
    with pytest.raises(ConfigError, match="version"):
        MemoryHistory.load(p)


def test_record_keeps_the_peak_of_recent_builds_not_the_mean(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    h = MemoryHistory.load(path)
    cell = fa_cell(package="p", version="1.0")
    for peak in (3 * GB, 5 * GB, 4 * GB):
        h.record(BuildMeasurement(cell=cell, nvcc_threads=1, max_jobs=2, peak_job_bytes=peak))
    k = ModelKey.for_cell(cell, 1)
    assert MemoryHistory.load(path).estimate(k).per_job_bytes == 5 * GB
    # The high peak ages out after RECENT_PEAKS lighter builds.
    for _ in range(RECENT_PEAKS):
        h.record(BuildMeasurement(cell=cell, nvcc_threads=1, max_jobs=2, peak_job_bytes=4 * GB))
    assert MemoryHistory.load(path).estimate(k).per_job_bytes == 4 * GB


def test_record_writes_a_versioned_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "h.json"
    h = MemoryHistory.load(path)
    h.record(BuildMeasurement(cell=fa_cell(), nvcc_threads=1, max_jobs=3,
                              peak_job_bytes=6 * GB, object_seconds={"csrc/a": 1.5},
                              source="test"))
    data = json.loads(path.read_text())
    assert data["version"] == 1
    assert data["memory"][0]["peak_bytes"] == 6 * GB
    assert data["objects"][0]["seconds"] == {"csrc/a": 1.5}
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_user_file_overlays_shipped_and_starts_from_the_shipped_record(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    h = MemoryHistory.load(path)
    k = ModelKey.for_cell(fa_cell(), 1)
    shipped = h.estimate(k, model_key="flash-attn").per_job_bytes
    h.record(BuildMeasurement(cell=fa_cell(), nvcc_threads=1, max_jobs=3, peak_job_bytes=GB))
    # A light build does not talk the model below the shipped peaks it inherited.
    assert MemoryHistory.load(path).estimate(k).per_job_bytes == shipped
    h.record_oom(k, 9 * GB, "test oom")
    again = MemoryHistory.load(path)
    assert again.estimate(k).per_job_bytes == 9 * GB
    assert "1 OOM" in again.estimate(k).source
    # The shipped file itself is untouched.
    assert MemoryHistory.load(shipped_history_path()).estimate(k).per_job_bytes == shipped


def test_the_heaviest_object_survives_a_user_record_and_scales_with_archs(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    h = MemoryHistory.load(path)
    k = ModelKey.for_cell(fa_cell(), 1)
    shipped = h.estimate(k, model_key="flash-attn")
    assert shipped.largest > shipped.per_job_bytes and "flash_bwd_hdim256" in (
        shipped.largest_object_source)
    h.record_oom(k, 9 * GB, "test oom")  # the user's file now has its own record for the key
    mine = MemoryHistory.load(path).estimate(k)
    assert mine.per_job_bytes == 9 * GB and mine.largest == 9 * GB
    h.record_oom(k, 4 * GB, "a lighter record")
    assert MemoryHistory.load(path).estimate(k).largest >= shipped.largest
    # two archs at once, inferred from the one-arch record: the heavy object scales too
    two = MemoryHistory.load(shipped_history_path()).estimate(
        ModelKey.for_cell(fa_cell(archs=(90, 100)), 2), model_key="flash-attn")
    assert two.largest > two.per_job_bytes


def test_object_times_prefer_the_same_archs_and_cuda(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    h = MemoryHistory.load(path)
    h.record(BuildMeasurement(cell=fa_cell(), nvcc_threads=1, max_jobs=2, peak_job_bytes=None,
                              object_seconds={"csrc/x": 7.0}, source="sm100 build"))
    assert MemoryHistory.load(path).object_times(fa_cell()).source == "sm100 build"  # type: ignore[union-attr]
    other = MemoryHistory.load(path).object_times(fa_cell(archs=(90,)))
    assert other is not None and "16jobs" in other.source


def test_object_times_scale_with_arch_rounds() -> None:
    times = MemoryHistory.load(shipped_history_path()).object_times(fa_cell())
    assert times is not None
    one = times.scaled(1, 1)["csrc/flash_attn/flash_api"]
    assert times.scaled(4, 1)["csrc/flash_attn/flash_api"] == pytest.approx(4 * one)
    assert times.scaled(4, 2)["csrc/flash_attn/flash_api"] == pytest.approx(2 * one)
    assert times.scaled(4, 3)["csrc/flash_attn/flash_api"] == pytest.approx(2 * one)


def test_concurrent_records_from_two_histories_keep_both(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    a, b = MemoryHistory.load(path), MemoryHistory.load(path)
    cells = [fa_cell(package=f"pkg{i}", version="1.0") for i in range(8)]

    def work(h: MemoryHistory, mine: list[Cell]) -> None:
        for c in mine:
            h.record(BuildMeasurement(cell=c, nvcc_threads=1, max_jobs=1, peak_job_bytes=GB))

    threads = [threading.Thread(target=work, args=(a, cells[:4])),
               threading.Thread(target=work, args=(b, cells[4:]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    packages = {r["package"] for r in json.loads(path.read_text())["memory"]}
    assert packages == {f"pkg{i}" for i in range(8)}


def test_history_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    assert history_path() == shipped_history_path()
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "env.json"))
    assert history_path() == tmp_path / "env.json"
    assert history_path(tmp_path / "arg.json") == tmp_path / "arg.json"


def test_object_key_normalises_build_and_source_paths() -> None:
    assert object_key("/w/t/build/temp.linux-x86_64-cpython-311/csrc/a/b.o") == "csrc/a/b"
    assert object_key("csrc/a/b.cuda.o") == "csrc/a/b"
    assert object_key("csrc/a/b.cu") == "csrc/a/b"
    assert object_key("./csrc/x.cpp") == "csrc/x"


def test_read_ninja_log_keeps_a_second_compile_as_its_own_object(tmp_path: Path) -> None:
    # setup.py's second ninja run (another extension) compiles a.o again, counting from 0
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n0\t1000\t0\tbuild/temp.x/a.o\th\n"
                   "5\t2505\t0\tbuild/temp.x/b.o\th\n0\t3000\t0\tbuild/temp.x/a.o\th\n")
    assert read_ninja_log(log) == {"a": 1.0, "b": 2.5, "a#2": 3.0}
    entries = read_entries(log)
    # the second run starts where the first ended, and is the second stage
    assert [(e.key, e.start, e.end, e.stage) for e in entries] == [
        ("a", 0.0, 1.0, 0), ("b", 0.005, 2.505, 0), ("a#2", 2.505, 5.505, 1)]
    assert stages_of(entries) == {"a#2": 1}
    assert compile_span(entries) == 5.505


def test_read_entries_after_a_resume_takes_the_last_attempts_compile(tmp_path: Path) -> None:
    # an attempt compiled a and b, then the resumed attempt (its flags changed) compiled a
    # again and c: only the last attempt's two entries are its compiles
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n0\t1000\t0\tbuild/temp.x/a.o\th\n"
                   "5\t2505\t0\tbuild/temp.x/b.o\th\n0\t3000\t0\tbuild/temp.x/a.o\th\n"
                   "0\t4000\t0\tbuild/temp.x/c.o\th\n")
    assert {e.key: e.seconds for e in read_entries(log, compiled=2)} == {
        "a": 3.0, "b": 2.5, "c": 4.0}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FakeResult:
    oom_killed: bool = False
    compile_peak_rss_bytes: int | None = 12 * GB
    max_concurrent_compiles: int | None = 3
    cache_hits: int | None = None
    sccache_hits: int | None = None
    objects_built: int | None = 4
    object_peak_rss_bytes: dict[str, int] | None = None
    log_path: Path = Path("nowhere/logs/attempt-1.log")
    compile_cpu_seconds: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FakePlan:
    max_jobs: int = 3
    nvcc_threads: int = 1
    cpus: int = 4


def _planned_ext():  # type: ignore[no-untyped-def]
    from factory.matrix.load import load_matrix

    repo = Path(__file__).resolve().parents[2]
    return load_matrix(repo / "matrix.toml").find(
        "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311")


def _tree_with_log(root: Path) -> Path:
    log = root / "src" / "build" / "temp.linux-x86_64-cpython-311" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v7\n0\t90000\t0\t/factory/src/build/temp.linux-x86_64-cpython-311"
                   "/csrc/add.o\th\n")
    return root / "src"


def test_record_build_from_a_runner_result(tmp_path: Path) -> None:
    tree = _tree_with_log(tmp_path / "work")
    h = MemoryHistory.load(tmp_path / "h.json")
    pc = _planned_ext()
    line = record_build(pc, FakePlan(), FakeResult(
        log_path=tmp_path / "work" / "logs" / "attempt-1.log"), history=h)
    assert "per job" in line and "1 object time" in line
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["memory"][0]["recent_peaks"][-1] == 4 * GB
    assert data["objects"][0]["seconds"] == {"csrc/add": 90.0}
    assert tree.exists()


def test_record_build_skips_cached_times_and_oom_attempts(tmp_path: Path) -> None:
    tree = _tree_with_log(tmp_path / "work")
    h = MemoryHistory.load(tmp_path / "h.json")
    pc = _planned_ext()
    assert "OOM" in record_build(pc, FakePlan(), FakeResult(oom_killed=True), history=h)
    assert not (tmp_path / "h.json").exists()
    record_build(pc, FakePlan(), FakeResult(cache_hits=5), build_tree=tree, history=h)
    assert json.loads((tmp_path / "h.json").read_text())["objects"] == []
    # every object missed the direct layer, but sccache answered some of their stages
    record_build(pc, FakePlan(), FakeResult(cache_hits=0, sccache_hits=3), build_tree=tree,
                 history=h)
    assert json.loads((tmp_path / "h.json").read_text())["objects"] == []


def test_record_build_ignores_the_peak_of_a_link_only_resume(tmp_path: Path) -> None:
    # Seen on a GPU machine: a resumed build whose objects were all there only linked, and its
    # 0.2 GB peak went into the model as a per-job figure.
    h = MemoryHistory.load(tmp_path / "h.json")
    line = record_build(_planned_ext(), FakePlan(), FakeResult(
        compile_peak_rss_bytes=GB // 5, max_concurrent_compiles=1, objects_built=None,
        log_path=tmp_path / "work" / "logs" / "attempt-1.log"), history=h)
    assert line == "memory history: nothing measured"
    assert not (tmp_path / "h.json").exists()


def test_record_build_never_fails_the_build(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    h = MemoryHistory.load(blocker / "h.json")
    line = record_build(_planned_ext(), FakePlan(), FakeResult(), history=h)
    assert line.startswith("memory history: not recorded")


def _tree_with_objects(root: Path, spans: list[tuple[int, int]]) -> Path:
    log = root / "src" / "build" / "temp.linux-x86_64-cpython-311" / ".ninja_log"
    log.parent.mkdir(parents=True)
    # ninja logs an entry as it ends
    log.write_text("# ninja log v7\n" + "".join(
        f"{a}\t{b}\t0\t/factory/src/build/temp.linux-x86_64-cpython-311/csrc/o{i}.o\th\n"
        for i, (a, b) in sorted(enumerate(spans), key=lambda x: x[1][1])))
    return root / "src"


def test_record_build_keeps_the_attempt_as_a_whole_run(tmp_path: Path) -> None:
    # Four objects in 2 jobs: the run's span is ninja's first start to last end (150 s), its
    # peak the compilers' summed RSS; both come back as the entry's recorded run.
    tree = _tree_with_objects(tmp_path / "w", [(0, 90000), (0, 60000), (60000, 150000),
                                               (90000, 120000)])
    h = MemoryHistory.load(tmp_path / "h.json")
    pc = _planned_ext()
    line = record_build(pc, FakePlan(max_jobs=2, cpus=2), FakeResult(objects_built=4),
                        build_tree=tree, history=h)
    assert "the run as a whole" in line
    times = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell)
    assert times is not None and len(times.runs) == 1
    run = times.runs[0]
    assert (run.max_jobs, run.cpus, run.compile_seconds) == (2, 2, 150.0)
    assert run.peak_bytes == 12 * GB and run.peak_of == "compilers"
    # a second build adds a run, the first stays
    tree2 = _tree_with_objects(tmp_path / "w2", [(0, 100000)] * 4)
    record_build(pc, FakePlan(max_jobs=4, cpus=4), FakeResult(objects_built=4),
                 build_tree=tree2, history=h)
    times = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell)
    assert times is not None and [r.max_jobs for r in times.runs] == [2, 4]
    # the entry's times are the latest build's: only that run supplied them (a plan's range
    # does not count it as evidence, factory.planning.spread)
    assert [r.supplied_times for r in times.runs] == [False, True]
    # the first run keeps its own times: a plan for a machine like its own (2 CPUs) takes
    # them, one for 4 CPUs the latest build's
    first = {"csrc/o0": 90.0, "csrc/o1": 60.0, "csrc/o2": 90.0, "csrc/o3": 30.0}
    assert dict(times.runs[0].seconds) == first
    near = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell, cpus=2)
    assert near is not None and dict(near.seconds) == first and near.cpus == 2
    assert [r.supplied_times for r in near.runs] == [True, False]
    far = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell, cpus=8)
    assert far is not None and far.cpus == 4 and set(far.seconds.values()) == {100.0}
    # a resumed build's times come from no whole run: no run supplied them any more
    tree3 = _tree_with_objects(tmp_path / "w3", [(0, 100000)] * 4)
    record_build(pc, FakePlan(max_jobs=4, cpus=4), FakeResult(objects_built=1),
                 build_tree=tree3, history=h)
    times = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell)
    assert times is not None and [r.supplied_times for r in times.runs] == [False, False]


def test_a_resumed_attempt_is_no_whole_run(tmp_path: Path) -> None:
    # After an OOM kill the log holds both attempts' objects: 4 in the log, 1 compiled now.
    tree = _tree_with_objects(tmp_path / "w", [(0, 90000)] * 4)
    h = MemoryHistory.load(tmp_path / "h.json")
    line = record_build(_planned_ext(), FakePlan(), FakeResult(objects_built=1),
                        build_tree=tree, history=h)
    assert "the run as a whole" not in line
    assert "runs" not in json.loads((tmp_path / "h.json").read_text())["objects"][0]


def test_a_run_travels_through_the_shared_records() -> None:
    from factory.planning.object_times import RecordedRun
    from factory.planning.shared_history import measurement_of, record_document

    run = RecordedRun(source="s", date="2026-12-01", max_jobs=2, cpus=2, compile_seconds=9.5,
                      peak_bytes=GB, machine="m", cpu_seconds=17.5)
    m = BuildMeasurement(cell=fa_cell(), nvcc_threads=1, max_jobs=2, peak_job_bytes=None,
                         run=run)
    back = measurement_of(json.loads(json.dumps(record_document(m))))
    assert back.run == run
    assert measurement_of(json.loads(json.dumps(record_document(
        dataclasses.replace(m, run=None))))).run is None


def test_only_the_logs_objects_get_a_peak(tmp_path: Path) -> None:
    # Seen in the 32-job run: the sampler also named the link's .so and a host compile's
    # temporary assembler file (tmp/ccXXXX.s) as objects.
    tree = _tree_with_objects(tmp_path / "w", [(0, 1000)])
    h = MemoryHistory.load(tmp_path / "h.json")
    record_build(_planned_ext(), FakePlan(), FakeResult(objects_built=1, object_peak_rss_bytes={
        "/factory/src/build/temp.linux-x86_64-cpython-311/csrc/o0.o": 3 * GB,
        "build/lib.linux-x86_64-cpython-311/x.cpython-311-x86_64-linux-gnu.so": GB,
        "/tmp/ccnC64oo.s": 2 * GB}), build_tree=tree, history=h)
    entry = json.loads((tmp_path / "h.json").read_text())["objects"][0]
    assert entry["peak_bytes"] == {"csrc/o0": 3 * GB}


def test_peaks_through_the_compile_cache_land_on_their_objects() -> None:
    # Seen in the flagship build with --cache: sccache ran nvcc's stages in its server, so
    # the sampler saw cicc and ptxas with -o in sccache's temp dir, named after the source.
    from factory.planning.record import object_peaks

    objects = ["csrc/flash_attn/src/flash_bwd_hdim256_fp16_sm80", "csrc/flash_attn/flash_api"]
    raw = {
        "/tmp/sccache_nvccAB12cd/flash_bwd_hdim256_fp16_sm80.ptx": 7 * GB,
        "/tmp/sccache_nvccAB12cd/flash_bwd_hdim256_fp16_sm80.cubin": 2 * GB,
        "/tmp/sccache_nvccAB12cd/x_0.cpp1.ii": 9 * GB,  # anonymous: nobody's
        "/f/src/build/temp.linux-x86_64-cpython-311/csrc/flash_attn/flash_api.o": GB,
        "/tmp/cc0Uhdig.s": 9 * GB,
    }
    assert object_peaks(raw, objects) == {objects[0]: 7 * GB, objects[1]: GB}


def test_a_second_ninja_run_is_recorded_with_its_repeats_and_planned_after_the_first(
        tmp_path: Path) -> None:
    # setup.py's two extensions, one ninja run each into one build dir and one log: o0 and o1
    # (60 and 30 s), then o0 again (40 s) counting from 0; 3 compiles in this attempt
    log = tmp_path / "w" / "src" / "build" / "temp.linux-x86_64-cpython-311" / ".ninja_log"
    log.parent.mkdir(parents=True)
    out = "/factory/src/build/temp.linux-x86_64-cpython-311/csrc"
    log.write_text(f"# ninja log v7\n0\t30000\t0\t{out}/o1.o\th\n0\t60000\t0\t{out}/o0.o\th\n"
                   f"0\t40000\t0\t{out}/o0.o\th\n")
    h = MemoryHistory.load(tmp_path / "h.json")
    pc = _planned_ext()
    line = record_build(pc, FakePlan(max_jobs=2, cpus=2), FakeResult(
        objects_built=3, object_peak_rss_bytes={f"{out}/o0.o": 3 * GB}, compile_cpu_seconds=60.0),
        build_tree=tmp_path / "w" / "src", history=h)
    assert "3 object time(s)" in line and "the run as a whole" in line
    times = MemoryHistory.load(tmp_path / "h.json").object_times(pc.cell)
    assert times is not None
    assert dict(times.seconds) == {"csrc/o0": 60.0, "csrc/o1": 30.0, "csrc/o0#2": 40.0}
    assert dict(times.stages) == {"csrc/o0#2": 1}
    assert dict(times.peaks) == {"csrc/o0": 3 * GB, "csrc/o0#2": 3 * GB}
    assert times.runs[0].compile_seconds == 100.0  # the second run after the first
    # 60 CPU seconds in its 100 s span on 2 jobs: a builder shared with other work
    assert times.runs[0].cpu_seconds == 60.0 and times.runs[0].starved()
    # the plan's compile time: the first run's longest, then the second run
    assert _predict(times, 1, 2, 1, 2) == pytest.approx(100.0)


def test_ninja_counts_add_up_over_ninja_runs() -> None:
    assert ninja_counts([]) == (0, 0)
    assert ninja_counts([(1, 3), (2, 3), (3, 3), (1, 2), (2, 2), (1, 1)]) == (6, 6)
    assert ninja_counts([(1, 3), (2, 3), (1, 2)]) == (3, 5)  # the first run stopped at 2


def test_object_stages_travel_through_the_shared_records() -> None:
    from factory.planning.shared_history import measurement_of, record_document

    m = BuildMeasurement(cell=fa_cell(), nvcc_threads=1, max_jobs=2, peak_job_bytes=None,
                         object_seconds={"a": 1.0, "a#2": 2.0}, object_stages={"a#2": 1})
    back = measurement_of(json.loads(json.dumps(record_document(m))))
    assert dict(back.object_stages) == {"a#2": 1}
    bad = {**record_document(m), "object_stages": {"a#2": -1}}
    with pytest.raises(StoreError, match="ninja run"):
        measurement_of(bad)
