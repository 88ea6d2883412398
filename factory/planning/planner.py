"""Choose MAX_JOBS and NVCC_THREADS so the build's peak memory fits the budget, fastest first.

The story that motivated the factory (five OOM kills and a reboot) came from picking MAX_JOBS by the
core count. Here the per-job PEAK memory at a given thread count comes from the memory model
(factory.planning.memory_model), and the plan is the (jobs, threads) pair with the shortest
predicted compile time among those whose predicted peak fits:

    predicted peak = headroom + min(jobs, 2) x largest + max(0, jobs - 2) x per_job

per_job is a job's peak over a whole build (what many jobs average to); largest is the heaviest
single object where one was measured above it (flash-attn's backward hdim256 kernels take 6.7 GiB
against 4.2 GiB per job). Two jobs count at that size: the heaviest objects come in pairs (the
fp16 and bf16 builds of one kernel), and longest-first ordering starts them together. Without
such a measurement largest = per_job and the formula is jobs x per_job + headroom.
headroom covers the pip/setup.py Python process (torch imported) and the final link of the
.so, which runs after the compiles but in the same memory.

Throughput: each object compiles every arch; nvcc --threads T runs min(T, archs) of them at
once, so an object takes ceil(archs / T) "arch rounds". With per-object times from history
the prediction is a longest-first list schedule on ``jobs`` slots (what the critical-path
ordering in factory.planning.critical_path makes ninja do); without them it is total work divided by
the parallelism min(cores, jobs x threads). Threads never exceed the arch count (more only
cost memory) and jobs x threads never exceeds the cores (oversubscribed compilers run no
faster and each still holds its memory).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from factory.errors import ConfigError, PlanError
from factory.matrix.cell import Cell
from factory.matrix.load import PlannedCell
from factory.planning.budget import BudgetRequest
from factory.planning.cell_model import cell_time
from factory.planning.memory_model import Estimate, MemoryHistory, ModelKey
from factory.planning.object_times import ObjectTimes
from factory.planning.replay import (
    PEAK_WINDOW_SECONDS,
    TAIL_FRACTION,
    Replay,
    contention_factor,
    replay,
    staged_schedule,
)
from factory.planning.spread import Calibration, RunCheck, Spread, calibrate, spread
from factory.units import GIB, format_size

# A tie within this fraction of the best predicted time goes to the plan with the lower peak:
# the time model is not that precise, and memory left over is safety.
_TIE = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildPlan:
    cell_id: str
    max_jobs: int
    nvcc_threads: int
    memory_budget_bytes: int
    cpus: int
    per_job_bytes: int
    per_job_source: str
    predicted_peak_bytes: int
    headroom_bytes: int
    predicted_seconds: float | None  # None: no per-object times in history for this package
    model_key: ModelKey
    memory_model_key: str  # the recipe's default key (for a re-plan after an OOM)
    attempt: int = 1  # 1 for the first plan, n+1 after the n-th OOM
    reasons: tuple[str, ...] = ()
    largest_object_bytes: int = 0  # the heaviest single object (predicted_peak); 0: per_job
    # the point figures' ranges from the recorded runs the plan drew on (planning.spread);
    # None where the plan predicts no time (or after an OOM re-plan)
    predicted_seconds_range: tuple[float, float] | None = None
    predicted_peak_range: tuple[int, int] | None = None
    range_runs: tuple[RunCheck, ...] = ()
    # the whole cell as `factory schedule` counts it (factory.planning.cell_model): the
    # compile + the recipe's measured overhead around it
    cell_overhead_seconds: float = 0.0
    predicted_cell_seconds: float | None = None
    # the object times' seconds x this = the plan's (planning.spread.calibrate: the speed of
    # the recorded run nearest the plan's CPUs); the ETA scales its predictions the same
    speed_factor: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cell": self.cell_id,
            "max_jobs": self.max_jobs,
            "nvcc_threads": self.nvcc_threads,
            "memory_budget_bytes": self.memory_budget_bytes,
            "cpus": self.cpus,
            "per_job_bytes": self.per_job_bytes,
            "per_job_source": self.per_job_source,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "largest_object_bytes": max(self.largest_object_bytes, self.per_job_bytes),
            "headroom_bytes": self.headroom_bytes,
            "predicted_seconds": self.predicted_seconds,
            "predicted_seconds_range": (list(self.predicted_seconds_range)
                                        if self.predicted_seconds_range else None),
            "predicted_peak_bytes_range": (list(self.predicted_peak_range)
                                           if self.predicted_peak_range else None),
            "range_runs": [c.as_dict() for c in self.range_runs],
            "cell_overhead_seconds": round(self.cell_overhead_seconds, 1),
            "predicted_cell_seconds": (round(self.predicted_cell_seconds, 1)
                                       if self.predicted_cell_seconds is not None else None),
            "speed_factor": round(self.speed_factor, 4),
            "model_key": self.model_key.as_dict(),
            "attempt": self.attempt,
            "reasons": list(self.reasons),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Option:
    jobs: int
    threads: int
    per_job: int
    source: str
    peak: int
    seconds: float | None
    parallelism: int
    largest: int = 0
    largest_source: str = ""
    replayed: bool = False  # the peak comes from the per-object replay
    estimate: Estimate | None = None  # the per-job estimate at these threads


HEAVY_JOBS = 2  # jobs counted at the largest object's peak


def predicted_peak(jobs: int, *, per_job: int, largest: int, headroom: int) -> int:
    heavy = min(jobs, HEAVY_JOBS)
    return headroom + heavy * max(largest, per_job) + (jobs - heavy) * per_job


def jobs_that_fit(memory: int, *, per_job: int, largest: int, headroom: int) -> int:
    """The most jobs whose predicted peak fits ``memory`` (0 when not even one does)."""
    largest = max(largest, per_job)
    free = memory - headroom
    if free < largest:
        return 0
    if free < HEAVY_JOBS * largest:
        return free // largest
    return HEAVY_JOBS + (free - HEAVY_JOBS * largest) // per_job


def object_seconds(times: ObjectTimes, *, archs: int, jobs: int, threads: int, cpus: int
                   ) -> dict[str, float]:
    """Each object's predicted seconds in a build of ``jobs`` x ``threads`` on ``cpus``: its
    time alone (the measured contention divided out), scaled to the archs and threads, times
    this build's contention (objects slow down as more CPUs compile: replay.contention_factor).
    What the plan's compile time replays, and what the ETA during the build starts from."""
    base = dataclasses.replace(times, seconds=times.alone())
    slowdown = contention_factor(jobs * min(threads, archs), cpus)
    return {k: v * slowdown for k, v in base.scaled(archs, threads).items()}


def _predict(times: ObjectTimes | None, archs: int, jobs: int, threads: int, cpus: int
             ) -> float | None:
    if times is None:
        return None
    seconds = object_seconds(times, archs=archs, jobs=jobs, threads=threads, cpus=cpus)
    return staged_schedule(seconds, times.stages, jobs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectReplay:
    """A cell's objects in build.ninja's start order with their seconds alone and peaks."""

    objects: tuple[tuple[float, int], ...]
    source: str
    keys: tuple[str, ...] = ()  # the objects' keys, in the same order
    peak_factor: float = 1.0  # the replayed peak's scale (planning.spread.calibrate)
    stages: tuple[int, ...] = ()  # the objects' ninja runs, in the same order (ObjectTimes)

    @classmethod
    def of(cls, cell: Cell, times: ObjectTimes | None, threads: int, *,
           peak_factor: float = 1.0) -> ObjectReplay | None:
        """None without per-object peaks measured for exactly this package, version, CUDA and
        arch set (the planner then uses the per-job model: an object's size differs per arch,
        e.g. flash_bwd_hdim256 takes 6.7 GiB for sm_100 with torch 2.14)."""
        if times is None or not times.peaks or (times.version, times.cuda, times.archs) != (
                cell.version, cell.cuda, cell.archs):
            return None
        archs = len(cell.archs)
        base = dataclasses.replace(times, seconds=times.alone())
        seconds = base.scaled(archs, threads)
        peaks = times.scaled_peaks(min(threads, archs))
        if not seconds or not peaks:  # a build that failed before any object finished
            return None
        heaviest = max(peaks.values())  # an object nobody sampled: as heavy as the heaviest
        order = sorted(seconds, key=lambda k: -seconds[k])  # critical_path's order
        return cls(objects=tuple((seconds[k], peaks.get(k, heaviest)) for k in order),
                   source=times.source, keys=tuple(order), peak_factor=peak_factor,
                   stages=tuple(times.stages.get(k, 0) for k in order))

    def in_order(self, order: Sequence[str]) -> ObjectReplay:
        """The same objects started in ``order`` (a recorded run's own start order); those
        it does not name keep their place after them."""
        if not order or not self.keys:
            return self
        by_key = dict(zip(self.keys, self.objects, strict=True))
        run_of = dict(zip(self.keys, self.stages or [0] * len(self.keys), strict=True))
        first = [k for k in dict.fromkeys(order) if k in by_key]
        rest = [k for k in self.keys if k not in set(first)]
        keys = first + rest
        return dataclasses.replace(self, objects=tuple(by_key[k] for k in keys),
                                   keys=tuple(keys), stages=tuple(run_of[k] for k in keys))

    def run(self, jobs: int, *, threads: int, archs: int, cpus: int) -> Replay:
        """The objects on ``jobs`` slots at this build's contention, setup.py's ninja runs
        one after the other."""
        factor = contention_factor(jobs * min(threads, archs), cpus)
        return replay([(s * factor, p) for s, p in self.objects], jobs, self.stages)

    def peak(self, r: Replay) -> int:
        """A replay's compile peak as the plan counts it: scaled by ``peak_factor``, never
        below the heaviest object alone (one compile reaches its own peak)."""
        return max(int(r.peak_bytes * self.peak_factor), max(p for _, p in self.objects))

    def jobs_that_fit(self, memory: int, *, headroom: int, most: int, threads: int,
                      archs: int, cpus: int) -> tuple[int, Replay | None]:
        """The most jobs (up to ``most``) whose replayed peak + headroom fits ``memory``."""
        for jobs in range(most, 0, -1):
            r = self.run(jobs, threads=threads, archs=archs, cpus=cpus)
            if self.peak(r) + headroom <= memory:
                return jobs, r
        return 0, None


def thread_choices(cell: Cell, supports_threads: bool, cpus: int) -> list[int]:
    if not supports_threads:
        return [1]
    return list(range(1, max(1, min(len(cell.archs), cpus)) + 1))


def plan_for(
    cell: Cell,
    *,
    supports_threads: bool,
    memory_model_key: str,
    memory: int,
    cpus: int,
    history: MemoryHistory,
    memory_source: str = "given",
    cpus_source: str = "given",
    machine_cpus: int | None = None,
) -> BuildPlan:
    """The planner proper, on plain values (the simulator calls this too). ``machine_cpus``:
    the CPUs of the machine the build runs on, where it has more than the plan's share (a
    schedule's lane, a bound's one CPU): they pick the recorded run whose speed applies."""
    if memory <= 0 or cpus <= 0:
        raise PlanError(f"the budget must be positive (memory {memory} bytes, {cpus} CPUs)")
    archs = len(cell.archs)
    headroom = history.headroom_bytes(memory_model_key or cell.package)
    beside = history.non_compile_bytes(memory_model_key or cell.package)
    machine = machine_cpus or cpus
    times = history.object_times(cell, cpus=machine)  # measured nearest the machine
    n_objects = len(times.seconds) if times else None  # more jobs than objects never help
    cal = calibration(cell, history, cpus=machine, model_key=memory_model_key)

    options: list[_Option] = []
    smallest: _Option | None = None
    for threads in thread_choices(cell, supports_threads, cpus):
        key = ModelKey.for_cell(cell, threads)
        est = history.estimate(key, model_key=memory_model_key)
        conc = key.concurrent_archs
        sizes = {"per_job": est.per_job_bytes, "largest": est.largest, "headroom": headroom}
        by_cpu = cpus // conc
        most = min(by_cpu, n_objects or by_cpu)
        largest, largest_source = est.largest, est.largest_object_source
        objects = ObjectReplay.of(cell, times, threads, peak_factor=cal.peak_factor)
        if objects is not None and times is not None:
            shape = {"threads": threads, "archs": archs, "cpus": cpus}
            # Beside the compiles only setup.py and ninja (measured); the link comes after
            # them and needs the headroom alone.
            one_peak = max(objects.peak(objects.run(1, **shape)) + beside, headroom)
            jobs, run = objects.jobs_that_fit(memory, headroom=beside, most=most, **shape)
            if headroom > memory:
                jobs, run = 0, None
            largest = max(p for _, p in objects.objects)
            largest_source = "per-object peaks"
            peak = max(objects.peak(run) + beside, headroom) if run else one_peak
            seconds = run.span_seconds * cal.speed if run else None
            source = (f"per-object peaks of the {times.describe()} record ({times.peaks_from}) "
                      f"replayed in the start order of its object times ({objects.source}), "
                      f"per-job figure {format_size(est.per_job_bytes)} for reference")
        else:
            jobs = min(jobs_that_fit(memory, **sizes), most)
            one_peak = predicted_peak(1, **sizes)
            peak = predicted_peak(max(1, int(jobs)), **sizes)
            seconds = _predict(times, archs, max(1, int(jobs)), threads, cpus)
            seconds = seconds * cal.speed if seconds is not None else None
            source = est.source
        one = _Option(jobs=1, threads=threads, per_job=est.per_job_bytes, source=source,
                      peak=one_peak, seconds=None, parallelism=conc, replayed=objects is not None,
                      estimate=est, largest=largest, largest_source=largest_source)
        if smallest is None or one.peak < smallest.peak:
            smallest = one
        if jobs < 1:
            continue
        options.append(_Option(
            jobs=int(jobs), threads=threads, per_job=est.per_job_bytes, source=source,
            peak=peak, seconds=seconds, parallelism=int(jobs) * conc,
            replayed=objects is not None, estimate=est, largest=largest,
            largest_source=largest_source,
        ))

    budget_txt = f"{format_size(memory)} ({memory_source})"
    if not options:
        assert smallest is not None
        what = (f"its heaviest object, {format_size(smallest.largest)} at {smallest.threads} "
                f"nvcc thread(s), + {format_size(beside)} beside it; the link needs "
                f"{format_size(headroom)}" if smallest.replayed else
                f"one job of {format_size(smallest.largest)} at {smallest.threads} nvcc "
                f"thread(s) + {format_size(headroom)} headroom")
        raise PlanError(
            # rounded up: "needs 7.0 GiB" of a 7.0 GiB budget would read as a fit
            f"{cell.id} needs at least {math.ceil(smallest.peak / GIB * 10) / 10:.1f} GiB of "
            f"memory ({what}) but the budget is {budget_txt}",
            tip="raise --memory / the container's memory limit, or build fewer archs per cell",
        )

    def cost(o: _Option) -> float:
        if o.seconds is not None:
            return o.seconds
        # No object times: work / parallelism, with the work per object in arch rounds.
        return math.ceil(archs / min(o.threads, archs)) / o.jobs

    best_cost = min(cost(o) for o in options)
    near = [o for o in options if cost(o) <= best_cost * (1 + _TIE)]
    chosen = min(near, key=lambda o: (o.peak, -o.threads))
    ranges = _spread(cell, chosen, times, headroom=headroom, beside=beside, cal=cal)
    plan = dataclasses.replace(
        _plan(cell, chosen, memory=memory, cpus=cpus, headroom=headroom,
              memory_model_key=memory_model_key), speed_factor=cal.speed)
    whole = cell_time(cell, plan, history, model_key=memory_model_key, machine_cpus=machine)
    return dataclasses.replace(
        plan,
        reasons=_explain(cell, chosen, options, memory=memory, cpus=cpus, headroom=headroom,
                         budget_txt=budget_txt, cpus_source=cpus_source,
                         supports_threads=supports_threads, n_objects=n_objects, times=times)
        + tuple(cal.reasons(machine) if times is not None else ())
        + tuple(ranges.reasons())
        + (f"around the compile {whole.overhead_seconds:.0f} s (venv, pip, link, tag, repair, "
           f"verify): {whole.overhead_source}",),
        predicted_seconds_range=ranges.seconds, predicted_peak_range=ranges.peak,
        range_runs=ranges.checks, cell_overhead_seconds=whole.overhead_seconds,
        predicted_cell_seconds=whole.seconds if plan.predicted_seconds is not None else None,
    )


def calibration(cell: Cell, history: MemoryHistory, *, cpus: int,
                model_key: str = "") -> Calibration:
    """How the recorded runs of the cell's object times scale a plan on ``cpus`` CPUs: the
    machine speed and the peak factor (planning.spread.calibrate)."""
    times = history.object_times(cell, cpus=cpus)
    beside = history.non_compile_bytes(model_key or cell.package)
    return calibrate(_run_checks(cell, times, beside=beside, cal=Calibration()),
                     times_cpus=times.cpus if times else 0, cpus=cpus,
                     ooms=times.ooms if times else 0)


def _run_checks(cell: Cell, times: ObjectTimes | None, *, beside: int,
                cal: Calibration) -> list[RunCheck]:
    """The model (scaled by ``cal``) replayed at each recorded run's jobs and CPUs
    (planning.spread): the per-object replay where the cell has per-object peaks, else the list
    schedule of the object times."""
    checks: list[RunCheck] = []
    if times is None:
        return checks
    archs, threads = len(times.archs), times.nvcc_threads
    objects = ObjectReplay.of(cell, times, threads, peak_factor=cal.peak_factor)
    for run in times.runs:
        if run.max_jobs < 1 or run.cpus < 1:
            continue
        supplied = ", ".join(what for what, yes in (
            ("object times", run.supplied_times), ("speed", run == cal.speed_from)) if yes)
        if objects is not None:  # in the run's own start order, where it was recorded
            r = objects.in_order(run.order).run(run.max_jobs, threads=threads, archs=archs,
                                                cpus=run.cpus)
            peak = objects.peak(r) + (beside if run.peak_of == "host" else 0)
            checks.append(RunCheck(run=run, predicted_seconds=r.span_seconds * cal.speed,
                                   predicted_peak_bytes=peak if run.peak_bytes else None,
                                   supplied=supplied))
        else:
            seconds = _predict(times, archs, run.max_jobs, threads, run.cpus) or 0.0
            checks.append(RunCheck(run=run, predicted_seconds=seconds * cal.speed,
                                   supplied=supplied))
    return checks


def _spread(cell: Cell, o: _Option, times: ObjectTimes | None, *, headroom: int,
            beside: int, cal: Calibration) -> Spread:
    """The chosen option's ranges: the calibrated model at each recorded run (_run_checks); a
    per-job peak's range from its record's recent peaks."""
    checks = _run_checks(cell, times, beside=beside, cal=cal) if times is not None else []
    fallback, fallback_source = None, ""
    est = o.estimate
    if not o.replayed and est is not None and est.peaks_seen:
        per_job = est.per_job_low_bytes or o.per_job
        low = predicted_peak(o.jobs, per_job=per_job,
                             largest=max(est.largest_object_bytes, per_job), headroom=headroom)
        fallback = (low, o.peak)
        fallback_source = (f"per job from the {est.peaks_seen} recent peak(s) of the record "
                           "the estimate comes from")
    return spread(o.seconds, o.peak, checks, peak_fallback=fallback,
                  peak_fallback_source=fallback_source)


def _plan(cell: Cell, o: _Option, *, memory: int, cpus: int, headroom: int,
          memory_model_key: str, attempt: int = 1) -> BuildPlan:
    return BuildPlan(
        cell_id=cell.id, max_jobs=o.jobs, nvcc_threads=o.threads, memory_budget_bytes=memory,
        cpus=cpus, per_job_bytes=o.per_job, per_job_source=o.source, predicted_peak_bytes=o.peak,
        headroom_bytes=headroom, largest_object_bytes=o.largest,
        predicted_seconds=round(o.seconds, 1) if o.seconds is not None else None,
        model_key=ModelKey.for_cell(cell, o.threads), memory_model_key=memory_model_key,
        attempt=attempt,
    )


def _explain(cell: Cell, o: _Option, options: Sequence[_Option], *, memory: int, cpus: int,
             headroom: int, budget_txt: str, cpus_source: str, supports_threads: bool,
             n_objects: int | None, times: ObjectTimes | None) -> tuple[str, ...]:
    archs = len(cell.archs)
    out = [f"budget: {budget_txt} of memory, {cpus} CPU(s) ({cpus_source})"]
    if o.replayed:
        out.append(f"memory per object at {o.threads} nvcc thread(s): {o.source}")
    else:
        out += [
            f"per-job peak {format_size(o.per_job)} at {o.threads} nvcc thread(s): {o.source}",
            f"{format_size(headroom)} reserved as headroom for the pip/setup.py Python process "
            "and the final link",
        ]
    limits = [f"{cpus} CPU(s) allow {cpus // min(o.threads, archs)}"]
    if n_objects:
        limits.append(f"there are {n_objects} objects")
    if o.replayed:
        out.append(
            f"at {o.threads} thread(s): the replay of build.ninja's start order (each object at "
            f"its own peak for its first {PEAK_WINDOW_SECONDS:.0f} s, then "
            f"{TAIL_FRACTION:.0%}) allows {o.jobs} job(s); " + ", ".join(limits))
        out.append(f"predicted peak {format_size(o.peak)} (replayed compiles + what runs beside "
                   f"them; the link after them needs {format_size(headroom)}) <= "
                   f"{format_size(memory)}")
    else:
        if o.largest > o.per_job:
            out.append(
                f"largest single object {format_size(o.largest)}: the first {HEAVY_JOBS} jobs "
                f"are counted at that size ({o.largest_source or 'measured'})"
            )
        by_memory = jobs_that_fit(memory, per_job=o.per_job, largest=o.largest,
                                  headroom=headroom)
        out.append(f"at {o.threads} thread(s): memory allows {by_memory} job(s), "
                   + ", ".join(limits) + f" -> {o.jobs} job(s)")
        heavy = min(o.jobs, HEAVY_JOBS) if o.largest > o.per_job else 0
        terms = ([f"{heavy} x {format_size(o.largest)}"] if heavy else []) + (
            [f"{o.jobs - heavy} x {format_size(o.per_job)}"] if o.jobs > heavy else [])
        out.append(
            f"predicted peak {' + '.join(terms)} + {format_size(headroom)} = "
            f"{format_size(o.peak)} <= {format_size(memory)}"
        )
    if not supports_threads:
        out.append(f"nvcc threads fixed at 1: {cell.package}'s recipe does not pass "
                   "NVCC_THREADS to nvcc")
    elif archs == 1:
        out.append("nvcc threads 1: the cell compiles one arch, more threads would only "
                   "cost memory")
    if o.seconds is not None and times is not None:
        out.append(
            f"predicted compile time {o.seconds / 60:.0f} min, longest objects first "
            f"(object times of the {times.describe()} record, from {times.source})"
        )
    for alt in options:
        if alt is o:
            continue
        if alt.seconds is not None and o.seconds is not None:
            out.append(
                f"rejected {alt.jobs} job(s) x {alt.threads} thread(s): predicted "
                f"{alt.seconds / 60:.0f} min, peak {format_size(alt.peak)}"
            )
        else:
            out.append(
                f"rejected {alt.jobs} job(s) x {alt.threads} thread(s): parallelism "
                f"{alt.parallelism} vs {o.parallelism}, peak {format_size(alt.peak)}"
            )
    return tuple(out)


def plan_build(pc: PlannedCell, *, budget: BudgetRequest,
               history: MemoryHistory | None = None) -> BuildPlan:
    """Plan one cell within ``budget`` (``requested_budget`` makes it from the flags and the
    settings; what it leaves None is detected from this process's cgroup)."""
    found = budget.resolve()
    return plan_for(
        pc.cell,
        supports_threads=pc.recipe.supports_threads(),
        memory_model_key=pc.recipe.memory_model_key or pc.recipe.name,
        memory=found.memory_bytes, cpus=found.cpus,
        history=history if history is not None else MemoryHistory.load(),
        memory_source=found.memory_source, cpus_source=found.cpus_source,
    )


def plan_after_oom(plan: BuildPlan, observed_peak_bytes: int | None, attempt: int, *,
                   history: MemoryHistory | None = None) -> BuildPlan:
    """The plan for the retry after attempt ``attempt`` (1-based) was OOM-killed.

    The kill proves each of ``plan.max_jobs`` jobs needed more than the plan assumed: at least
    (observed peak - headroom) / jobs when the runner measured the peak, else at least the
    budget share per job. That floor (and 25 % on top of the old estimate, whichever is more)
    goes into the model, so the next plan of this key starts lower too. Jobs then drop to what
    fits, always at least one fewer; a second OOM halves them. At one job, threads drop to
    one; at one job and one thread there is nothing left to give up: PlanError.
    """
    history = history if history is not None else MemoryHistory.load()
    budget = plan.memory_budget_bytes
    usable = max(1, budget - plan.headroom_bytes)
    proven = (
        (max(observed_peak_bytes, budget) - plan.headroom_bytes) / plan.max_jobs
        if observed_peak_bytes
        else usable / plan.max_jobs
    )
    per_job = int(max(plan.per_job_bytes * 1.25, proven))
    try:
        history.record_oom(
            plan.model_key, per_job,
            f"OOM-killed at {plan.max_jobs} job(s) x {plan.nvcc_threads} thread(s) under "
            f"{format_size(budget)}" + (f", peak {format_size(observed_peak_bytes)}"
                                         if observed_peak_bytes else ""),
            # what each job was predicted to hold on average -> what the kill proves
            peak_factor=per_job / max(1.0, (plan.predicted_peak_bytes - plan.headroom_bytes)
                                      / plan.max_jobs),
        )
        recorded = "recorded in the memory history"
    except ConfigError as exc:
        # The retry matters more than the record: go on, and say so in the cell report.
        recorded = f"not recorded: {exc.message}"
    threads = plan.nvcc_threads
    if plan.max_jobs <= 1:
        if threads <= 1:
            raise PlanError(
                f"{plan.cell_id} was OOM-killed with one job and one nvcc thread under "
                f"{format_size(budget)}: it needs more than "
                f"{format_size(per_job + plan.headroom_bytes)}",
                tip="raise --memory / the container's memory limit",
            )
        threads = 1
        per_job = int(per_job / plan.model_key.concurrent_archs)
        jobs = 1
    else:
        # what fits, the heaviest objects counted as in the first plan
        fit = jobs_that_fit(budget, per_job=per_job, largest=plan.largest_object_bytes,
                            headroom=plan.headroom_bytes)
        jobs = min(plan.max_jobs - 1, fit)
        if attempt >= 2:
            jobs = min(jobs, plan.max_jobs // 2)
        jobs = max(1, int(jobs))
    new_key = dataclasses.replace(
        plan.model_key, nvcc_threads=threads,
        concurrent_archs=min(threads, plan.model_key.concurrent_archs),
    )
    peak = predicted_peak(jobs, per_job=per_job, largest=plan.largest_object_bytes,
                          headroom=plan.headroom_bytes)
    reasons = plan.reasons + (
        f"attempt {attempt} was OOM-killed at {plan.max_jobs} job(s) x {plan.nvcc_threads} "
        f"thread(s); per-job peak now taken as {format_size(per_job)} ({recorded})",
        f"retry {attempt + 1}: {jobs} job(s) x {threads} thread(s), predicted peak "
        f"{format_size(peak)}; finished objects are kept in the build directory",
    )
    return dataclasses.replace(
        plan, max_jobs=jobs, nvcc_threads=threads, per_job_bytes=per_job,
        per_job_source=f"raised after an OOM kill at {plan.max_jobs} job(s)",
        predicted_peak_bytes=peak, predicted_seconds=None, model_key=new_key,
        attempt=attempt + 1, reasons=reasons,
        # the kill proved the model wrong here: no range from the runs it drew on
        predicted_seconds_range=None, predicted_peak_range=None, range_runs=(),
        predicted_cell_seconds=None,
    )
