"""The shipped snapshot: the facts read from a directory of recorded index responses.

The directory holds the responses (``sources.record``) and ``snapshot.toml``: which projects
besides torch to read, and the builds written down because no index could be asked about them
(each with the document it comes from). ``factory facts snapshot --replay DIR`` makes the
snapshot from the recordings alone, byte for byte the same every time; ``--record DIR`` asks
the indexes again first, re-recording every response it uses and dropping the others.
"""

from __future__ import annotations

from pathlib import Path

from factory.errors import ConfigError
from factory.tomlread import tomllib
from factory.upstream.facts import Facts
from factory.upstream.read import Declared, Indexes, read_facts
from factory.upstream.sources import DirectorySource, LiveSource

INPUTS = "snapshot.toml"


def snapshot_inputs(directory: Path) -> tuple[list[str], list[Declared]]:
    path = directory / INPUTS
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: a recording directory needs its "
                          f"{INPUTS} (projects, declared builds)") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    projects = doc.get("projects", [])
    if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
        raise ConfigError(f"{path}: projects must be a list of names")
    declared = []
    for i, d in enumerate(doc.get("declared", [])):
        try:
            cudas = d["cuda"] if isinstance(d["cuda"], list) else [d["cuda"]]
            declared += [Declared(torch_minor=str(d["torch"]), cuda=str(c),
                                  source=str(d["source"]), written=str(d["written"]))
                         for c in cudas]
        except (KeyError, TypeError):
            raise ConfigError(f"{path}: [[declared]] #{i + 1} needs torch, cuda, source and "
                              "written") from None
    return projects, declared


def make_snapshot(directory: Path, *, live: bool = False, timeout: float = 60) -> Facts:
    projects, declared = snapshot_inputs(directory)
    source = DirectorySource(directory, LiveSource(timeout=timeout) if live else None,
                             max_age=0 if live else None, label="recording", stale_ok=False)
    facts = read_facts(source, indexes=Indexes(), projects=projects, declared=declared)
    if live:
        source.prune()
    return facts
