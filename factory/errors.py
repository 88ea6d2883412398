"""One exception hierarchy; one exit code per class. Only the CLI prints them."""

from __future__ import annotations


class FactoryError(Exception):
    """Base class. ``tip`` is an optional second line telling the user what to do."""

    exit_code = 1

    def __init__(self, message: str, *, tip: str | None = None) -> None:
        super().__init__(message)
        self.tip = tip
        self.cell: str | None = None  # the short id of the cell whose build raised it

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__

    @property
    def lines(self) -> tuple[str, ...]:
        """What the CLI prints, one ``ERROR`` line each."""
        return (self.message,)


class UsageError(FactoryError):
    """Bad command-line arguments."""

    exit_code = 2


class ConfigError(FactoryError):
    """An invalid matrix.toml or settings file."""

    exit_code = 3


class ConfigErrors(ConfigError):
    """Several independent problems in one matrix, all reported at once (one line each)."""

    def __init__(self, problems: list[ConfigError]) -> None:
        tips = dict.fromkeys(p.tip for p in problems if p.tip)
        super().__init__(
            f"{len(problems)} problems in the matrix: {'; '.join(p.message for p in problems)}",
            tip=" / ".join(tips) or None,
        )
        self.problems = tuple(problems)

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(p.message for p in self.problems)


class CellError(FactoryError):
    """A cell id or spec that cannot be parsed or is not in the matrix."""

    exit_code = 4


class ToolchainError(FactoryError):
    """No CUDA toolkit / torch combination that can build the cell."""

    exit_code = 5


class PlanError(FactoryError):
    """The build cannot fit the memory or CPU budget."""

    exit_code = 6


class BuildError(FactoryError):
    """The build itself failed (compiler error, container failure)."""

    exit_code = 7


class OOMError(BuildError):
    """The build was killed for memory and retries are exhausted."""

    exit_code = 8


class WheelError(FactoryError):
    """A wheel file that is malformed or does not match what was planned."""

    exit_code = 9


class VerifyError(FactoryError):
    """A wheel failed verification (archs, tags, metadata, import)."""

    exit_code = 10


class StoreError(FactoryError):
    """The store refused an operation or could not be reached."""

    exit_code = 11


class ConflictError(StoreError):
    """Same filename with different bytes, or a concurrent writer holds the lock."""

    exit_code = 12


class AuthError(FactoryError):
    """Missing or wrong credentials."""

    exit_code = 13


class EngineError(FactoryError):
    """The container engine is missing or not running, or a required program is absent."""

    exit_code = 14


class IndexError_(FactoryError):
    """The index pages do not match the store (``factory index verify``)."""

    exit_code = 15


class UpstreamError(FactoryError):
    """A public index (PyPI, PyTorch's per-CUDA indexes) could not be read, or answered
    something that is not an index page or a wheel."""

    exit_code = 16


class Interrupted(KeyboardInterrupt):
    """SIGTERM (scancel, a Kubernetes pod stopping, a CI job cancelled): unwinds like Ctrl-C,
    so every ``finally`` runs (a lease is released, a container or cgroup removed). Not a
    FactoryError: ``except Exception`` must not swallow it."""

    exit_code = 143  # 128 + SIGTERM
    cell: str | None = None  # the short id of the cell whose build it stopped


def raise_interrupted(signum: int, frame: object) -> None:
    """The SIGTERM handler that turns the signal into Interrupted."""
    raise Interrupted(f"signal {signum}")


# Exit codes the CLI uses that no error class carries.
OTHER_EXIT_CODES = {0: "success", 70: "internal error (a bug: run with --debug for a traceback)",
                    130: "interrupted (Ctrl-C)",
                    Interrupted.exit_code: "terminated (SIGTERM: scancel, a pod or CI job stopped)"}
DOCTOR_NO_FIT = ("factory doctor: the index has no wheel that fits this host; factory request "
                 "--check: the wheel is not published")


def exit_codes() -> list[tuple[int, str]]:
    """Every exit code and what it means: one per error class (its docstring's first line),
    the CLI's own, and the doctor's 'nothing fits'; in code order. The --help epilog and the
    README's table are made from this."""
    found: dict[int, str] = dict(OTHER_EXIT_CODES)
    stack: list[type[FactoryError]] = [FactoryError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        first = (cls.__doc__ or cls.__name__).strip().split("\n\n")[0]  # its first paragraph
        doc = " ".join(first.split()).rstrip(".").replace("``", "")
        if cls is FactoryError:
            doc = f"an error of no class below; {DOCTOR_NO_FIT}"
        found.setdefault(cls.exit_code, doc)
    return sorted(found.items())
