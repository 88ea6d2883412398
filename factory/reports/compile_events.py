"""The sampler's events as objects: when each object of the build started and ended.

The sampler (runners/inside/sampling.py) writes a line per compile process that starts or ends,
named by its ``-o``. Without a compile cache a process's -o is its object. Through sccache an
nvcc compile runs as stages in sccache's server, each with its -o in a temp dir of that one
compile (``/tmp/sccache_nvccXXXX/``): anonymous ones first (``x_0.cpp4.ii``), then the ones
named after the source (``<name>.ptx`` from cicc, ``<name>.cubin`` from ptxas), and last the
host compile with the object's real ``-o``. Counted by the -o alone, such an object would run
for its last few seconds only. Here it starts with its temp dir's first stage (known once a
stage names the source, matched to one object of the build by that name) and ends with its
object file.

An output compiled again after it ended (setup.py runs ninja once per extension into one build
dir: torch-scatter compiles 7 sources twice) is another object, ``<key>#<n>``, as the ninja
log is read (planning.ninja_log.read_entries).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from factory.planning.ninja_log import ObjectNames, object_key, repeat_key

OBJECT_SUFFIXES = (".o", ".obj")
# a stage sccache runs for one nvcc compile: its temp dir and its output's file name
CACHE_STAGE = re.compile(r"^(?P<dir>.*/sccache_nvcc[^/]+)/(?P<file>[^/]+)$")


class CompileEvents:
    """Folds events in as they come. ``objects``: the build's object keys (build.ninja), by
    which a cache stage's source name is matched to its object; more can be added later."""

    def __init__(self, objects: Iterable[str] = ()) -> None:
        self.running: dict[str, float] = {}  # object key -> when it started
        self.finished: dict[str, tuple[float, float]] = {}  # object key -> (start, end)
        self._names = ObjectNames(objects)
        self._stage_dirs: dict[str, float] = {}  # a cached compile's temp dir -> first stage
        self._compiles: dict[str, int] = {}  # an output's key -> its compiles started
        self._dir_labels: dict[str, str] = {}  # a cached compile's temp dir -> its object

    def know(self, objects: Iterable[str]) -> None:
        self._names.add(objects)

    def feed(self, event: Mapping[str, object]) -> None:
        at = event.get("t")
        if not isinstance(at, (int, float)):
            return
        if "start" in event:
            self._start(str(event["start"]), float(at))
        elif "end" in event:
            self._end(str(event["end"]), float(at))

    def _start(self, out: str, at: float) -> None:
        stage = CACHE_STAGE.match(out)
        if stage:
            first = self._stage_dirs.setdefault(stage["dir"], at)
            known = self._dir_labels.get(stage["dir"])
            if known is not None:  # a later stage of a compile already matched
                if known in self.running:
                    self.running[known] = min(first, self.running[known])
                return
            key = self._names.of(stage["file"])
            if key is not None:
                self._dir_labels[stage["dir"]] = self._started(key, first)
            return
        if out.endswith(OBJECT_SUFFIXES):
            self._started(object_key(out), at)

    def _started(self, key: str, at: float) -> str:
        """A compile of output ``key`` seen at ``at``: the one running, or the next; its
        label."""
        label = self._running_label(key)
        if label is None:
            self._compiles[key] = n = self._compiles.get(key, 0) + 1
            label = repeat_key(key, n)
        self.running[label] = min(at, self.running.get(label, at))
        return label

    def _running_label(self, key: str) -> str | None:
        n = self._compiles.get(key, 0)
        label = repeat_key(key, n)
        return label if n and label in self.running else None

    def _end(self, out: str, at: float) -> None:
        if not out.endswith(OBJECT_SUFFIXES) or CACHE_STAGE.match(out):
            return
        label = self._running_label(object_key(out))
        if label is not None:
            self.finished[label] = (self.running.pop(label), at)
