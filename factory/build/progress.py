"""A running build's progress, true from the first second: which objects are compiling and which
have finished (the sampler's events: runners/inside/sampling.py sees every compiler process, so an
object shows the moment it starts, not when ninja prints ``[N/M]`` at its end), and an ETA
from the plan's per-object predictions replayed on them (factory.planning.eta).

Read from the files the build writes on the host side: the build log (ninja's ``[N/M]``),
the sampler's events beside it, and the build tree (build.ninja's start order; the
``.ninja_log`` of objects an earlier attempt finished). Shown through ``logger.Ticker``: a bar
on a terminal, a line at most every 30 s in CI.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from factory.logger import Log, Ticker
from factory.matrix.load import PlannedCell
from factory.planning.eta import Eta, EtaModel, model_for, spread_of, unplanned
from factory.planning.memory_model import MemoryHistory
from factory.planning.ninja_log import NinjaCount, object_key, read_ninja_timeline
from factory.planning.planner import BuildPlan
from factory.reports.build_report import AttemptPicture, read_events
from factory.reports.compile_events import CompileEvents
from factory.runners.base import BuildJob, RunResult, events_path
from factory.units import format_duration as duration

NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
BAR_WIDTH = 24


class _Tail:
    """The lines appended to a file since the last read (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read()
                self._pos = fh.tell()
        except OSError:
            return []
        data = self._partial + chunk
        *whole, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in whole]


def build_ninja_order(tree: Path) -> list[str] | None:
    """The compile statements' objects in build.ninja's order (what ninja starts first)."""
    found = sorted(tree.glob("build/temp.*/build.ninja"))
    if not found:
        return None
    keys = []
    for line in found[-1].read_text(errors="replace").splitlines():
        outputs, sep, rest = line.partition(": ")
        if outputs.startswith("build ") and sep and "compile" in rest.split(" ", 1)[0]:
            keys.append(object_key(outputs[len("build "):].replace("$ ", " ")))
    return keys or None


class BuildProgress:
    """Follows one attempt. ``model``: the plan's ETA model, None without per-object times
    (then the objects measured so far stand in for them, at their mean)."""

    def __init__(self, *, log_path: Path, events_path: Path, log: Log, label: str,
                 model: EtaModel | None, tree: Path | None = None, jobs: int = 1) -> None:
        self.log = log
        self.label = label
        self.model = model
        self.jobs = jobs
        self.tree = tree
        self._log_tail = _Tail(log_path)
        self._events = _Tail(events_path)
        self.ninja_done = 0
        self.ninja_total = 0
        self._count = NinjaCount()  # ninja's [N/M] over its runs
        self.objects = CompileEvents()  # the sampler's events, as objects
        self.previous: dict[str, float] = {}  # finished by an earlier attempt (.ninja_log)
        self._order_read = False
        self._t0 = time.time()
        self.last: Eta | None = None
        if tree is not None:
            for ninja_log in sorted(tree.glob("build/temp.*/.ninja_log")):
                self.previous.update({o.key: o.end - o.start
                                      for o in read_ninja_timeline(ninja_log)})
        self._ticker = Ticker(log, self.render)

    def __enter__(self) -> BuildProgress:
        self._ticker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ticker.__exit__(*exc)

    # -- reading ------------------------------------------------------------------------------
    def poll(self) -> None:
        # the objects first: a cached compile's stages are matched to them by name
        if not self._order_read and self.tree is not None:
            order = build_ninja_order(self.tree)
            if order:
                self.objects.know(order)
                if self.model is not None:
                    self.model.reorder(order)
                self._order_read = True
        for line in self._log_tail.lines():
            m = NINJA_PROGRESS.match(line.strip())
            if m:
                self._ninja(int(m.group(1)), int(m.group(2)))
        for line in self._events.lines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.objects.feed(event)

    def _ninja(self, n: int, m: int) -> None:
        """One ``[N/M]`` line. setup.py runs ninja once per extension (torch-scatter: 8 runs),
        each counting its own objects from 1: a count that does not go up starts a new run,
        and the runs before it add up."""
        self._count.feed(n, m)
        self.ninja_done, self.ninja_total = self._count.built, self._count.total

    # -- what it says ---------------------------------------------------------------------------
    @property
    def started(self) -> dict[str, float]:
        """Object key -> wall time it started, for the objects compiling now."""
        return self.objects.running

    @property
    def finished(self) -> dict[str, float]:
        """Object key -> seconds it took, for the objects this attempt finished."""
        return {key: end - start for key, (start, end) in self.objects.finished.items()}

    @property
    def first_start(self) -> float | None:
        starts = [*self.objects.running.values(),
                  *(start for start, _ in self.objects.finished.values())]
        return min(starts) if starts else None

    def running(self, now: float) -> dict[str, float]:
        return {key: now - at for key, at in self.objects.running.items()}

    def estimate(self, now: float | None = None) -> Eta | None:
        now = time.time() if now is None else now
        finished = {**self.previous, **self.finished}
        running = self.running(now)
        done = len(self.previous) + self.ninja_done
        total = len(self.previous) + self.ninja_total if self.ninja_total else None
        if self.model is None:  # no plan to go on: the objects measured so far
            if not self.finished:
                return None
            return unplanned(finished, running, jobs=self.jobs, done=done, total=total)
        # recent objects weigh more in the speed (an earlier attempt's: as old as this one)
        return self.model.estimate(
            finished=finished, running=running, done=done, total=total,
            ended_ago={k: now - end for k, (_, end) in self.objects.finished.items()},
            elapsed=now - first if (first := self.first_start) is not None else 0.0)

    def render(self) -> str | None:
        self.poll()
        now = time.time()
        eta = self.estimate(now)
        self.last = eta or self.last
        total = eta.total if eta else (len(self.previous) + self.ninja_total)
        done = eta.done if eta else (len(self.previous) + self.ninja_done)
        running = len(self.started)
        compiling = now - first if (first := self.first_start) is not None else None
        if compiling is None and not total:
            return f"{self.label}: preparing the build ({duration(now - self._t0)})"
        counts = f"{done}/{total or '?'} objects, {running} compiling"
        if compiling is not None:
            counts += f", {duration(compiling)}"
        if eta is None:
            tail = ", ETA after the first object"
        else:
            tail = f", ETA {duration(eta.remaining)}"
            if eta.ranged:
                tail += f" ({duration(eta.low)}-{duration(eta.high)})"
            if compiling is None:
                tail += " (planned)"
        if self.log.interactive and total:
            filled = int(BAR_WIDTH * done / total)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            return f"{self.label} [{bar}] {counts}{tail}"
        return f"{self.label}: {counts}{tail}"


def progress_for(pc: PlannedCell, plan: BuildPlan, job: BuildJob, log: Log, *,
                 history: MemoryHistory, tree: Path) -> BuildProgress:
    """An attempt's progress: the plan's ETA model from the history's object times."""
    model = model_for(history.object_times(pc.cell, cpus=plan.cpus), archs=len(pc.cell.archs),
                      jobs=plan.max_jobs, threads=plan.nvcc_threads, cpus=plan.cpus,
                      spread=spread_of(plan), speed=plan.speed_factor)
    return BuildProgress(log_path=job.log_path, events_path=events_path(job.log_path), log=log,
                         label=pc.cell.package, model=model, tree=tree, jobs=plan.max_jobs)


def attempt_picture(attempt: int, plan: BuildPlan, result: RunResult, job: BuildJob,
                    progress: BuildProgress, *, tree: Path) -> AttemptPicture:
    """The attempt as the build report draws it: the sampler's events, else (a runner without
    the sampler) the build tree's .ninja_log."""
    objects, samples = read_events(events_path(job.log_path), build_ninja_order(tree) or ())
    if not objects and attempt == 1:
        logs = sorted(tree.glob("build/temp.*/.ninja_log"))
        objects = tuple(read_ninja_timeline(logs[-1])) if logs else ()
    outcome = ("OOM-killed" if result.oom_killed else "built" if result.ok
               else f"failed (exit {result.exit_code})")
    return AttemptPicture(
        number=attempt, jobs=plan.max_jobs, threads=plan.nvcc_threads,
        cap_bytes=plan.memory_budget_bytes, predicted_peak_bytes=plan.predicted_peak_bytes,
        predicted_seconds=plan.predicted_seconds, outcome=outcome, objects=objects,
        samples=samples, predicted=progress.model.predicted if progress.model else {},
    )
