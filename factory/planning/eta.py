"""How long a running build still has: the plan's per-object predictions replayed on what has
finished and what is running.

The plan predicts every object's seconds (``planner.object_seconds``: another build's times,
scaled to this cell's archs, threads and contention) and ninja starts the objects in
build.ninja's order on ``jobs`` slots. While the build runs, the sampler
(runners/inside/sampling.py) says which objects are compiling and since when, and which have
finished and how long they took. The estimate is a replay of the rest:

- ``speed``: the seconds the finished objects took over what was predicted for them, with a
  prior of one object of the mean prediction at the predicted speed, so the first object to
  end counts about half; a running object already slower than that counts at its elapsed
  time. (A prior of one wave, ``jobs`` objects, held the speed to the plan's for longer: 34 of
  the 45 goal points of benchmarks/eta_replay.py within 20 %, against 37 with one object, the
  best of four priors tried on those logs, on the flash-attn and the catalog logs alike.)
  Recent objects count more than early ones (an object that ended RECENT_HALF_LIFE of the
  compile's elapsed time ago counts half), so the speed follows a load that changes under the
  build: the flagship build on the shared 2-core builder took 3.2x the H200 times for its
  first hour and 0.5-1.5x after (docs/BENCHMARKS.md, "The ETA during a build").
- Each running object keeps ``speed x predicted - elapsed``; one past that is taken to be
  nearly done (a tenth of its prediction).
- The objects not started yet start in build.ninja's order as slots free up; where setup.py
  runs ninja once per extension (``stages``: torch-scatter's 8 runs), a run's objects start
  only when every object of the runs before it has ended.
- Contention as it really goes: the predictions hold the plan's contention (every slot
  compiling); when fewer objects are left than slots, the last ones compile faster
  (replay.contention_factor on the objects still running).

Before anything runs this is the plan's own replay, except for that last point (the planner
counts full contention to the end: 1-2 % more for flash-attn), so the ETA starts at the
planner's figure; with the plan's range (``spread``: lo/point, hi/point) it starts at the
planner's range and narrows as objects finish and the speed is measured instead of assumed.
Counting objects (``elapsed / done x remaining``) does neither: with the longest objects
first it is 2-3.5x too high all build long.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from factory.planning.ninja_log import LoggedObject
from factory.planning.object_times import ObjectTimes
from factory.planning.planner import object_seconds
from factory.planning.replay import contention_factor

OVERDUE_FRACTION = 0.1  # what an object past its predicted end still has, of its prediction
# The speed's memory, as a fraction of the compile's elapsed time: measured on the repo's
# ninja logs (benchmarks/eta_replay.py), 0.2 kept the H200 runs within 14 % at 10-90 % and
# followed the flagship's load change (at 75 %: +54 % against +113 % counting all objects
# alike); shorter memories (0.1-0.15) swung more on the sm_100 run's uneven predictions.
RECENT_HALF_LIFE = 0.2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eta:
    remaining: float  # seconds of compiling left (point estimate)
    low: float  # the range; equal to ``remaining`` when the plan carries none
    high: float
    speed: float  # measured seconds / predicted seconds so far (1.0: as predicted)
    done: int
    running: int
    total: int

    @property
    def ranged(self) -> bool:
        return self.high - self.low >= 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"remaining_seconds": round(self.remaining, 1),
                "remaining_range": [round(self.low, 1), round(self.high, 1)],
                "speed": round(self.speed, 3), "done": self.done, "running": self.running,
                "total": self.total}


class EtaModel:
    """``predicted``: object key -> predicted seconds in this build (at the plan's contention);
    ``jobs``: ninja's slots; ``cpus`` and ``compilers_per_job`` (archs compiled at once): for
    the contention as slots empty at the end (0 CPUs: constant, as the plan); ``order``: the
    start order (build.ninja's; default longest first, what the factory writes); ``spread``:
    the plan's range as factors of its point figure; ``stages``: key -> the ninja run it
    compiles in (absent: the first; ObjectTimes.stages)."""

    def __init__(self, predicted: Mapping[str, float], *, jobs: int, cpus: int = 0,
                 compilers_per_job: int = 1, order: Sequence[str] | None = None,
                 spread: tuple[float, float] = (1.0, 1.0),
                 stages: Mapping[str, int] | None = None) -> None:
        self.predicted = {k: max(0.0, float(v)) for k, v in predicted.items()}
        self.stages = {k: int(v) for k, v in (stages or {}).items() if k in self.predicted}
        self.jobs = max(1, int(jobs))
        self.cpus = max(0, int(cpus))
        self.per_job = max(1, int(compilers_per_job))
        self.spread = (min(spread[0], 1.0), max(spread[1], 1.0))
        self.mean = (sum(self.predicted.values()) / len(self.predicted)) if self.predicted else 0.0
        # the prior: one object of the mean prediction at the predicted speed
        self.prior = self.mean
        self.order: list[str] = []
        self.reorder(order or ())

    def reorder(self, order: Sequence[str]) -> None:
        """Start order as build.ninja has it (objects it does not name: longest first after)."""
        known = [k for k in dict.fromkeys(order) if k in self.predicted]
        seen = set(known)
        self.order = known + sorted((k for k in self.predicted if k not in seen),
                                    key=lambda k: -self.predicted[k])

    @property
    def total(self) -> int:
        return len(self.predicted)

    def _speed(self, finished: Mapping[str, float], running: Mapping[str, float],
               ended_ago: Mapping[str, float], elapsed: float) -> float:
        took = predicted = self.prior
        for key, seconds in finished.items():
            if key in self.predicted:
                ago = ended_ago.get(key, elapsed)
                weight = 0.5 ** (ago / (RECENT_HALF_LIFE * elapsed)) if elapsed > 0 else 1.0
                took += weight * seconds
                predicted += weight * self.predicted[key]
        speed = took / predicted if predicted > 0 else 1.0
        for key, elapsed in running.items():
            p = self.predicted.get(key)
            if p and elapsed > speed * p:  # already slower than that: at least this slow
                took += elapsed
                predicted += p
        return took / predicted if predicted > 0 else 1.0

    def estimate(self, *, finished: Mapping[str, float], running: Mapping[str, float],
                 done: int | None = None, total: int | None = None,
                 ended_ago: Mapping[str, float] | None = None, elapsed: float = 0.0,
                 speed: float | None = None) -> Eta:
        """``finished``: key -> the seconds it took; ``running``: key -> seconds since it
        started; ``done`` and ``total``: ninja's counts, when the sampler saw fewer objects
        end (one shorter than a sample) or the build has objects the plan does not know;
        ``ended_ago``: key -> seconds since a finished object ended (one it does not name: as
        long ago as the compile began), ``elapsed``: seconds since the compile began (0: every
        finished object counts alike); ``speed``: replay at this speed instead of the one
        learnt from the finished objects (what an ETA at another speed would have said)."""
        if speed is None:
            speed = self._speed(finished, running, ended_ago or {}, elapsed)
        seen_done = sum(1 for k in finished if k in self.predicted)
        n_done = max(seen_done, done or 0)
        pending = sorted((k for k in self.order if k not in finished and k not in running),
                         key=lambda k: self.stages.get(k, 0))  # by ninja run, then in order
        # ninja counted objects the sampler never saw end: the first in order
        unseen = max(0, n_done - seen_done)
        dropped = min(unseen, len(pending))
        pending = pending[dropped:]
        # objects ninja has and the plan does not know: the mean each
        extra = max(0, (total or 0) - self.total - (unseen - dropped))
        evidence = sum(self.predicted.get(k, 0.0) for k in finished)
        # how much of the plan's range is left: the prior's share of the evidence
        weight = math.sqrt(self.prior / (self.prior + evidence)) if self.prior > 0 else 0.0

        # the ninja run going now: the latest of the objects seen; one the plan does not know
        # runs in it, and the objects it does not know are left for the last run
        now = max((self.stages.get(k, 0) for k in (*finished, *running) if k in self.predicted),
                  default=0)
        last = max(self.stages.values(), default=0)

        def remaining(factor: float) -> float:
            s = speed * factor
            busy = []
            for key, elapsed in running.items():
                p = self.predicted.get(key, self.mean) * s
                busy.append((p - elapsed if elapsed < p else OVERDUE_FRACTION * p,
                             self.stages.get(key, now) if key in self.predicted else now))
            rest = [(self.predicted[k] * s, self.stages.get(k, 0)) for k in pending]
            rest += [(self.mean * s, last)] * extra
            return self._makespan(busy, rest)

        point = remaining(1.0)
        low = remaining(1.0 + (self.spread[0] - 1.0) * weight)
        high = remaining(1.0 + (self.spread[1] - 1.0) * weight)
        return Eta(remaining=point, low=min(point, low), high=max(point, high), speed=speed,
                   done=n_done, running=len(running), total=max(self.total, total or 0))

    def _makespan(self, busy: Sequence[tuple[float, int]],
                  pending: Sequence[tuple[float, int]]) -> float:
        """When the last object ends: ``busy`` objects with their seconds left, ``pending``
        ones starting in order on the first free slot, each (seconds, ninja run): a run's
        objects wait for the runs before it to end. Seconds are at the plan's contention;
        with ``cpus`` they are replayed at the contention of the objects really running."""
        full = contention_factor(self.jobs * self.per_job, self.cpus) if self.cpus else 1.0
        active = [(max(0.0, b) / full, r) for b, r in busy]  # seconds alone still to go
        # popped from the end: by run, in order within one
        queue = [(p / full, r) for p, r in sorted(pending, key=lambda x: x[1])][::-1]

        def fill() -> None:
            while len(active) < self.jobs and queue and all(
                    r >= queue[-1][1] for _, r in active):
                active.append(queue.pop())

        fill()
        now = 0.0
        while active:
            rate = 1.0 / (contention_factor(len(active) * self.per_job, self.cpus)
                          if self.cpus else full)
            step = min(a for a, _ in active)
            now += step / rate
            active = [(a - step, r) for a, r in active if a - step > 1e-9]
            fill()
        return now


def model_for(times: ObjectTimes | None, *, archs: int, jobs: int, threads: int, cpus: int,
              spread: tuple[float, float] = (1.0, 1.0), speed: float = 1.0) -> EtaModel | None:
    """The ETA of a build planned at ``jobs`` x ``threads`` on ``cpus`` from the history's
    per-object ``times`` at the plan's machine ``speed`` (BuildPlan.speed_factor); None
    without them."""
    if times is None or not times.seconds:
        return None
    seconds = {k: v * speed for k, v in object_seconds(
        times, archs=archs, jobs=jobs, threads=threads, cpus=cpus).items()}
    return EtaModel(seconds, jobs=jobs, cpus=cpus, compilers_per_job=min(threads, archs),
                    spread=spread, stages=times.stages)


def spread_of(plan: Any) -> tuple[float, float]:
    """The plan's range of compile time as factors of its point figure; (1, 1) without one."""
    point = getattr(plan, "predicted_seconds", None)
    span = getattr(plan, "predicted_seconds_range", None)
    if not point or not span:
        return (1.0, 1.0)
    low, high = span
    return (float(low) / point, float(high) / point)


def unplanned(finished: Mapping[str, float], running: Mapping[str, float], *, jobs: int,
              done: int | None = None, total: int | None = None) -> Eta | None:
    """The ETA of a build with no plan to go on (no object times in the history): every object
    as long as the mean of those measured so far; None before the first one ends. It knows
    nothing of an object longer than those: on the catalog's logs it is far too low (one
    object of causal-conv1d's four takes 467 s, the others 10-52 s)."""
    if not finished:
        return None
    mean = sum(finished.values()) / len(finished)
    model = EtaModel({k: mean for k in set(finished) | set(running)}, jobs=jobs)
    return model.estimate(finished=finished, running=running, done=done, total=total)


def replay_log(model: EtaModel | None, timeline: Sequence[LoggedObject], at: float, *,
               jobs: int = 1, done: int | None = None, total: int | None = None,
               speed: float | None = None) -> Eta | None:
    """The ETA the build would have shown ``at`` seconds in, from a finished build's timeline:
    finished and running objects as the sampler would have seen them, build.ninja's order as
    the log shows it; ``done`` and ``total`` as ninja's ``[N/M]`` lines had said them (default:
    the timeline's); ``speed``: EtaModel.estimate's. Without a ``model``, the ETA of a build
    with no plan (``unplanned``)."""
    finished = {o.key: o.end - o.start for o in timeline if o.end <= at}
    running = {o.key: at - o.start for o in timeline if o.start <= at < o.end}
    if model is None:
        return unplanned(finished, running, jobs=jobs, done=done, total=total)
    model.reorder([o.key for o in timeline])
    began = min((o.start for o in timeline), default=0.0)
    return model.estimate(finished=finished, running=running, done=done,
                          total=len(timeline) if total is None else total,
                          ended_ago={o.key: at - o.end for o in timeline if o.end <= at},
                          elapsed=at - began, speed=speed)
