"""Whole groups to builders (``assign``): longest first (by CPU work) to the builder whose
predicted end grows least, then an iterated local search of moves and swaps; where the groups
fall into few kinds, the exact best count of each kind per builder."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from factory.planning.builders import Builder
from factory.planning.cell_times import CellTimes
from factory.planning.groups import Group
from factory.planning.lanes import MAX_LANES, _lanes

EXACT_SPANS = 1000  # builder spans the exact search over kinds may simulate
SEARCH_SPANS = 4000  # builder spans the local search may simulate
# restarts of the local search from a perturbed best assignment: 60 left the 24-cell replay
# matrix 15.2 % over its bound once the flagship's rebuild was in the history (120: at it,
# in the same 0.4 s: the search's span budget bounds the time, not the kicks)
KICKS = 120


class _Spans:
    """A builder's predicted end for a multiset of group kinds (groups with the same phases
    everywhere are interchangeable), simulated once and remembered."""

    def __init__(self, groups: Sequence[Group], builders: Sequence[Builder],
                 times: CellTimes) -> None:
        self.builders = {b.name: b for b in builders}
        self.times = times
        lane_counts = range(1, min(len(groups), MAX_LANES) + 1)
        ids: dict[tuple[Any, ...], int] = {}
        self.kind: dict[tuple[str, ...], int] = {}
        for g in groups:
            sig = tuple((b.builds(g.platform), tuple(
                None if (p := times.phases(g, b.memory_bytes // k, b.cpus)) is None
                else tuple(p) for k in lane_counts)) for b in builders)
            self.kind[g.key] = ids.setdefault(sig, len(ids))
        self.simulated = 0
        self._memo: dict[tuple[str, tuple[int, ...]], float] = {}

    def key(self, groups: Iterable[Group]) -> tuple[int, ...]:
        return tuple(sorted(self.kind[g.key] for g in groups))

    def end(self, builder: str, groups: Sequence[Group]) -> float:
        """inf where the builder cannot run them all (platform or memory)."""
        b = self.builders[builder]
        if not groups:
            return 0.0
        if not all(b.builds(g.platform) for g in groups):
            return math.inf
        memo = (builder, self.key(groups))
        if memo not in self._memo:
            self.simulated += 1
            found = _lanes(b, groups, self.times)
            self._memo[memo] = math.inf if found is None else max(found[2])
        return self._memo[memo]


def _rank(ends: Mapping[str, float]) -> tuple[float, ...]:
    """Makespan first, then the next longest builders: a move that shortens the second
    longest builder is progress too (it frees room to shorten the longest next)."""
    return tuple(sorted(ends.values(), reverse=True))


def _greedy(groups: Sequence[Group], builders: Sequence[Builder], spans: _Spans
            ) -> tuple[dict[str, list[Group]], list[Group]]:
    """Longest group first (its most CPU work on any builder that takes it), each onto the
    builder where the makespan, then its own end, grows least."""
    given: dict[str, list[Group]] = {b.name: [] for b in builders}
    ends = {b.name: 0.0 for b in builders}
    unplaced: list[Group] = []

    def size(g: Group) -> float:
        works = [w for b in builders if b.builds(g.platform)
                 if (w := spans.times.work(g, b.memory_bytes, 1, machine_cpus=b.cpus))
                 is not None]
        return max(works, default=0.0)

    for g in sorted(groups, key=size, reverse=True):
        best: tuple[float, float, str] | None = None
        for b in builders:
            end = spans.end(b.name, given[b.name] + [g])
            if math.isinf(end):
                continue
            rank = (max(end, *ends.values()), end, b.name)
            if best is None or rank < best:
                best = rank
        if best is None:
            unplaced.append(g)
            continue
        given[best[2]].append(g)
        ends[best[2]] = best[1]
    return given, unplaced


def _local_search(given: dict[str, list[Group]], spans: _Spans, budget: int) -> None:
    """Move one group to another builder, or swap two groups of different kinds between two
    builders, whenever that lowers ``_rank`` (longest builders first); first improvement,
    until no move helps or ``budget`` spans were simulated."""
    ends = {n: spans.end(n, gs) for n, gs in given.items()}
    start = spans.simulated
    improved = True
    while improved and spans.simulated - start < budget:
        improved = False
        rank = _rank(ends)
        for worst in sorted(ends, key=lambda n: -ends[n]):
            for g, other in itertools.product(list(given[worst]), list(given)):
                if other == worst or g not in given[worst]:
                    continue
                back: list[Group | None] = [None, *given[other]]
                for h in back:
                    if h is not None and spans.kind[h.key] == spans.kind[g.key]:
                        continue
                    mine = [x for x in given[worst] if x is not g] + ([h] if h else [])
                    theirs = [x for x in given[other] if x is not h] + [g]
                    new = {**ends, worst: spans.end(worst, mine),
                           other: spans.end(other, theirs)}
                    if _rank(new) < rank:
                        given[worst], given[other] = mine, theirs
                        ends.update(new)
                        improved = True
                        break
                if improved or spans.simulated - start >= budget:
                    break
            if improved or spans.simulated - start >= budget:
                break


def _iterated_search(given: dict[str, list[Group]], spans: _Spans, budget: int,
                     kicks: int = KICKS) -> None:
    """``_local_search``, then from the best assignment so far: move two random groups (one
    off the builder that ends last) to random builders that build them and search again,
    keeping the result when it ranks better. A single move or swap cannot leave a state
    where every neighbour is longer (giving a builder one more group costs it a lane's
    memory share); two at once often can. Seeded: the same input gives the same schedule."""
    rng = random.Random(0)
    start = spans.simulated
    _local_search(given, spans, budget)

    def rank(a: Mapping[str, Sequence[Group]]) -> tuple[float, ...]:
        return _rank({n: spans.end(n, gs) for n, gs in a.items()})

    best, best_rank = {n: list(gs) for n, gs in given.items()}, rank(given)
    for _ in range(kicks if sum(map(len, given.values())) > 1 else 0):
        left = budget - (spans.simulated - start)
        if left <= 0:
            break
        trial = {n: list(gs) for n, gs in best.items()}
        for src in (max(trial, key=lambda n: spans.end(n, trial[n])),
                    rng.choice([n for n in trial if trial[n]])):
            if not trial[src]:
                continue
            g = rng.choice(trial[src])
            to = [n for n in trial if n != src and spans.builders[n].builds(g.platform)]
            if to:
                trial[src].remove(g)
                trial[rng.choice(to)].append(g)
        _local_search(trial, spans, left)
        if (r := rank(trial)) < best_rank:
            best, best_rank = trial, r
    given.update(best)


def _exact(groups: Sequence[Group], builders: Sequence[Builder], spans: _Spans,
           budget: int) -> dict[str, list[Group]] | None:
    """The best assignment of whole groups (each builder running its share as ``_lanes``
    packs it), by dynamic programming over builders and the number of groups of each kind
    left; None when that would simulate more than ``budget`` builder spans."""
    pools: dict[int, list[Group]] = {}
    for g in groups:
        pools.setdefault(spans.kind[g.key], []).append(g)
    kinds = sorted(pools)
    if len(builders) * math.prod(len(pools[k]) + 1 for k in kinds) > budget:
        return None
    memo: dict[tuple[int, tuple[int, ...]], tuple[float, tuple[tuple[int, ...], ...]]] = {}

    def chosen(take: tuple[int, ...], left: tuple[int, ...]) -> list[Group]:
        return [g for k, t, n in zip(kinds, take, left, strict=True)
                for g in pools[k][len(pools[k]) - n:][:t]]

    def best(i: int, left: tuple[int, ...]) -> tuple[float, tuple[tuple[int, ...], ...]]:
        if i == len(builders):
            return (0.0 if not any(left) else math.inf), ()
        if (i, left) not in memo:
            found: tuple[float, tuple[tuple[int, ...], ...]] = (math.inf, ())
            for take in itertools.product(*(range(n + 1) for n in left)):
                here = spans.end(builders[i].name, [
                    g for k, t in zip(kinds, take, strict=True) for g in pools[k][:t]])
                if here >= found[0]:
                    continue
                rest, plan = best(i + 1, tuple(n - t for n, t in zip(left, take, strict=True)))
                if max(here, rest) < found[0]:
                    found = (max(here, rest), (take, *plan))
            memo[(i, left)] = found
        return memo[(i, left)]

    span, plan = best(0, tuple(len(pools[k]) for k in kinds))
    if math.isinf(span):
        return None
    given: dict[str, list[Group]] = {}
    left = tuple(len(pools[k]) for k in kinds)
    for b, take in zip(builders, plan, strict=True):
        given[b.name] = chosen(take, left)
        left = tuple(n - t for n, t in zip(left, take, strict=True))
    return given


def assign(groups: Sequence[Group], builders: Sequence[Builder], times: CellTimes, *,
           exact_spans: int = EXACT_SPANS, search_spans: int = SEARCH_SPANS
           ) -> tuple[dict[str, list[Group]], list[Group]]:
    """Whole groups to builders: longest first to the builder whose end grows least, then
    moves and swaps while they shorten the longest builders; where the groups fall into few
    kinds, also the exact best over how many groups of each kind each builder gets. The
    better of the two (by ``_rank``). Returns (groups per builder, groups none can take)."""
    spans = _Spans(groups, builders, times)
    given, unplaced = _greedy(groups, builders, spans)
    _iterated_search(given, spans, search_spans)
    out = {g.key for g in unplaced}
    placed = [g for g in groups if g.key not in out]
    exact = _exact(placed, builders, spans, exact_spans) if exact_spans else None
    if exact is not None and _rank({n: spans.end(n, gs) for n, gs in exact.items()}) < _rank(
            {n: spans.end(n, gs) for n, gs in given.items()}):
        given = exact
    return given, unplaced
