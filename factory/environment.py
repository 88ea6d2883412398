"""The FACTORY_* variables the factory reads, in one table (``factory --help`` lists it). One
precedence for every value they give: command line > environment > matrix.toml > default;
``factory.matrix.settings`` applies the ones that stand in for a ``[settings]`` key. The bottom
layer: every stage may read a name from here."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

MATRIX_ENV = "FACTORY_MATRIX"
STORE_ENV = "FACTORY_STORE"
HISTORY_ENV = "FACTORY_MEMORY_HISTORY"
INDEX_URL_ENV = "FACTORY_INDEX_URL"
S3_ENDPOINT_ENV = "FACTORY_S3_ENDPOINT_URL"
DEBUG_ENV = "FACTORY_DEBUG"
VERBOSE_ENV = "FACTORY_VERBOSE"
KEEP_CONTAINER_ENV = "FACTORY_KEEP_CONTAINER"
FACTS_ENV = "FACTORY_FACTS"
# "0": several builds share the job's console (nightly's slots run side by side), so their
# groups would interleave; each line still names its cell.
CI_GROUPS_ENV = "FACTORY_CI_GROUPS"


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    what: str  # one line for `factory --help`
    setting: str | None = None  # the [settings] key it stands in for


# Every variable the factory reads (the workflows and docs set these). An empty value counts as
# unset, so a workflow can pass an unset repository variable through.
ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(MATRIX_ENV, "the matrix file (--matrix; default ./matrix.toml)"),
    EnvVar(STORE_ENV, "the store of every --store (over settings.store)",
           setting="store"),
    EnvVar(HISTORY_ENV, "this builder's memory measurements (--history; settings.memory-history)",
           setting="memory-history"),
    EnvVar(INDEX_URL_ENV, "the index hosts install from (doctor --index, request --index-url)"),
    EnvVar(S3_ENDPOINT_ENV, "an S3-compatible endpoint for s3:// stores (unset: AWS)"),
    EnvVar(DEBUG_ENV, "1: show tracebacks (--debug)"),
    EnvVar(VERBOSE_ENV, "1: stream subprocess output (-v)"),
    EnvVar(KEEP_CONTAINER_ENV, "1: keep a build's container for inspection"),
    EnvVar(FACTS_ENV, "snapshot: resolve against the shipped snapshot of the indexes, not the "
           "work dir's cache"),
    EnvVar(CI_GROUPS_ENV, "0: no fold groups on GitHub Actions (builds sharing one console)"),
)


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, None when unset or empty."""
    value = (os.environ if environ is None else environ).get(name, "")
    return value or None
