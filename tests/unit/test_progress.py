"""A build's progress line from the files the build writes: the sampler's events (objects that
start and end), ninja's [N/M] in the log, build.ninja's order and an earlier attempt's
.ninja_log (factory.build.progress)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from factory.build.progress import BuildProgress, build_ninja_order
from factory.logger import Log
from factory.planning.eta import EtaModel
from factory.units import format_duration as duration

T0 = 1_800_000_000.0
OBJ = "/factory/src/build/temp.linux-x86_64-cpython-311/csrc/{}.o"


def write_events(path: Path, *events: dict[str, object]) -> None:
    with path.open("a") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


@pytest.fixture
def build(tmp_path: Path) -> dict[str, Path]:
    tree = tmp_path / "src"
    temp = tree / "build" / "temp.linux-x86_64-cpython-311"
    temp.mkdir(parents=True)
    out = "/factory/src/build/temp.linux-x86_64-cpython-311/csrc"
    (temp / "build.ninja").write_text(
        "rule compile\n  command = c++ $in\n"
        f"build {out}/b.o: compile /src/csrc/b.cpp\n"
        f"build {out}/a.o: cuda_compile /src/csrc/a.cu\n"
        f"build {out}/c.o: compile /src/csrc/c.cpp\n")
    log = tmp_path / "attempt-1.log"
    log.write_text("+ pip wheel\n")
    return {"tree": tree, "log": log, "events": tmp_path / "attempt-1.log.events.jsonl"}


def progress(build: dict[str, Path], model: EtaModel | None, out: io.StringIO) -> BuildProgress:
    return BuildProgress(log_path=build["log"], events_path=build["events"], log=Log(stream=out),
                         label="ext", model=model, tree=build["tree"], jobs=2)


def test_duration() -> None:
    assert [duration(s) for s in (0, 42.4, 342, 5400)] == ["0s", "42s", "5m42s", "1h30m"]


def test_build_ninja_order_is_read_from_the_tree(build: dict[str, Path]) -> None:
    assert build_ninja_order(build["tree"]) == ["csrc/b", "csrc/a", "csrc/c"]


def test_running_objects_show_before_ninja_prints_anything(build: dict[str, Path]) -> None:
    model = EtaModel({"csrc/a": 100.0, "csrc/b": 50.0, "csrc/c": 50.0}, jobs=2)
    p = progress(build, model, io.StringIO())
    assert p.render() == "ext: 0/3 objects, 0 compiling, ETA 1m40s (planned)"
    write_events(build["events"], {"t": T0, "start": OBJ.format("b")},
                 {"t": T0, "start": OBJ.format("a")}, {"t": T0, "rss": 1, "jobs": 2})
    p.poll()
    assert p.model is not None and p.model.order == ["csrc/b", "csrc/a", "csrc/c"]
    eta = p.estimate(T0 + 20)
    assert eta is not None and eta.running == 2 and eta.done == 0
    # b ends at 50, c starts then and ends at 100, a ends at 100: 80 s left
    assert eta.remaining == pytest.approx(80.0)
    write_events(build["events"], {"t": T0 + 40, "end": OBJ.format("b"), "peak": 5})
    append(build["log"], "[1/3] c++ csrc/b.cpp\n")
    p.poll()
    eta = p.estimate(T0 + 40)
    assert eta is not None and eta.done == 1 and p.finished == {"csrc/b": 40.0}
    assert eta.speed < 1.0  # b took 40 s of its 50


def test_an_earlier_attempts_objects_count_as_done(build: dict[str, Path]) -> None:
    temp = build["tree"] / "build" / "temp.linux-x86_64-cpython-311"
    (temp / ".ninja_log").write_text(
        "# ninja log v5\n0\t50000\t0\t/x/build/temp.linux-x86_64-cpython-311/csrc/b.o\t1\n")
    model = EtaModel({"csrc/a": 100.0, "csrc/b": 50.0, "csrc/c": 50.0}, jobs=2)
    p = progress(build, model, io.StringIO())
    append(build["log"], "[1/2] nvcc csrc/a.cu\n")  # ninja counts this attempt's objects
    p.poll()
    eta = p.estimate(T0)
    assert eta is not None and eta.done == 2 and eta.total == 3


def test_without_predictions_the_measured_objects_stand_in(build: dict[str, Path]) -> None:
    out = io.StringIO()
    p = progress(build, None, out)
    assert p.render() is not None and "preparing the build" in (p.render() or "")
    write_events(build["events"], {"t": T0, "start": OBJ.format("a")},
                 {"t": T0 + 20, "start": OBJ.format("b")},
                 {"t": T0 + 30, "end": OBJ.format("a")},
                 {"t": T0 + 30, "start": "/factory/src/build/lib/ext.so"})  # the link: no object
    append(build["log"], "[1/4] nvcc a\n")
    p.poll()
    assert set(p.started) == {"csrc/b"}
    eta = p.estimate(T0 + 40)
    assert eta is not None and eta.total == 4 and eta.done == 1
    # b has 10 of its 30 s left; two more objects at the mean (30 s) on 2 slots
    assert eta.remaining == pytest.approx(40.0)


def test_ninja_runs_of_several_extensions_add_up(build: dict[str, Path]) -> None:
    # torch-scatter's setup.py runs ninja once per extension, each counting from 1: the log of
    # its GPU build says [1/3] [2/3] [3/3] [1/2] [2/2] ... (17 objects in 8 runs).
    p = progress(build, None, io.StringIO())
    append(build["log"], "[1/3] a\n[2/3] b\n[3/3] c\n[1/2] d\n")
    p.poll()
    assert (p.ninja_done, p.ninja_total) == (4, 5)
    append(build["log"], "[2/2] e\n[1/1] f\n")
    p.poll()
    assert (p.ninja_done, p.ninja_total) == (6, 6)


def test_recent_objects_weigh_more_in_the_speed(build: dict[str, Path]) -> None:
    # Two objects took 4x their prediction early on, the two after them 1x: the speed follows
    # the recent ones (a load that eased off) instead of averaging all four.
    model = EtaModel({f"csrc/o{i}": 100.0 for i in range(8)}, jobs=1)
    p = progress(build, model, io.StringIO())
    times = [(0, 400), (400, 800), (800, 900), (900, 1000)]
    for i, (a, b) in enumerate(times):
        out = OBJ.format(f"o{i}")
        write_events(build["events"], {"t": T0 + a, "start": out}, {"t": T0 + b, "end": out})
    p.poll()
    eta = p.estimate(T0 + 1000)
    assert eta is not None
    alike = model.estimate(finished=p.finished, running={})  # every object counted alike
    assert alike.speed > 2.0 and eta.speed < 1.6
    assert eta.remaining == pytest.approx(4 * 100 * eta.speed)


def test_a_terminal_gets_a_bar(build: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    model = EtaModel({"csrc/a": 100.0, "csrc/b": 50.0, "csrc/c": 50.0}, jobs=2)
    p = progress(build, model, Tty())
    append(build["log"], "[1/3] c++ b\n")
    line = p.render()
    assert line is not None and line.startswith("ext [") and "1/3 objects" in line


def test_the_sampler_writes_each_compile_jobs_start_and_end(tmp_path: Path) -> None:
    """Real processes: an 'nvcc' and a 'g++-12' job (scripts so named: the kernel names the
    process after the script) one after the other under a shell; the events name each by its
    -o."""
    import subprocess
    import time

    from factory.runners.inside import sampling as inside  # the container's script's sampler

    for name in ("nvcc", "g++-12"):  # a versioned driver: what the glibc sysroot runs
        script = tmp_path / name
        script.write_text("#!/bin/sh\nsleep 1.2\n")
        script.chmod(0o755)
    events = tmp_path / "build.log.events.jsonl"
    shell = subprocess.Popen(["/bin/sh", "-c", f"{tmp_path}/nvcc -c a.cu -o /b/t/a.o; "
                              f"{tmp_path}/g++-12 -c b.cpp -o /b/t/b.o"])
    sampler = inside.Sampler({shell.pid}, None, 0.1, events=str(events))
    sampler.start()
    shell.wait()
    time.sleep(0.3)
    sampler.stop()
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    objects = [(next(k for k in ("start", "end") if k in e), e.get("start") or e.get("end"))
               for e in lines if "start" in e or "end" in e]
    assert objects == [("start", "/b/t/a.o"), ("end", "/b/t/a.o"),
                       ("start", "/b/t/b.o"), ("end", "/b/t/b.o")]
    assert any("rss" in e and e["jobs"] == 1 for e in lines)
    assert all(e["t"] > 1e9 for e in lines)  # wall-clock times: the host reads them


def test_a_long_command_shows_what_it_fetches_and_how_far(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """pip's raw progress lines become the progress line's bytes, and stay out of the log; the
    watched directory's growth is shown."""
    import sys

    from factory.logger import configure
    from factory.process import CommandProgress, run_command

    shown = CommandProgress("pip download", tmp_path)
    assert shown.line("Collecting torch==2.14.1") is False
    wheel = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert not shown.line(f"  Downloading {wheel} (905.6 MB)")
    assert shown.line("Progress 524288000 of 949600000")
    (tmp_path / "done.whl").write_bytes(b"x" * 2048)
    line = shown.render()
    assert line.startswith("pip download: 0s, 2.0 KiB written, ")
    assert line.endswith(f"{wheel} 500.0 MiB of 905.6 MiB")

    configure()
    script = ("print('Downloading a.whl (1 kB)'); print('Pro' + 'gress 10 of 20'); "
              "print('Saved ./a.whl')")
    log = tmp_path / "pip.log"
    run_command([sys.executable, "-c", script], log_path=log, what="pip download",
                progress=True, watch=tmp_path)
    assert "Progress" not in log.read_text() and "Saved ./a.whl" in log.read_text()
    err = capsys.readouterr().err
    assert "pip download: " in err  # the last progress line, once it ended


def test_an_image_step_shows_its_time_and_the_containers_last_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from factory.logger import configure
    from factory.toolchain.images import image_progress

    class Container:
        def logs(self, tail: int) -> bytes:
            assert tail == 1
            return b"gcc -c Objects/longobject.c\n"

    configure()
    with image_progress("building CPython 3.13", Container()):
        pass
    err = capsys.readouterr().err
    assert "building CPython 3.13: 0s, gcc -c Objects/longobject.c" in err


def cached_compile(temp: str, name: str, at: float) -> list[dict[str, object]]:
    """One nvcc compile through sccache (--cache), in the shape a real flash-attn build's
    events have: the server runs nvcc's stages, each with its -o in the compile's temp dir
    (two anonymous ones, then cicc's .ptx and ptxas's .cubin named after the source); only the
    last, the host compile, has the object's -o. 133 s in all, the last stage 5 s of it."""
    d = f"/tmp/sccache_nvcc{temp}"
    return [{"t": at, "start": f"{d}/x_0.cpp4.ii"}, {"t": at + 0.5, "end": f"{d}/x_0.cpp4.ii"},
            {"t": at + 1, "start": f"{d}/x_0.cpp1.ii"}, {"t": at + 2, "end": f"{d}/x_0.cpp1.ii"},
            {"t": at + 2, "start": f"{d}/{name}.ptx"}, {"t": at + 85, "end": f"{d}/{name}.ptx"},
            {"t": at + 85, "start": f"{d}/{name}.cubin"},
            {"t": at + 128, "end": f"{d}/{name}.cubin"},
            {"t": at + 128, "start": OBJ.format(name)}, {"t": at + 133, "end": OBJ.format(name)}]


def test_an_object_compiled_through_the_cache_runs_from_its_first_stage(
    build: dict[str, Path],
) -> None:
    model = EtaModel({"csrc/a": 100.0, "csrc/b": 50.0, "csrc/c": 50.0}, jobs=2)
    p = progress(build, model, io.StringIO())
    stages = cached_compile("ZfDC3K", "a", T0)
    write_events(build["events"], *stages[:5])  # up to cicc's start
    p.poll()
    assert p.running(T0 + 30) == {"csrc/a": 30.0}
    eta = p.estimate(T0 + 30)
    assert eta is not None and eta.running == 1
    write_events(build["events"], *stages[5:])
    p.poll()
    assert p.finished == {"csrc/a": 133.0} and p.started == {}
    assert "ext: 1/3 objects, 0 compiling, " in (p.render() or "")


def test_without_predictions_nothing_is_guessed_before_the_first_object_ends(
    build: dict[str, Path],
) -> None:
    p = progress(build, None, io.StringIO())
    write_events(build["events"], {"t": T0, "start": OBJ.format("a")})
    append(build["log"], "")
    assert p.estimate(T0 + 5) is None
    assert (p.render() or "").endswith(", ETA after the first object")


def test_an_output_compiled_again_by_a_later_ninja_run_is_another_object(
    build: dict[str, Path],
) -> None:
    # torch-scatter compiles csrc/a.o for its CUDA extension, then again for its CPU one: the
    # second compile is "csrc/a#2", as the ninja log is read, plain or through the cache
    model = EtaModel({"csrc/a": 100.0, "csrc/a#2": 60.0, "csrc/b": 50.0}, jobs=2,
                     stages={"csrc/a#2": 1})
    p = progress(build, model, io.StringIO())
    write_events(build["events"], {"t": T0, "start": OBJ.format("a")},
                 {"t": T0 + 100, "end": OBJ.format("a")},
                 {"t": T0 + 101, "start": OBJ.format("a")})
    p.poll()
    assert p.finished == {"csrc/a": 100.0} and p.running(T0 + 111) == {"csrc/a#2": 10.0}
    write_events(build["events"], {"t": T0 + 150, "end": OBJ.format("a")},
                 *cached_compile("Q1", "a", T0 + 200))
    p.poll()
    assert p.finished == {"csrc/a": 100.0, "csrc/a#2": 49.0, "csrc/a#3": 133.0}
    assert p.started == {}


def test_the_sampler_counts_the_cgroups_cpu_time_while_compilers_run(tmp_path: Path) -> None:
    """The cgroup's CPU time from the first sample that saw a compiler to the last: a cgroup
    v2 cpu.stat read before, during and after a real 'nvcc' process (a script so named)."""
    import subprocess
    import time

    from factory.runners.inside import sampling as inside

    script = tmp_path / "nvcc"
    script.write_text("#!/bin/sh\nsleep 1.0\n")
    script.chmod(0o755)
    group = tmp_path / "cg"
    group.mkdir()
    (group / "memory.stat").write_text("anon 1000\n")
    reads = iter(range(1, 1000))

    class Cgroup(inside.CgroupReader):
        def __init__(self) -> None:
            self.version, self.path = 2, group

        def cpu_seconds(self) -> float | None:
            # each read: 2 s more CPU time than the one before
            (group / "cpu.stat").write_text(f"usage_usec {2_000_000 * next(reads)}\n")
            return super().cpu_seconds()

    cg = Cgroup()
    assert cg.cpu_seconds() == 2.0
    sampler = inside.Sampler(set(), cg, 0.1)
    sampler.sample()  # nothing compiling yet: not counted
    assert sampler.compile_cpu_seconds is None
    shell = subprocess.Popen(["/bin/sh", "-c", f"{script} -c a.cu -o /b/t/a.o"])
    sampler.roots.add(shell.pid)
    time.sleep(0.3)
    sampler.sample()
    sampler.sample()
    shell.wait()
    sampler.sample()  # the compiler is gone: not counted
    assert sampler.compile_cpu_seconds == 2.0  # the two reads while it ran, 2 s apart
