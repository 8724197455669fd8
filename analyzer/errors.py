"""The errors a user can cause, at the bottom layer: every layer of the analyzer may raise them.

The CLI prints each as one readable line and exits non-zero: ``UserError`` directly, the
others (all :class:`TokentraceError`) by their type, in ``analyzer/cli/_group.py``.
"""

from __future__ import annotations

import click

__all__ = [
    "TokentraceError",
    "duckdb_message",
    "UserError",
    "LoadError",
    "DatabaseFileError",
    "SourceError",
    "ExportError",
    "TimelineError",
    "OffsetSyntaxError",
    "PullError",
    "AuditInputError",
    "SparkEngineError",
    "TranspileError",
]


class TokentraceError(Exception):
    """Base of the errors below but :class:`UserError`: something the user can fix, shown by
    the CLI as one line (its ``str()``, plus ``; hint: ...`` when ``hint`` is set), exit 1.
    The CLI recognises them by this type."""

    hint: str | None = None


def duckdb_message(exc: BaseException) -> str:
    """DuckDB's error as one line, its own hint kept: the first line (``Binder Error:
    Referenced column "ttft" not found in FROM clause!``) plus a ``Candidate bindings: ...``
    or ``Did you mean ...`` line when DuckDB gives one; the ``LINE 1: ...`` excerpt and its
    caret line are left out."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    kept = [lines[0]]
    for line in lines[1:]:
        if line.startswith("LINE "):
            break
        if line.startswith(("Candidate bindings", "Did you mean", "Candidate functions", "HINT")):
            kept.append(line)
    return " ".join(kept)


class UserError(click.ClickException):
    """An error the user caused (bad file, flag or input): one readable line, exit 1."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        text = " ".join(part.strip() for part in str(message).strip().splitlines() if part.strip())
        super().__init__(text if hint is None else f"{text}; hint: {hint}")


class LoadError(TokentraceError, ValueError):
    """A record the user gave cannot be loaded (strict mode), or an input is unreadable.

    ``file``, ``line`` (1-based, None when unknown), ``reason`` (a reason code) and
    ``detail`` name what went wrong; ``str()`` is one readable line.
    """

    def __init__(self, file: str, line: int | None, reason: str, detail: str = "", hint: str | None = None) -> None:
        where = f"{file}:{line}" if line is not None else file
        text = f"{where}: {reason}" + (f": {detail}" if detail else "")
        super().__init__(text)
        self.file, self.line, self.reason, self.detail, self.hint = file, line, reason, detail, hint
        #: set by a multi-file load: its id, the files loaded (committed) before this one
        #: failed (their reports), and the names of the files after it, not read
        self.load_id: int | None = None
        self.committed: list = []
        self.not_read: list[str] = []


class DatabaseFileError(TokentraceError, ValueError):
    """A database path that is not (and cannot become) a DuckDB database: one readable line."""


class SourceError(TokentraceError, ValueError):
    """The database file or Parquet dump the user named cannot be read."""


class ExportError(TokentraceError, ValueError):
    """The export cannot be written (target not empty, bad path)."""


class TimelineError(TokentraceError, ValueError):
    """A timeline CSV or calculator input that breaks the timeline's rules (docs/metrics.md)."""


class OffsetSyntaxError(TokentraceError, ValueError):
    """An ``--assume-offset`` value that is not ``DOMAIN=MS`` with a finite MS."""


class PullError(TokentraceError):
    """Jaeger could not be asked or did not answer as expected (one readable line)."""


class AuditInputError(TokentraceError, ValueError):
    """A report, claims or records file the audit cannot read: the message names file and key."""


class SparkEngineError(TokentraceError, RuntimeError):
    """Something a user can fix: pyspark or Java missing, a bad dump path, a query Spark rejects."""


class TranspileError(TokentraceError, ValueError):
    """A DuckDB statement that the Spark rules cannot translate (names the construct)."""
