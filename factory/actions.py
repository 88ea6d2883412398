"""What a run on GitHub Actions adds to plain lines: fold groups, error annotations and the job's
step summary (Markdown). Outside Actions every function here does nothing, or returns plain text.

The workflow commands are lines of their own (``::group::TITLE``, ``::endgroup::``,
``::error title=T::MESSAGE``) with GitHub's escapes; the summary is Markdown appended to the
file ``$GITHUB_STEP_SUMMARY`` names, under a lock, since several builds of one job may finish
at once.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from factory.environment import CI_GROUPS_ENV

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def on_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def groups_enabled() -> bool:
    return on_actions() and os.environ.get(CI_GROUPS_ENV, "1") != "0"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def group_start(title: str) -> str:
    return f"::group::{_escape_data(title)}"


def group_end() -> str:
    return "::endgroup::"


def error_annotation(message: str, *, title: str | None = None) -> str:
    """``::error title=T::MESSAGE``: shown on the run's page and the job's summary."""
    props = f" title={_escape_property(title)}" if title else ""
    return f"::error{props}::{_escape_data(message)}"


# -- Markdown ---------------------------------------------------------------------------------
def _cell_text(value: object) -> str:
    """A table cell: pipes escaped, line breaks as spaces (a row is one line)."""
    return " ".join(str(value).split()).replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   *, align: str = "") -> str:
    """A GitHub-flavoured Markdown table; ``align``: one letter per column, ``l`` or ``r``."""
    marks = [("---:" if a == "r" else "---") for a in align.ljust(len(headers), "l")]
    lines = ["| " + " | ".join(_cell_text(h) for h in headers) + " |",
             "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(_cell_text(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def append_summary(markdown: str, path: str | os.PathLike[str] | None = None) -> bool:
    """Append to the job's step summary (``$GITHUB_STEP_SUMMARY``); False when there is none."""
    target = path or os.environ.get(SUMMARY_ENV)
    if not target:
        return False
    with Path(target).open("a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # side-by-side builds append whole blocks
        try:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
            fh.write("\n")
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return True
