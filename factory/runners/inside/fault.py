"""Fault injection for tests: a real OOM kill in the middle of a real build."""

from __future__ import annotations

import subprocess
import sys

from .log import Log
from .sampling import Sampler, descendants, is_compiler, proc_table


class OomFault:
    """Fault injection for tests (FACTORY_FAULT_OOM_AFTER=N in the build's env): once N
    objects are done, make the running compilers the OOM killer's first choice and fill
    memory until the cgroup kills them: a real OOM kill in the middle of a real build, so a
    test can check that the retry keeps the finished objects."""

    def __init__(self, after: int, sampler: Sampler, log: Log) -> None:
        self.after = after
        self.sampler = sampler
        self.log = log
        self.fired = False
        self.hog: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_env(cls, env: dict[str, str], sampler: Sampler, log: Log) -> OomFault | None:
        value = env.pop("FACTORY_FAULT_OOM_AFTER", None)
        return cls(int(value), sampler, log) if value else None

    def maybe_fire(self, built: int) -> None:
        if self.fired or built < self.after:
            return
        self.fired = True
        table = proc_table()
        victims = [p for p in descendants(table, self.sampler.roots)
                   if is_compiler(table[p][1])]
        for pid in victims:
            try:
                with open(f"/proc/{pid}/oom_score_adj", "w") as fh:
                    fh.write("1000")
            except OSError:
                pass
        self.log.line(f"factory: fault injection: OOM after {built} object(s), "
                      f"{len(victims)} compiler process(es) marked")
        # touched pages (b"x" * n), not calloc'd ones, so the cgroup really fills up
        self.hog = subprocess.Popen(
            [sys.executable, "-c",
             "import time\nb = []\nwhile True:\n"
             "    b.append(b'x' * (32 << 20))\n    time.sleep(0.01)"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.hog is not None and self.hog.poll() is None:
            self.hog.kill()
            self.hog.wait()

