"""OOM detection signals and the compile-memory reading the runner feeds the planner."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.runners.oom import cgroup_anon_bytes, cgroup_oom_kills, log_shows_oom_kill, was_oom_killed


def test_v2_oom_kill_counter(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    assert cgroup_oom_kills(tmp_path) == 2


def test_v1_oom_kill_counter(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cgroup_oom_kills(tmp_path) == 3


def test_no_counter_reads_zero(tmp_path: Path) -> None:
    assert cgroup_oom_kills(tmp_path) == 0


def test_anon_memory_not_page_cache(tmp_path: Path) -> None:
    (tmp_path / "memory.stat").write_text("anon 3000\nfile 8000000\nkernel 10\n")
    assert cgroup_anon_bytes(tmp_path) == 3000
    (tmp_path / "memory.stat").write_text("cache 8000000\nrss 2000\nrss_huge 500\n")
    assert cgroup_anon_bytes(tmp_path) == 2500
    (tmp_path / "memory.stat").unlink()
    assert cgroup_anon_bytes(tmp_path) is None


@pytest.mark.parametrize("line", [
    "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
    "c++: fatal error: Killed signal terminated program cc1plus",
    "ninja: build stopped: subcommand failed.\nKilled",
    "subprocess exited with exit status 137",
])
def test_compiler_kill_messages(line: str) -> None:
    assert log_shows_oom_kill(line)
    assert was_oom_killed(exit_code=1, log_text=line)


def test_plain_compile_error_is_not_an_oom() -> None:
    text = "error: identifier \"foo\" is undefined\nninja: build stopped: subcommand failed."
    assert not log_shows_oom_kill(text)
    assert not was_oom_killed(exit_code=1, log_text=text)


def test_each_signal_alone_is_enough() -> None:
    assert was_oom_killed(exit_code=1, container_oom_killed=True)
    assert was_oom_killed(exit_code=1, oom_kills_before=1, oom_kills_after=2)
    assert was_oom_killed(exit_code=137)
    assert not was_oom_killed(exit_code=0, oom_kills_before=2, oom_kills_after=2)
