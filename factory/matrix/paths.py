"""Which matrix.toml a command reads when none is named: ``--matrix``, ``$FACTORY_MATRIX``, the
current directory's, or the checkout's own."""

from __future__ import annotations

from pathlib import Path

from factory.environment import MATRIX_ENV, env_value
from factory.errors import ConfigError


def default_matrix_path() -> Path | None:
    """$FACTORY_MATRIX, else matrix.toml in the current directory, else the checkout's own when
    the package runs from one (an editable install called from elsewhere); None when there is
    none, as for an installed wheel outside a checkout."""
    named = env_value(MATRIX_ENV)
    if named:
        return Path(named)
    here = Path("matrix.toml")
    if here.exists():
        return here
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "matrix.toml").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "matrix.toml"
    return None


def matrix_path(explicit: Path | None = None) -> Path:
    """--matrix, else ``default_matrix_path()``; one line (ConfigError) when there is none."""
    path = explicit or default_matrix_path()
    if path is None:
        raise ConfigError(
            f"no matrix.toml in {Path.cwd()}",
            tip=f"run in the directory that holds it, or pass --matrix FILE or set {MATRIX_ENV}",
        )
    return path
