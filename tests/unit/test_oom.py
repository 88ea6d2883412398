"""The one OOM verdict: each runner's signals (engine flag, cgroup counter, log, exit code)."""

from __future__ import annotations

import pytest

from factory.runners.oom import log_shows_oom_kill, was_oom_killed


@pytest.mark.parametrize("line", [
    "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
    "c++: fatal error: Killed signal terminated program cc1plus",
    "subprocess exited with exit status 137",
    "error: command 'pip' failed with exit code 137",
])
def test_compiler_kill_messages(line: str) -> None:
    assert log_shows_oom_kill(line)
    assert was_oom_killed(exit_code=1, own_cgroup=False, log_text=line)


def test_plain_compile_error_is_not_an_oom() -> None:
    text = "error: identifier \"foo\" is undefined\nninja: build stopped: subcommand failed."
    assert not log_shows_oom_kill(text)
    assert not was_oom_killed(exit_code=1, own_cgroup=False, log_text=text)


def test_a_kill_message_in_a_successful_build_is_not_an_oom() -> None:
    line = "c++: fatal error: Killed signal terminated program cc1plus"
    assert not was_oom_killed(exit_code=0, own_cgroup=False, log_text=line)


def test_each_signal_alone_is_enough() -> None:
    assert was_oom_killed(exit_code=1, own_cgroup=True, container_oom_killed=True)
    assert was_oom_killed(exit_code=1, own_cgroup=True, oom_kills=1)
    assert was_oom_killed(exit_code=137, own_cgroup=False)
    assert was_oom_killed(exit_code=-9, own_cgroup=False)


def test_a_cgroup_of_its_own_is_the_whole_truth() -> None:
    # A 137 (a timeout's SIGKILL) with no kill in the build's cgroup is no OOM.
    assert not was_oom_killed(exit_code=137, own_cgroup=True, oom_kills=0)
    assert not was_oom_killed(exit_code=-9, own_cgroup=True, oom_kills=None)
    assert not was_oom_killed(exit_code=137, own_cgroup=True, container_oom_killed=False)


def test_with_a_log_the_exit_code_alone_is_not_enough() -> None:
    # cibuildwheel's own exit code is not the compiler's: only the log says what was killed.
    assert not was_oom_killed(exit_code=137, own_cgroup=False, log_text="build failed")
