"""The errors a user can cause, at the bottom layer: every layer of the analyzer may raise them.

The CLI prints each as one readable line and exits non-zero (``UserError`` directly; the
others are turned into one by the verb that catches them). Each is re-exported by the module
that used to define it, so ``from analyzer.formats.canonical import LoadError`` still works.
"""

from __future__ import annotations

import click

__all__ = [
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


class UserError(click.ClickException):
    """An error the user caused (bad file, flag or input): one readable line, exit 1."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        text = " ".join(part.strip() for part in str(message).strip().splitlines() if part.strip())
        super().__init__(text if hint is None else f"{text}; hint: {hint}")


class LoadError(ValueError):
    """A record the user gave cannot be loaded (strict mode), or an input is unreadable.

    ``file``, ``line`` (1-based, None when unknown), ``reason`` (a reason code) and
    ``detail`` name what went wrong; ``str()`` is one readable line.
    """

    def __init__(self, file: str, line: int | None, reason: str, detail: str = "", hint: str | None = None) -> None:
        where = f"{file}:{line}" if line is not None else file
        text = f"{where}: {reason}" + (f": {detail}" if detail else "")
        super().__init__(text)
        self.file, self.line, self.reason, self.detail, self.hint = file, line, reason, detail, hint


class DatabaseFileError(ValueError):
    """A database path that is not (and cannot become) a DuckDB database: one readable line."""


class SourceError(ValueError):
    """The database file or Parquet dump the user named cannot be read."""


class ExportError(ValueError):
    """The export cannot be written (target not empty, bad path)."""


class TimelineError(ValueError):
    """A timeline CSV or calculator input that breaks the seed's validation rules."""


class OffsetSyntaxError(ValueError):
    """An ``--assume-offset`` value that is not ``DOMAIN=MS`` with a finite MS."""


class PullError(Exception):
    """Jaeger could not be asked or did not answer as expected (one readable line)."""


class AuditInputError(ValueError):
    """A report, claims or records file the audit cannot read: the message names file and key."""


class SparkEngineError(RuntimeError):
    """Something a user can fix: pyspark or Java missing, a bad dump path, a query Spark rejects."""


class TranspileError(ValueError):
    """A DuckDB statement that the Spark rules cannot translate (names the construct)."""
