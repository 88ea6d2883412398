"""One builder's share of the work in lanes side by side.

A builder runs its groups in lanes, as many as its memory allows (at most MAX_LANES): each
lane's cells are planned with the builder's memory divided by the lanes (one shared budget,
nothing counted twice) and all its CPUs, so the CPUs are shared (``cell_times.shared_span``).
A cell the planner refuses at a lane's memory cannot go there.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from factory.planning.builders import Builder
from factory.planning.cell_times import CellTimes, Phase, shared_span
from factory.planning.groups import Group

MAX_LANES = 16  # cells a builder runs side by side at most


def _lanes(b: Builder, groups: Sequence[Group], times: CellTimes
           ) -> tuple[int, list[list[Group]], list[float]] | None:
    """Run ``groups`` on builder ``b`` in the number of lanes side by side that ends first
    (each cell planned with memory / lanes and all the CPUs: more lanes keep the CPUs busy,
    fewer give each cell more jobs). Per lane count, longest first onto the least loaded
    lane, by CPU work and by time alone (the two differ where memory caps a group's jobs);
    then, for the best lane count, moves and swaps off the lane that ends last while they
    help. Returns (lanes, groups per lane, end per lane), or None when not even one lane
    fits a group."""
    best: tuple[int, list[list[Group]], list[float]] | None = None
    for k in range(1, min(len(groups), MAX_LANES) + 1):
        phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for g in groups}
        if any(p is None for p in phases.values()):
            continue
        tried: list[list[list[Group]]] = []
        for by_time in (False, True):
            load = {key: sum(p.work / (min(p.cap, b.cpus) if by_time else 1.0)
                             for p in ps or ()) for key, ps in phases.items()}
            lanes: list[list[Group]] = [[] for _ in range(k)]
            filled = [0.0] * k
            # ties by phases, not by input order: groups alike here are interchangeable, so
            # the lanes' ends depend only on the multiset (what ``_Spans`` remembers)
            for g in sorted(groups, key=lambda g: (-load[g.key], [
                    (p.work, p.parallel, p.longest) for p in phases[g.key] or ()])):
                i = filled.index(min(filled))
                lanes[i].append(g)
                filled[i] += load[g.key]
            if lanes in tried:
                continue
            tried.append(lanes)
            ends = _run(b, lanes, phases)
            if best is None or max(ends) < max(best[2]):
                best = (k, lanes, ends)
    return None if best is None else _balance(b, best, times)


def _run(b: Builder, lanes: Sequence[Sequence[Group]],
         phases: Mapping[tuple[str, ...], Sequence[Phase] | None]) -> list[float]:
    return shared_span(b.cpus, [[p for g in lane for p in phases[g.key] or ()]
                                for lane in lanes])


def _balance(b: Builder, found: tuple[int, list[list[Group]], list[float]],
             times: CellTimes, rounds: int = 8) -> tuple[int, list[list[Group]], list[float]]:
    """Move a group off the lane that ends last to another lane (never emptying it), or
    swap it for another lane's group, while the ends (longest first) improve."""
    k, lanes, ends = found
    phases = {g.key: times.phases(g, b.memory_bytes // k, b.cpus) for lane in lanes
              for g in lane}
    for _ in range(rounds):
        last = max(range(k), key=lambda i: ends[i])
        rank = sorted(ends, reverse=True)
        better: tuple[list[list[Group]], list[float]] | None = None
        for g, j in itertools.product(lanes[last], range(k)):
            if j == last:
                continue
            for h in [None, *lanes[j]]:
                if h is None and len(lanes[last]) == 1:
                    continue
                trial = [list(lane) for lane in lanes]
                if h is None:  # move g to the end of lane j
                    trial[last].remove(g)
                    trial[j].append(g)
                else:  # swap g and h, each taking the other's place
                    trial[last][trial[last].index(g)] = h
                    trial[j][trial[j].index(h)] = g
                new = _run(b, trial, phases)
                if sorted(new, reverse=True) < rank:
                    better = (trial, new)
                    break
            if better:
                break
        if better is None:
            break
        lanes, ends = better
    return k, lanes, ends
