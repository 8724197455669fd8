"""``tokentrace load``: trace files into the DuckDB database."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from analyzer.cli._group import cli
from analyzer.cli._options import db_option
from analyzer.errors import UserError

__all__ = ["load"]


def _progress_bar(quiet: bool):
    """A rich progress bar over bytes read, or None (quiet, not a TTY, or rich missing)."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
    except ImportError:
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True)


def _remove_if_empty(db_path: str) -> None:
    """Remove a database this load created when the load failed before keeping any span (a
    failed first load leaves no empty database behind)."""
    import duckdb

    try:
        con = duckdb.connect(db_path, read_only=True)
        try:
            spans = con.execute("SELECT count(*) FROM spans").fetchall()[0][0]
        finally:
            con.close()
    except duckdb.Error:
        return
    if spans == 0:
        for path in (Path(db_path), Path(db_path + ".wal")):
            path.unlink(missing_ok=True)


def _has_loads(db_path: str) -> bool:
    """True when ``db_path`` (a DuckDB file) has the ``loads`` table tokentrace load writes."""
    import duckdb

    try:
        con = duckdb.connect(db_path, read_only=True)
        try:
            return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
                                    " AND schema_name = 'main' AND table_name = 'loads'").fetchall()[0][0])
        finally:
            con.close()
    except duckdb.Error:
        return True  # not readable as DuckDB: connect() below gives its one-line error


@cli.command("load")
@click.argument("paths", nargs=-1, required=False, metavar="[PATH]...")
@db_option
@click.option("--lenient", is_flag=True, help="Load the good records; keep each rejected one, raw, in the rejects table.")
@click.option(
    "--input-format",
    type=click.Choice(["auto", "otlp-json", "otlp-proto", "jaeger-json", "parquet"]),
    default="auto",
    show_default=True,
    help="Input format; auto sniffs each file.",
)
@click.option("--no-derive", is_flag=True,
              help="Do not (re)build the derived request and gap tables after loading (read verbs then derive "
                   "them per command until `tokentrace load --db DB` builds them).")
@click.option("--allow-empty", is_flag=True,
              help="Accept an input that gives no spans (an empty file, a document with no spans): "
                   "still a warning, but exit 0.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no per-file summary.")
def load(paths: tuple[str, ...], db_path: str, lenient: bool, input_format: str, no_derive: bool,
         allow_empty: bool, quiet: bool) -> None:
    """Load OTLP JSON/protobuf, Jaeger JSON or Parquet traces into the database, then build
    its derived request and gap tables once (schema tokentrace_derived), so every read verb
    answers from them instead of deriving them from the spans again.

    PATH is a file, a directory, a glob or - (stdin); .gz and .zst are decompressed.
    Spans are deduplicated on (trace_id, span_id). Each file is loaded whole or not at all.
    Strict by default: the first bad record stops the load and nothing of that file is
    written; the files before it stay loaded (the error names them) and the files after it
    are not read. An input that gives no spans is a warning and exit 1 unless
    --allow-empty. Without PATH, only (re)builds the derived tables (after a --no-derive
    load, or a database written by another tool).

    --db is a new file or a database tokentrace created (its tokentrace_schema table); any
    other DuckDB database is refused before anything is written, the file untouched. A first
    load that fails (an empty, truncated or unreadable input) leaves no file behind.

    \b
    Example:
      tokentrace load otel-traces.jsonl --db traces.duckdb
      tokentrace load 'dumps/**/*.json.zst' --db traces.duckdb --lenient
      tokentrace load day1/ --db traces.duckdb --no-derive && \\
          tokentrace load day2/ --db traces.duckdb
    """
    from analyzer.db.store import connect
    from analyzer.errors import LoadError
    from analyzer.formats.load import load_paths, reasons_summary

    if not paths:
        _derive_only(db_path, no_derive, quiet)
        return
    bar = _progress_bar(quiet)
    tasks: dict[str, int] = {}

    def progress(file: str, nbytes: int, size: int | None) -> None:
        if file not in tasks:
            tasks[file] = bar.add_task(file, total=size)
        bar.advance(tasks[file], nbytes)

    from analyzer.formats.inputs import expand_inputs

    try:  # a missing input or an empty folder fails before the database is created
        expand_inputs(list(paths))
    except LoadError as e:
        raise UserError(str(e), hint=e.hint) from None
    created = not Path(db_path).exists()
    con = connect(db_path)
    succeeded = False
    try:
        try:
            if bar is not None:
                with bar:
                    report = load_paths(con, list(paths), lenient=lenient, input_format=input_format, progress=progress)
            else:
                report = load_paths(con, list(paths), lenient=lenient, input_format=input_format)
        except LoadError as e:
            _fail_load(e, con, db_path, quiet=quiet, no_derive=no_derive)
        if not quiet:
            _print_report(report, reasons_summary)
        _say_unreadable_tails(con, report)
        empty = [f.file for f in report.files if f.spans_read == 0]
        for name in empty:
            click.echo(f"warning: {name}: no spans in it (an empty file, or traces with no spans)", err=True)
        nothing_kept = created and len(empty) == len(report.files)
        if not no_derive and not (nothing_kept and not allow_empty):  # a database about to be removed
            _derive(con, db_path, quiet)
        succeeded = not (empty and not allow_empty)
    finally:
        con.close()
        if created and not succeeded:  # a failed first load leaves no empty database (nor its .wal) behind
            _remove_if_empty(db_path)
    if empty and not allow_empty:
        raise UserError(f"{len(empty)} of {len(report.files)} inputs gave no spans ({', '.join(empty[:3])}"
                        f"{f' and {len(empty) - 3} more' if len(empty) > 3 else ''})"
                        f"{'; the others are loaded' if len(empty) < len(report.files) else ''}",
                        hint="--allow-empty accepts an input with no spans")


def _derive_only(db_path: str, no_derive: bool, quiet: bool) -> None:
    """``tokentrace load`` without PATH: (re)build the derived tables of an existing tokentrace database."""
    from analyzer.db.store import connect

    if no_derive:
        raise UserError("nothing to do: no PATH to load and --no-derive")
    if not Path(db_path).exists():
        raise UserError(f"{db_path}: no such database; give a PATH to load")
    if not _has_loads(db_path):  # never turn another DuckDB database into a tokentrace one
        raise UserError(f"{db_path}: not a tokentrace database (no loads table: nothing was loaded into it); "
                        "give a PATH to load")
    con = connect(db_path)
    try:
        _derive(con, db_path, quiet)
    finally:
        con.close()


def _fail_load(e, con, db_path: str, *, quiet: bool, no_derive: bool) -> NoReturn:
    """A load that stopped on a bad file: report and derive what the files before it committed,
    close ``con`` and raise the error."""
    from analyzer.formats.load import LoadReport, reasons_summary

    if e.committed and not quiet:
        _print_report(LoadReport(e.load_id or 0, e.committed), reasons_summary, total=False)
    if e.committed and not no_derive:
        _derive(con, db_path, quiet=True)
    con.close()  # the caller removes a database this load created and kept nothing in
    raise UserError(str(e) + _what_stayed(e, db_path), hint=_report_hint(e) or e.hint) from None


def _what_stayed(error, db_path: str) -> str:
    """For a load of several files that failed on a later one: which stayed loaded, which
    were not read (nothing silent); '' for a load that failed on its first file."""
    text = ""
    if error.committed:
        spans = sum(f.spans_loaded for f in error.committed)
        names = ", ".join(f.file for f in error.committed[:3]) + (
            f" and {len(error.committed) - 3} more" if len(error.committed) > 3 else "")
        text += (f"; nothing of {error.file} was written, but the {len(error.committed)} file(s) before it stay "
                 f"loaded in {db_path} (load {error.load_id}: {names}; {spans:,} spans)")
    if error.not_read:
        text += f"; {len(error.not_read)} file(s) after it were not read"
    return text


def _print_report(report, reasons_summary, total: bool = True) -> None:
    for f in report.files:
        line = (
            f"{f.file} [{f.format}]: {f.records_read} records, {f.spans_read} spans read, "
            f"{f.spans_loaded} loaded, {f.duplicates_identical} duplicates, {f.rejected} rejected"
        )
        if f.rejected:
            line += f" ({reasons_summary(f)})"
        click.echo(line)
    if total and len(report.files) > 1:
        click.echo(
            f"total: {report.total('spans_read')} spans read, {report.total('spans_loaded')} loaded, "
            f"{report.total('duplicates_identical')} duplicates, {report.total('rejected')} rejected (load {report.load_id})"
        )


def _report_hint(error) -> str | None:
    """For a file that holds no traces but is a benchmark report tokentrace audit reads (vLLM,
    AIPerf, LLMPerf ...): the audit command, instead of --lenient (which would load nothing)."""
    if error.reason != "not_traces":
        return None
    path = Path(error.file)
    try:
        if not path.is_file() or path.stat().st_size > 64 << 20:
            return None
        from analyzer.audit import detect_kind
        from analyzer.errors import AuditInputError

        kind = detect_kind(path)
    except (AuditInputError, OSError, ValueError):
        return None
    names = {"vllm": "a vLLM bench", "vllm-nightly": "a vLLM nightly benchmark", "aiperf": "an AIPerf",
             "llmperf": "an LLMPerf", "guidellm": "a guidellm"}
    if kind not in names:
        return None
    import shlex

    from analyzer.cli._command_name import tokentrace_command

    return (f"this is {names[kind]} report, not traces: check it with "
            f"{tokentrace_command()} audit {shlex.quote(error.file)}")


def _say_unreadable_tails(con, report) -> None:
    """One line on stderr per file whose end could not be read (a last line or message cut
    short: a file copied while being written, or truncated), naming where: nothing lost silently."""
    for f in report.files:
        if not f.incomplete_last_line:
            continue
        rows = con.execute("SELECT line, raw FROM rejects WHERE load_id = ? AND file = ? "
                           "AND reason = 'incomplete_last_line' ORDER BY line", [report.load_id, f.file]).fetchall()
        for line, raw in rows:
            proto = f.format.startswith("otlp_proto")
            size = len(raw) // 2 if proto and raw else len((raw or "").encode())
            what = (f"message {line} is cut short ({size:,} bytes of it)" if proto else
                    f"line {line} ({size:,} bytes) ends without a newline and is not complete JSON")
            click.echo(f"{f.file}:{line}: unreadable tail: {what}; its spans were not loaded (a file truncated, "
                       "or copied while being written; the raw bytes are in the rejects table)", err=True)


def _derive(con, db_path: str, quiet: bool) -> None:
    """Build the derived tables and say what it cost (one line; nothing with --quiet)."""
    from analyzer.db.derived import build_derived

    def announce() -> None:
        if not quiet:
            click.echo("deriving the request and gap tables ...", err=True)

    report = build_derived(con, on_start=announce)
    if quiet:
        return
    if report.skipped:
        click.echo(f"derived tables: already current ({report.seconds:.2f} s)")
        return
    requests = report.rows.get("request_metrics", 0)
    gaps = report.rows.get("request_gap_rows", 0)
    click.echo(f"derived tables: {requests} request rows, {gaps} gaps in {report.seconds:.2f} s "
               f"(schema tokentrace_derived of {db_path})")
