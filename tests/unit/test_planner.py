"""The planner: fits the budget, most throughput, explains itself, refuses, backs off on OOM."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import FLASH_ATTN_MATRIX as FLASH_ATTN_ONLY  # one flash-attn cell: FA_SM100

from factory.cli import main
from factory.errors import PlanError
from factory.matrix.cell import Cell
from factory.matrix.load import PlannedCell, load_matrix
from factory.planning.budget import BudgetRequest
from factory.planning.history_file import shipped_history_path
from factory.planning.memory_model import MemoryHistory
from factory.planning.planner import (
    BuildPlan,
    jobs_that_fit,
    plan_after_oom,
    plan_build,
    plan_for,
    predicted_peak,
)
from factory.planning.replay import list_schedule
from factory.units import GIB, parse_size

REPO = Path(__file__).resolve().parents[2]
FA_SM100 = "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm100-cp311"
FA_ALL = "flash-attn-2.8.3.post2-torch2.14.1-cu130-sm80+sm90+sm100+sm120-cp311"
EXT = "factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311"
GB = 10**9


@pytest.fixture(scope="module")
def matrix():  # type: ignore[no-untyped-def]
    return load_matrix(REPO / "matrix.toml")


@pytest.fixture
def history(tmp_path: Path) -> MemoryHistory:
    """The shipped seeds, with writes going to a temp file (tests never touch the shipped one)."""
    return MemoryHistory.load(tmp_path / "history.json")


@pytest.fixture
def per_job_history(tmp_path: Path) -> MemoryHistory:
    """The shipped seeds without the sm_100 cell's own objects entry (the flagship build's):
    the sm_100 cell then plans with the per-job model and sm_90's object times, as it did
    before that build."""
    doc = MemoryHistory.load(shipped_history_path()).as_document()
    doc["objects"] = [e for e in doc["objects"]
                      if not (e["package"] == "flash-attn" and e["archs"] == [100])]
    return MemoryHistory(doc, path=None)


def pc_of(matrix, cell_id: str) -> PlannedCell:  # type: ignore[no-untyped-def]
    return matrix.find(cell_id, outside=True)  # type: ignore[no-any-return]


def test_acceptance_sm100_16g_16cpus_chooses_2_jobs_and_explains(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    # The per-job model: 4.2 GiB per job over a whole build, but the backward hdim256 kernels
    # take 6.7 GiB each and start together: 2 of them + 2 GiB headroom = 15.3 GiB; a third job
    # would not fit.
    budget = BudgetRequest(memory=parse_size("16g"), cpus=16)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=per_job_history)
    assert (plan.max_jobs, plan.nvcc_threads) == (2, 1)
    assert plan.predicted_peak_bytes <= 16 * GIB
    largest = 7159746560
    assert plan.predicted_peak_bytes == 2 * largest + plan.headroom_bytes
    assert "measured" in plan.per_job_source
    text = " ".join(plan.reasons)
    assert "memory allows 2 job(s)" in text and "16 CPU(s)" in text and "headroom" in text
    assert "largest single object 6.7 GiB" in text and "flash_bwd_hdim256" in text


def test_the_heaviest_objects_count_only_for_the_first_jobs(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=parse_size("64g"), cpus=16)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=per_job_history)
    assert plan.max_jobs == 13
    assert plan.predicted_peak_bytes == (
        2 * 7159746560 + 11 * plan.per_job_bytes + plan.headroom_bytes
    )


def test_acceptance_2g_refuses_naming_the_memory_needed(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=parse_size("2g"), cpus=16)
    with pytest.raises(PlanError) as err:
        plan_build(pc_of(matrix, FA_SM100), budget=budget, history=per_job_history)
    msg = err.value.message
    assert "\n" not in msg
    assert "needs at least 8.7 GiB" in msg and "6.7 GiB" in msg and "2.0 GiB" in msg


def test_cpu_bound_plan_uses_every_core_and_no_more(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=512 * GIB, cpus=16)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    assert (plan.max_jobs, plan.nvcc_threads) == (16, 1)


def test_jobs_never_exceed_the_number_of_objects(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=4096 * GIB, cpus=256)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    assert plan.max_jobs == 73


@pytest.mark.parametrize(("memory", "cpus"), [(16, 4), (32, 8), (64, 32), (128, 16), (512, 128)])
def test_four_arch_plans_respect_threads_cores_and_memory(  # type: ignore[no-untyped-def]
    matrix, history, memory: int, cpus: int
) -> None:
    pc = pc_of(matrix, FA_ALL)
    plan = plan_build(pc, budget=BudgetRequest(memory=memory * GIB, cpus=cpus), history=history)
    assert 1 <= plan.nvcc_threads <= 4
    assert plan.max_jobs * plan.nvcc_threads <= cpus
    assert plan.predicted_peak_bytes <= memory * GIB
    # Any plan with more parallelism would not fit: check the next job up.
    est = history.estimate(plan.model_key, model_key="flash-attn")
    bigger = predicted_peak(plan.max_jobs + 1, per_job=plan.per_job_bytes, largest=est.largest,
                            headroom=plan.headroom_bytes)
    assert bigger > memory * GIB or (plan.max_jobs + 1) * plan.nvcc_threads > cpus


def test_threads_are_used_when_jobs_cannot_use_the_cores(matrix, history) -> None:  # type: ignore[no-untyped-def]
    # 4 archs, 4 cores, plenty of memory: 4 jobs x 1 thread and 2 x 2 and 1 x 4 all fill the
    # cores; threads shorten the longest object, so the tail is shorter.
    budget = BudgetRequest(memory=256 * GIB, cpus=4)
    plan = plan_build(pc_of(matrix, FA_ALL), budget=budget, history=history)
    assert plan.max_jobs * plan.nvcc_threads == 4


def test_recipe_without_thread_support_gets_one_thread(matrix, history) -> None:  # type: ignore[no-untyped-def]
    pc = pc_of(matrix, EXT)
    assert not pc.recipe.supports_threads()
    plan = plan_build(pc, budget=BudgetRequest(memory=8 * GIB, cpus=8), history=history)
    assert plan.nvcc_threads == 1
    assert plan.max_jobs >= 1
    assert any("does not pass NVCC_THREADS" in r for r in plan.reasons)


def test_example_extension_uses_its_measured_peak(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=8 * GIB, cpus=4)
    plan = plan_build(pc_of(matrix, EXT), budget=budget, history=history)
    assert "measured" in plan.per_job_source
    assert 1.5 * GB <= plan.per_job_bytes <= 3 * GB
    assert plan.max_jobs == (8 * GIB - plan.headroom_bytes) // plan.per_job_bytes


def test_plan_build_without_a_budget_detects_it(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=None, cpus=None)
    plan = plan_build(pc_of(matrix, EXT), budget=budget, history=history)
    assert plan.cpus >= 1 and plan.memory_budget_bytes > 0


def test_as_dict_is_json_and_has_the_contract_keys(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=16 * GIB, cpus=16)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=per_job_history)
    d = json.loads(json.dumps(plan.as_dict()))
    assert d["max_jobs"] == 2 and d["nvcc_threads"] == 1
    for k in ("memory_budget_bytes", "cpus", "per_job_bytes", "per_job_source",
              "predicted_peak_bytes", "headroom_bytes", "reasons"):
        assert k in d


def test_build_plan_is_frozen_and_keyword_only() -> None:
    with pytest.raises(TypeError):
        BuildPlan(FA_SM100, 1, 1)  # type: ignore[misc]


def test_list_schedule_reproduces_the_reference_numbers() -> None:
    times = MemoryHistory.load(shipped_history_path()).object_times(
        Cell.from_id("flash-attn-2.8.3.post2-torch2.11.0-cu130-sm90-cp312"))
    assert times is not None
    alphabetical = [times.seconds[k] for k in sorted(times.seconds)]
    assert round(list_schedule(alphabetical, 16)) == 1179
    assert round(list_schedule(sorted(times.seconds.values(), reverse=True), 16)) == 1084


def test_predicted_time_uses_longest_first(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=512 * GIB, cpus=16)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=per_job_history)
    assert plan.predicted_seconds == pytest.approx(1083.8, abs=0.1)


# -- OOM --------------------------------------------------------------------------------------

def test_plan_after_oom_drops_jobs_and_records(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=64 * GIB, cpus=32)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    retry = plan_after_oom(plan, 64 * GIB, 1, history=history)
    assert retry.max_jobs < plan.max_jobs
    assert retry.attempt == 2
    assert retry.per_job_bytes > plan.per_job_bytes
    assert retry.predicted_peak_bytes <= plan.memory_budget_bytes
    assert any("OOM-killed" in r for r in retry.reasons)
    # The model learnt it: a fresh plan for the same cell starts lower.
    again = plan_build(pc_of(matrix, FA_SM100), budget=BudgetRequest(memory=64 * GIB, cpus=32),
                       history=MemoryHistory.load(history.path))
    assert again.max_jobs <= retry.max_jobs


def test_the_retry_counts_the_heaviest_objects_too(matrix, history) -> None:  # type: ignore[no-untyped-def]
    # flash-attn's heaviest object (6.7 GiB) is far above its typical job: the retry's jobs and
    # predicted peak must count it as the first plan did (jobs x per-job alone under-predicts).
    budget = BudgetRequest(memory=64 * GIB, cpus=32)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    assert plan.largest_object_bytes > plan.per_job_bytes
    retry = plan_after_oom(plan, None, 1, history=history)
    assert retry.predicted_peak_bytes == predicted_peak(
        retry.max_jobs, per_job=retry.per_job_bytes, largest=plan.largest_object_bytes,
        headroom=plan.headroom_bytes)
    assert retry.predicted_peak_bytes > retry.max_jobs * retry.per_job_bytes + plan.headroom_bytes
    assert retry.max_jobs == min(plan.max_jobs - 1, jobs_that_fit(
        plan.memory_budget_bytes, per_job=retry.per_job_bytes,
        largest=plan.largest_object_bytes, headroom=plan.headroom_bytes))
    assert retry.predicted_peak_bytes <= plan.memory_budget_bytes


def test_second_oom_at_least_halves(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=128 * GIB, cpus=64)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    retry = plan_after_oom(plan, None, 2, history=history)
    assert retry.max_jobs <= plan.max_jobs // 2


def test_oom_at_one_job_drops_threads_then_refuses(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=12 * GIB, cpus=2)
    plan = plan_build(pc_of(matrix, FA_ALL), budget=budget, history=history)
    # One job compiling two archs at once (what a tighter plan could have chosen).
    key = dataclasses.replace(plan.model_key, nvcc_threads=2, concurrent_archs=2)
    plan = dataclasses.replace(plan, max_jobs=1, nvcc_threads=2, model_key=key)
    retry = plan_after_oom(plan, None, 1, history=history)
    assert (retry.max_jobs, retry.nvcc_threads) == (1, 1)
    assert retry.model_key.concurrent_archs == 1
    with pytest.raises(PlanError, match="OOM-killed with one job"):
        plan_after_oom(retry, None, retry.attempt, history=history)


def test_oom_repeatedly_reaches_one_job_then_refuses(matrix, history) -> None:  # type: ignore[no-untyped-def]
    budget = BudgetRequest(memory=64 * GIB, cpus=64)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    jobs = [plan.max_jobs]
    with pytest.raises(PlanError):
        for attempt in range(1, 50):
            plan = plan_after_oom(plan, None, attempt, history=history)
            jobs.append(plan.max_jobs)
    assert jobs == sorted(jobs, reverse=True) and jobs[-1] == 1
    assert len(jobs) < 10


# -- plan_for directly ----------------------------------------------------------------------

def test_unknown_package_uses_the_star_default(history) -> None:  # type: ignore[no-untyped-def]
    cell = Cell(package="mystery", version="1.0", torch="2.14.1", cuda="13.0", archs=(100,),
                python="3.11")
    plan = plan_for(cell, supports_threads=False, memory_model_key="", memory=32 * GIB, cpus=64,
                    history=history)
    assert "'*'" in plan.per_job_source
    assert plan.predicted_seconds is None
    assert plan.max_jobs == (32 * GIB - plan.headroom_bytes) // plan.per_job_bytes


def test_zero_budget_is_refused(history) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError):
        plan_for(Cell.from_id(FA_SM100), supports_threads=True, memory_model_key="flash-attn",
                 memory=0, cpus=4, history=history)


# -- the command ----------------------------------------------------------------------------

def test_cli_plan_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["plan", FA_SM100, "--matrix", str(REPO / "matrix.toml"), "--memory", "16g",
               "--cpus", "16", "--history", str(tmp_path / "h.json"), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    # the cell's own per-object peaks (the flagship build), in the order of the object times
    # measured nearest 16 CPUs (the H200 run's): three jobs would start three heavy kernels
    # together (16.5 GiB with the calibration), two fit 16 GiB
    assert out["version"] == 1 and out["max_jobs"] == 2 and out["nvcc_threads"] == 1
    assert out["predicted_peak_bytes"] <= 16 * GIB


def test_cli_plan_text_and_refusal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    history = ["--history", str(tmp_path / "h.json")]  # not the builder's own file
    assert main(["plan", FA_SM100, "--matrix", str(REPO / "matrix.toml"), "--memory", "16g",
                 "--cpus", "16", *history]) == 0
    assert "MAX_JOBS=2 NVCC_THREADS=1" in capsys.readouterr().out
    assert main(["plan", FA_SM100, "--matrix", str(REPO / "matrix.toml"), "--memory", "2g",
                 *history]) == 6
    err = capsys.readouterr().err
    assert err.startswith("ERROR ") and "needs at least" in err


def test_cli_plan_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", FA_SM100, "--matrix", str(REPO / "matrix.toml"), "--memory", "lots"]) == 2


def test_oom_retry_survives_an_unwritable_history(matrix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A history "inside" a regular file cannot be written, even by root.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    history = MemoryHistory.load(blocker / "h.json")
    budget = BudgetRequest(memory=64 * GIB, cpus=32)
    plan = plan_build(pc_of(matrix, FA_SM100), budget=budget, history=history)
    retry = plan_after_oom(plan, None, 1, history=history)
    assert retry.max_jobs < plan.max_jobs
    assert any("not recorded: cannot create" in r for r in retry.reasons)


def test_a_hand_picked_plan_is_judged_by_the_same_peak_model(matrix, per_job_history) -> None:  # type: ignore[no-untyped-def]
    from factory.build.job import BuildOptions
    from factory.build.pipeline import _resolve_plan

    opts = BuildOptions(budget=BudgetRequest(memory=7 * GIB, cpus=1), max_jobs=1)
    plan = _resolve_plan(pc_of(matrix, FA_SM100), opts, per_job_history)
    assert plan.max_jobs == 1
    # the planner refuses 7 GiB (one backward hdim256 kernel + headroom is 8.7 GiB); the
    # hand-picked plan still runs, and its prediction says it does not fit
    assert plan.predicted_peak_bytes == 7159746560 + plan.headroom_bytes
    assert "does NOT fit" in plan.reasons[-1]


@pytest.mark.parametrize(
    "settings,flags",
    [
        ("", []),  # both detect this process's budget
        ('memory = "512g"\ncpus = 64', []),  # the settings' figures
        ('memory = "512g"', ["--cpus", "8"]),  # a flag for one, the settings for the other
        ('memory = "512g"\ncpus = 64', ["--memory", "24g", "--cpus", "16"]),  # flags win
        ('cpus = 64', ["--memory", "auto"]),  # --memory auto: detected despite the settings
    ],
)
def test_plan_and_build_dry_run_plan_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    settings: str, flags: list[str],
) -> None:
    monkeypatch.delenv("FACTORY_MEMORY_HISTORY", raising=False)
    path = tmp_path / "matrix.toml"
    path.write_text(f"[settings]\n{settings}\n{FLASH_ATTN_ONLY}")
    assert main(["plan", FA_SM100, "--json", "--matrix", str(path), *flags]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["build", FA_SM100, "--dry-run", "--json", "--matrix", str(path), *flags]) == 0
    built = json.loads(capsys.readouterr().out)["dry_run"][0]["plan"]
    for key in ("max_jobs", "nvcc_threads", "cpus"):
        assert built[key] == planned[key], key
    memory_given = ("memory" in settings and "auto" not in flags) or "24g" in flags
    if memory_given:  # a detected budget follows the host's free memory from call to call
        assert built == {k: v for k, v in planned.items() if k != "version"}
    if "cpus = 64" in settings and "--cpus" not in flags:
        assert planned["cpus"] == 64
        assert any("[settings] cpus" in r for r in planned["reasons"])
    if "--memory" in flags and "24g" in flags:
        assert planned["memory_budget_bytes"] == 24 * GIB
