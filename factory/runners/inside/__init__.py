"""The part of a build that runs inside the build container (or under the local runner's cgroup).

Standard library only: it runs on whatever python3 the builder image has, before anything is
installed, and imports nothing of the factory. The runners ship it as one zip archive
(``factory.runners.base.write_inside_script``): ``python3 inside.pyz JOB.json``; the job file is
written by the runner.

One module per step: ``build`` (the run and its report), ``interpreter`` (venv and offline
requirements), ``cross`` (a cross build's target), ``toolkit`` and ``compilers`` (the factory's
nvcc and C++ wrappers in front of the real toolkit), ``cache`` (the compile cache),
``sampling`` (compiler memory and cgroup counters), ``steps`` (running and stopping a step),
``fault`` (fault injection for tests), ``log``.

When ``watch_stdin`` is set, end-of-file on stdin means the runner that started us is gone
(SIGKILL included: its end of the pipe or attach socket closes), and the build is killed at once,
so no compiler outlives the factory process.
"""
