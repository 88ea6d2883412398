"""Was a build attempt killed for memory? The one verdict every runner gives its result.

On True the build asks ``planner.plan_after_oom`` for the next plan and resumes in the same
build directory (ninja skips finished objects). Each runner passes the signals it can see:

- docker's ``State.OOMKilled``: set when any process in the container was OOM-killed;
- the build cgroup's oom_kill counter (``cgroup.oom_kills``): it rises even when the build
  survives a killed compiler and fails later for another reason;
- the build log (cibuildwheel, which removes its container before we could look): the compiler
  driver's "Killed signal terminated program", "signal 9", exit status 137;
- the exit code alone (137, or -9 from subprocess), when the runner sees nothing else: the
  local runner without a cgroup of its own.

A runner with a cgroup of its own trusts its counter: a 137 without a kill there is a timeout or
someone's SIGKILL, not the OOM killer.
"""

from __future__ import annotations

import re

# nvcc: "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"; gcc: "c++: fatal error:
# Killed signal terminated program cc1plus"; shells and pip: "exit status 137", "exit code 137".
_KILLED = re.compile(r"Killed signal terminated program|exit (?:code|status) 137|signal 9")


def log_shows_oom_kill(log_text: str) -> bool:
    return bool(_KILLED.search(log_text))


def was_oom_killed(
    *,
    exit_code: int | None,
    own_cgroup: bool,
    container_oom_killed: bool = False,
    oom_kills: int | None = None,
    log_text: str | None = None,
) -> bool:
    """True when a signal the runner sees says the attempt lost a process to the OOM killer.

    ``own_cgroup``: the build ran in a cgroup of its own (docker's container, the local
    runner's cap), whose ``oom_kills`` counter is then the whole truth.
    """
    if container_oom_killed or oom_kills:
        return True
    if own_cgroup:
        return False
    if log_text is not None:
        return exit_code != 0 and log_shows_oom_kill(log_text)
    return exit_code in (137, -9)  # 128 + SIGKILL from a shell; -9 from subprocess
