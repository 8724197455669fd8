"""The ``tokentrace`` click group. Verbs live one module each beside this file and are
discovered by ``analyzer.cli`` at start-up, so adding a verb never edits a shared file.

No traceback reaches a user: an error a verb did not turn into a one-line
:class:`~analyzer.cli._options.UserError` itself is turned into one here (a database path
that is not a database, a file the OS refuses, a DuckDB error, and, as a last resort, any
other exception, reported as an internal error). ``TOKENTRACE_DEBUG=1`` lets the original
exception through, traceback and all.
"""

from __future__ import annotations

import os
from typing import Any

import click

__all__ = ["INTERNAL_ERROR_EXIT", "TokentraceGroup", "cli"]

#: Exit status of an unexpected exception (EX_SOFTWARE); a user error exits 1, a usage error 2.
INTERNAL_ERROR_EXIT = 70


class InternalError(click.ClickException):
    """An exception no verb expected: one line naming it, exit 70."""

    exit_code = INTERNAL_ERROR_EXIT


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def user_facing_error(exc: Exception, verb: str | None) -> click.ClickException:
    """The one-line click error for an exception a verb let through."""
    from analyzer.errors import TokentraceError, UserError, duckdb_message

    name = type(exc).__name__
    module = type(exc).__module__ or ""
    if isinstance(exc, TokentraceError):
        return UserError(str(exc), hint=exc.hint)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return UserError(f"tokentrace {verb or ''} needs the Python package {exc.name!r}, which is not installed "
                         "(an optional extra of tokentrace: see pyproject.toml, e.g. pip install 'tokentrace[all]')")
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return UserError(f"{where}{exc.strerror or exc}")
    if module.startswith(("duckdb", "_duckdb")):
        return UserError(f"{verb or 'tokentrace'}: DuckDB {name}: {duckdb_message(exc)}")
    return InternalError(
        f"internal error in tokentrace {verb or ''}: {name}: {_one_line(str(exc))[:300]} "
        "(TOKENTRACE_DEBUG=1 shows the traceback; please report it)"
    )


class OneLineUsageError(click.UsageError):
    """A click usage error (bad flag value, missing option, unknown verb) shown as one line
    that names the help to read, instead of click's usage block."""

    def __init__(self, original: click.UsageError) -> None:
        super().__init__(_one_line(original.format_message()), original.ctx)
        self.exit_code = original.exit_code  # type: ignore[misc]  # click declares it on the class; the original's code is kept

    def show(self, file: Any = None) -> None:
        where = self.ctx.command_path if self.ctx is not None else "tokentrace"
        click.echo(f"Error: {self.format_message()} (see '{where} --help')", err=True)


def _one_line_usage(exc: click.UsageError) -> click.UsageError:
    # a bare `tokentrace` prints the help (NoArgsIsHelpError): that one is kept as it is
    return exc if type(exc).__name__ == "NoArgsIsHelpError" or isinstance(exc, OneLineUsageError) else OneLineUsageError(exc)


class TokentraceGroup(click.Group):
    """A click group whose verbs' unexpected exceptions and usage errors become one-line errors."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise _one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line_usage(exc) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # a broken pipe (`tokentrace itl | head`): main() leaves quietly
        except Exception as exc:
            if os.environ.get("TOKENTRACE_DEBUG"):
                raise
            raise user_facing_error(exc, ctx.invoked_subcommand) from None


@click.group(cls=TokentraceGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tokentrace")
def cli() -> None:
    """tokentrace: trace LLM inference requests with OpenTelemetry and analyze the traces.

    \b
    Instrument:  serve, bench, demo (trace a model and its gateway)
    Load:        load, export, collect, pull (traces into DuckDB / Parquet)
    Query:       requests, itl, phases, summary, window, skew, steps, stalls, sql
    Schema:      tables (the tables and views sql reads, their columns)
    Check:       timeline, kv, audit, compare (two runs: what changed, how sure)
    Report:      report (one self-contained HTML file)
    """
