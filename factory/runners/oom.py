"""Was a build attempt killed for memory, and how much did its compiles really use?

The runner calls these after each attempt; on True it asks ``planner.plan_after_oom`` for the
next plan and resumes in the same build directory (ninja skips finished objects). Three
independent signals, because each misses cases the others catch:

- docker's ``State.OOMKilled`` is set when any process in the container was OOM-killed;
- the cgroup's oom_kill counter (v2 ``memory.events``, v1 ``memory.oom_control``) rises even
  when the build survives a killed compiler and fails later for another reason;
- a compiler killed by SIGKILL shows in the build log ("died due to signal 9", exit 137),
  which is all a local runner without its own cgroup can see.

Memory for the model comes from anonymous memory (v2 ``memory.stat`` anon, v1 rss), not the
cgroup peak: page cache is counted in ``memory.peak`` / ``max_usage_in_bytes`` and reads as
the whole limit after installing a few GB of wheels (FIELD-NOTES s.8).
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_OOM_RETRIES = 3  # attempts after the first; the 4th OOM is an OOMError

# nvcc: "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"; gcc: "c++: fatal error:
# Killed signal terminated program cc1plus"; shells and ninja: "Killed", "exit status 137".
_KILLED = re.compile(
    r"died due to signal 9|Killed signal terminated program|\bsignal 9\b|exit status 137"
    r"|^Killed$",
    re.MULTILINE,
)


def _read_keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cgroup_oom_kills(cgroup_dir: Path) -> int:
    """OOM kills so far in this cgroup (v2 memory.events, else v1 memory.oom_control)."""
    v2 = _read_keyed(cgroup_dir / "memory.events")
    if "oom_kill" in v2:
        return v2["oom_kill"]
    return _read_keyed(cgroup_dir / "memory.oom_control").get("oom_kill", 0)


def cgroup_anon_bytes(cgroup_dir: Path) -> int | None:
    """Anonymous (non-cache) memory in use now: v2 memory.stat anon, v1 rss (+ rss_huge)."""
    stat = _read_keyed(cgroup_dir / "memory.stat")
    if "anon" in stat:
        return stat["anon"]
    if "rss" in stat:
        return stat["rss"] + stat.get("rss_huge", 0)
    return None


def log_shows_oom_kill(log_text: str) -> bool:
    return bool(_KILLED.search(log_text))


def was_oom_killed(*, exit_code: int | None, container_oom_killed: bool | None = None,
                   oom_kills_before: int = 0, oom_kills_after: int = 0,
                   log_text: str = "") -> bool:
    """True when any signal says the attempt lost a process to the OOM killer."""
    if container_oom_killed:
        return True
    if oom_kills_after > oom_kills_before:
        return True
    if exit_code in (137, -9):  # 128 + SIGKILL from a shell; -9 from subprocess
        return True
    return exit_code not in (0, None) and log_shows_oom_kill(log_text)
