"""Lower bounds on a schedule's makespan: ``lower_bound`` (fluid: work over all CPUs) and
``group_bound`` (whole groups on memory-capped builders; the proof is in its docstring)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

from factory.planning.builders import Builder
from factory.planning.cell_times import CellTimes, Phase, shared_span
from factory.planning.groups import Group
from factory.planning.lanes import MAX_LANES


def lower_bound(groups: Sequence[Group], builders: Sequence[Builder],
                times: CellTimes) -> float:
    """The fluid bound, for every policy (not only whole groups): max(all groups' CPU work /
    all CPUs, the longest single cell alone on the builder where it is fastest). CPU work: the
    group's phases at one CPU (the cache effect and the overheads included: a policy that
    splits a group only adds work); nothing a schedule does shrinks it. Loose: it lets work
    flow over every builder's CPUs, and ignores that memory limits how many compilers a
    builder runs at once; ``group_bound`` is the one for the factory's family of policies
    (whole groups in lanes). Both are bounds of the cell model, not of real builds."""
    work = 0.0
    longest = 0.0
    for g in groups:
        fits = [b for b in builders if b.builds(g.platform)]
        # a group's first cell (compile + overhead) is its longest: the others are cached
        alone = [shared_span(b.cpus, [p[:2]])[0] for b in fits
                 if (p := times.phases(g, b.memory_bytes, b.cpus)) is not None]
        if not alone:
            continue
        longest = max(longest, min(alone))
        # at one CPU of the builder: its least contention, its machine's speed
        one = [w for b in fits
               if (w := times.work(g, b.memory_bytes, 1, machine_cpus=b.cpus)) is not None]
        work += min(one) if one else 0.0
    return max(work / max(1, sum(b.cpus for b in builders)), longest)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """A group at one lane share of one builder, as the bound sees it."""

    work: float  # CPU-seconds of all its phases
    chain: float  # its time alone: every phase at min(cap, CPUs), one after another
    rate: float  # the most CPUs it uses at once: its largest phase cap, at most the CPUs

    @staticmethod
    def of(phases: Sequence[Phase], cpus: int) -> Profile:
        caps = [max(1e-9, min(p.cap, float(cpus))) for p in phases]
        return Profile(work=sum(p.work for p in phases),
                       chain=sum(p.work / c for p, c in zip(phases, caps, strict=True)),
                       rate=max(caps))


# A kind: per builder None (does not build it) or per lane count k (1..) its Profile, None
# where the planner refuses it at memory / k. Groups of one kind are interchangeable.
Kind = tuple[tuple[Profile | None, ...] | None, ...]
BOUND_TRANSITIONS = 2_000_000  # the exact search's size before kinds are merged


def _merge(a: Kind, b: Kind) -> Kind:
    """A kind no costlier than either: allowed where either is, the smaller work and chain,
    the larger rate."""
    def one(x: Profile | None, y: Profile | None) -> Profile | None:
        if x is None or y is None:
            return x or y
        return Profile(work=min(x.work, y.work), chain=min(x.chain, y.chain),
                       rate=max(x.rate, y.rate))

    return tuple(pa or pb if pa is None or pb is None
                 else tuple(one(x, y) for x, y in zip(pa, pb, strict=True))
                 for pa, pb in zip(a, b, strict=True))


def _size(kind: Kind) -> float:
    return max((p.work for per in kind if per for p in per if p), default=0.0)


def _builder_bound(per_kind: Sequence[tuple[Profile | None, ...] | None],
                   counts: Sequence[int], cpus: int) -> float:
    """No way of running ``counts`` groups of each kind on one builder ends sooner (see
    ``group_bound``); inf when no lane count fits them all."""
    n = sum(counts)
    if n == 0:
        return 0.0
    best = math.inf
    for k in range(1, min(n, MAX_LANES) + 1):
        profs: list[tuple[Profile, int]] = []
        for per, c in zip(per_kind, counts, strict=True):
            p = per[k - 1] if c and per else None
            if c and p is None:
                break  # the planner refuses one of them at memory / k
            if p is not None:
                profs.append((p, c))
        else:
            best = min(best, _lanes_bound(profs, n, k, cpus))
    return best


def _lanes_bound(profs: Sequence[tuple[Profile, int]], n: int, k: int, cpus: int) -> float:
    """(a) to (d) of ``group_bound`` for ``n`` groups (count per profile) in k lanes."""
    work = sum(p.work * c for p, c in profs)
    rate = min(float(cpus), k * max(p.rate for p, _ in profs))
    chains = sorted((p.chain, c) for p, c in profs)
    need, queue = math.ceil(n / k), 0.0
    for chain, c in chains:
        take = min(c, need)
        queue += take * chain
        need -= take
        if not need:
            break
    lanes = sum(chain * c for chain, c in chains) / k
    return max(work / rate, chains[-1][0], queue, lanes)


def group_bound(groups: Sequence[Group], builders: Sequence[Builder], times: CellTimes,
                *, transitions: int = BOUND_TRANSITIONS) -> float:
    """A lower bound on the makespan of every schedule the factory's model allows.

    The model (what ``schedule`` chooses among): each group whole on one builder that builds
    its platform; a builder runs its groups in k lanes, 1 <= k <= min(its groups, MAX_LANES),
    each lane's cells planned at memory // k and all the CPUs, a lane's groups one after
    another, the lanes side by side as ``shared_span`` runs them. For a builder b with the
    set S in k lanes, every phase (``CellTimes.phases`` at memory // k) runs at most at its
    cap and all of them together at most on the CPUs. So:

    (a) no lane runs faster than the largest cap r among S's phases and at most k lanes run,
        so the builder does at most min(CPUs, k r) CPU-seconds per second, and all of S's
        work W must be done: span >= W / min(CPUs, k r). Where memory binds (few jobs per
        lane) this is well above W / CPUs;
    (b) a group's phases run one after another, each at most at min(cap, CPUs): span >= the
        longest such chain in S;
    (c) k lanes hold |S| groups, so one lane holds at least ceil(|S| / k) of them in
        sequence: span >= the sum of the ceil(|S| / k) shortest chains in S;
    (d) a lane takes at least the sum of its groups' chains, so the k lanes together take
        at least the sum of all chains in S and the longest at least 1 / k of it: span >=
        sum of chains / k. Where memory caps a group's jobs its chain is long, and this is
        well above (a), which lets another lane use the CPUs it leaves.

    span(b, S) >= LB(b, S) = min over the k b could choose of max(a, b, c, d), and the makespan
    of any schedule >= max over builders of LB(b, S_b) >= the minimum of that over every
    assignment of whole groups to builders. That minimum is computed exactly, by dynamic
    programming over builders and the number of groups of each kind (groups with the same
    profile everywhere are interchangeable) left to place. Where that search would exceed
    ``transitions``, the two most alike kinds are merged into one no costlier than either
    (the smaller work and chain, the larger rate, allowed wherever either is); LB only
    shrinks, and every assignment of the real groups is one of the merged problem, so the
    result is still a bound, only a looser one. Groups that no builder takes are left out,
    as ``schedule`` leaves them unplaced.

    It is a bound of the model, not of real builds: the cache effect, the planner's jobs per
    memory share and the overheads are the model's figures."""
    lane_counts = range(1, min(len(groups), MAX_LANES) + 1)
    kinds: dict[Kind, int] = {}
    for g in groups:
        kind: Kind = tuple(
            tuple(None if (p := times.phases(g, b.memory_bytes // k, b.cpus)) is None
                  else Profile.of(p, b.cpus) for k in lane_counts)
            if b.builds(g.platform) else None for b in builders)
        if any(per and any(per) for per in kind):
            kinds[kind] = kinds.get(kind, 0) + 1
    pool = sorted(kinds.items(), key=lambda kv: _size(kv[0]))

    def cost(pool: Sequence[tuple[Kind, int]]) -> int:
        return len(builders) * math.prod((n + 1) * (n + 2) // 2 for _, n in pool)

    while len(pool) > 1 and cost(pool) > transitions:
        i = min(range(len(pool) - 1),
                key=lambda i: _size(pool[i + 1][0]) / max(1e-9, _size(pool[i][0])))
        (a, na), (b, nb) = pool[i], pool[i + 1]
        pool[i:i + 2] = [(_merge(a, b), na + nb)]
    shapes = [k for k, _ in pool]
    memo: dict[tuple[int, tuple[int, ...]], float] = {}
    alone: dict[tuple[int, tuple[int, ...]], float] = {}  # one builder's bound for a take

    def best(i: int, left: tuple[int, ...]) -> float:
        if i == len(builders):
            return 0.0 if not any(left) else math.inf
        if (i, left) in memo:
            return memo[(i, left)]
        per_kind = [k[i] for k in shapes]
        ranges = [range(n + 1) if per is not None else range(1)
                  for n, per in zip(left, per_kind, strict=True)]
        found = math.inf
        for take in itertools.product(*ranges):
            if (i, take) not in alone:
                alone[(i, take)] = _builder_bound(per_kind, take, builders[i].cpus)
            here = alone[(i, take)]
            if here >= found:
                continue
            rest = best(i + 1, tuple(n - t for n, t in zip(left, take, strict=True)))
            found = min(found, max(here, rest))
        memo[(i, left)] = found
        return found

    found = best(0, tuple(n for _, n in pool))
    return max(found if math.isfinite(found) else 0.0, _rate_bound(kinds, builders))


def _rate_bound(kinds: Mapping[Kind, int], builders: Sequence[Builder]) -> float:
    """(a) over all builders at once, for when the exact search had to merge kinds: builder
    b never does more than max over k of min(CPUs, k x the largest cap at memory // k)
    CPU-seconds per second, and each group does at least its least work anywhere; no group
    ends before its shortest chain anywhere."""
    rate = 0.0
    for i, b in enumerate(builders):
        caps: dict[int, float] = {}  # lane count: the largest cap of any kind there
        for kind in kinds:
            for k, p in enumerate(kind[i] or (), start=1):
                if p is not None:
                    caps[k] = max(caps.get(k, 0.0), p.rate)
        rate += max((min(float(b.cpus), k * r) for k, r in caps.items()), default=0.0)
    work = chain = 0.0
    for kind, n in kinds.items():
        profs = [p for per in kind if per for p in per if p is not None]
        work += n * min(p.work for p in profs)
        chain = max(chain, min(p.chain for p in profs))
    return max(work / rate if rate else 0.0, chain)
