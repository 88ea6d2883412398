"""Replay a planned compile: which objects run together, at their own size, and for how long.

ninja starts the objects in build.ninja's order (longest first, factory.planning.critical_path)
on ``jobs`` slots. With each object's measured seconds and peak RSS the replay says when each
one starts and ends, and so what runs together:

- Memory. A compile holds its peak in its front end (cicc over flash-attn's templates) for
  about its first minute, then about half of it (ptxas and the host compile). The peak of a
  build is where many front ends coincide: at the very start, when every slot starts at once
  (FIELD-NOTES s.3: "the peak came 51 s in"). Fitted on the two 16-job sm_90 runs in the repo
  (setup.py's order: 16 backward kernels at once, 67.0 GiB; longest first: 12 split + 4
  backward kernels, 56.25 GiB), it predicts the two 9-job runs of 2026-11-29 (sm_90 and
  sm_100 under 48 GiB) within 8 % (docs/BENCHMARKS.md, benchmarks/simulate_schedule.py).
- Time. Objects slow down as more CPUs compile: +14 % per object when every CPU compiles
  (the 16-job run on 16 cores against the same objects alone), proportionally beyond the
  cores. Measured seconds are divided by the factor they were measured under, then multiplied
  by the plan's.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence

PEAK_WINDOW_SECONDS = 60.0  # how long an object's front end holds its peak
TAIL_FRACTION = 0.5  # what it holds after that, as a fraction of its peak
CONTENTION = 0.14  # slow-down per object when every CPU compiles


def contention_factor(compilers: float, cpus: int) -> float:
    """How much slower an object compiles with ``compilers`` compiling on ``cpus`` CPUs than
    alone: 1 + 14 % x the share of busy CPUs, and proportionally more past the core count."""
    share = compilers / max(1, cpus)
    return (1.0 + CONTENTION * min(1.0, share)) * max(1.0, share)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Replay:
    peak_bytes: int  # compile memory only (add the non-compile memory to compare with a cap)
    span_seconds: float


def replay(objects: Sequence[tuple[float, int]], jobs: int,
           stages: Sequence[int] = ()) -> Replay:
    """``objects`` in start order as (seconds, peak bytes), run on ``jobs`` slots; with
    ``stages`` (each object's ninja run, in the same order: ObjectTimes.stages) a run's objects
    start only when every object of the runs before it has ended, as setup.py runs ninja once
    per extension (torch-scatter: 8 runs)."""
    runs: dict[int, list[tuple[float, int]]] = {}
    for obj, run in zip(objects, stages or [0] * len(objects), strict=True):
        runs.setdefault(run, []).append(obj)
    events: list[tuple[float, int, float]] = []  # (time, order: ends before starts, delta)
    span = 0.0
    for run in sorted(runs):
        free = [span] * max(1, jobs)  # the run before has ended
        span = max(span, _place(runs[run], free, events))
    events.sort()
    level = best = 0.0
    for _, _, delta in events:
        level += delta
        best = max(best, level)
    return Replay(peak_bytes=int(round(best)), span_seconds=span)


def _place(objects: Sequence[tuple[float, int]], free: list[float],
           events: list[tuple[float, int, float]]) -> float:
    """Start ``objects`` in order on the first ``free`` slot; their memory's rise and fall go
    into ``events``; when the last of them ends."""
    span = 0.0
    for seconds, peak in objects:
        start = heapq.heappop(free)
        end = start + seconds
        heapq.heappush(free, end)
        span = max(span, end)
        events.append((start, 1, float(peak)))
        if end > start + PEAK_WINDOW_SECONDS:
            events.append((start + PEAK_WINDOW_SECONDS, 0, -(1 - TAIL_FRACTION) * peak))
            events.append((end, 0, -TAIL_FRACTION * peak))
        else:
            events.append((end, 0, -float(peak)))
    return span


def list_schedule(durations: Iterable[float], slots: int) -> float:
    """Makespan of running ``durations`` in the given order on ``slots`` parallel slots
    (each starts on the first free slot), as ninja does with a ready queue of independent
    compiles."""
    free = [0.0] * max(1, slots)
    end = 0.0
    for d in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
        end = max(end, start + d)
    return end


def staged_schedule(seconds: Mapping[str, float], stages: Mapping[str, int], jobs: int
                    ) -> float:
    """The compile's makespan: each ninja run (``stages``: key -> run, absent: the first)
    longest first on ``jobs`` slots, one run after the other."""
    order = sorted(seconds, key=lambda k: (stages.get(k, 0), -seconds[k]))
    return replay([(seconds[k], 0) for k in order], jobs,
                  [stages.get(k, 0) for k in order]).span_seconds
