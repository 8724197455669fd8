"""``tokentrace sql``: an ad-hoc query over the loaded tables and the metric views, read-only.

Read-only twice over, with DuckDB's own facilities rather than by reading the SQL text:
the statement is parsed by DuckDB (``extract_statements``) and must be one statement of
type SELECT (``FROM``-first, ``WITH``, ``VALUES``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``
parse as SELECT) or an EXPLAIN [ANALYZE] whose wrapped statement is a SELECT (``EXPLAIN
ANALYZE`` runs what it wraps: ``EXPLAIN ANALYZE COPY ... TO`` into the ``--parquet`` dump,
an allowed directory, would write); and before it runs, the connection is locked down:
``enable_external_access = false`` (no file or network access: no ``COPY ... TO``,
``ATTACH``, ``INSTALL``/``LOAD``, ``read_csv('/etc/...')``, ``EXPORT DATABASE``), with
``allowed_directories`` naming the ``--parquet`` dump so its views keep reading it, then
``lock_configuration = true`` (no ``SET``/``RESET``). The database file itself is attached
read-only, so nothing can be written to it either.
"""

from __future__ import annotations

import os
import re

import click
import duckdb

from analyzer.cli._group import cli
from analyzer.cli._options import emit_rows, format_option, param_option, parse_params
from analyzer.cli._query_verb import installed, open_from_flags, source_options
from analyzer.errors import UserError, duckdb_message

__all__ = ["READ_ONLY_STATEMENTS", "check_read_only_statement", "lock_down", "sql_command"]

#: The statement types ``tokentrace sql`` runs (duckdb.StatementType names).
READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")  # EXPLAIN [ANALYZE] of a SELECT only


def check_read_only_statement(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """UserError unless ``query`` is exactly one SELECT or EXPLAIN statement (parsed by DuckDB)."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise UserError(f"sql: {duckdb_message(exc)}") from None
    if len(statements) != 1:
        raise UserError(f"sql: give one statement, not {len(statements)}")
    kind = statements[0].type.name
    if kind == "EXPLAIN":
        kind = _explained_kind(con, statements[0].query)
    if kind not in READ_ONLY_STATEMENTS:
        raise UserError(f"sql: {'an' if kind[0] in 'AEIOU' else 'a'} {kind} statement is refused: tokentrace sql is read-only "
                        "(one SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE or EXPLAIN of a SELECT)")


_LEADING = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
_EXPLAIN = re.compile(r"^EXPLAIN\s*(?:\((?:[^()]|\([^()]*\))*\)\s*)?(?:ANALY[SZ]E\b\s*)?(?:\((?:[^()]|\([^()]*\))*\)\s*)?",
                      re.IGNORECASE)


def _explained_kind(con: duckdb.DuckDBPyConnection, text: str) -> str:
    """The type of the statement an EXPLAIN wraps (``EXPLAIN ANALYZE`` runs it: ``EXPLAIN
    ANALYZE COPY ... TO`` writes the file), parsed by DuckDB; ``EXPLAIN`` when it cannot be
    told (refused: only an EXPLAIN of a SELECT runs)."""
    body = _LEADING.sub("", text, count=1)
    found = _EXPLAIN.match(body)
    if not found:
        return "EXPLAIN"
    try:
        inner = con.extract_statements(body[found.end():])
    except duckdb.Error:
        return "EXPLAIN"
    if len(inner) != 1:
        return "EXPLAIN"
    kind = inner[0].type.name
    return "EXPLAIN" if kind == "SELECT" else f"EXPLAIN of a {kind}"


def lock_down(con: duckdb.DuckDBPyConnection, parquet_dir: str | None) -> None:
    """No file or network access beyond the ``--parquet`` dump, and no setting changed, for
    the rest of this connection's life."""
    if parquet_dir:
        con.execute("SET allowed_directories = $d", {"d": [os.path.join(os.path.abspath(parquet_dir), "")]})
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


@cli.command("sql")
@click.argument("query", metavar="SQL")
@source_options
@format_option
@param_option
def sql_command(query, db_path, parquet_dir, engine, output_format, params) -> None:
    """Run one SQL statement over spans, span_events, span_links, loads, rejects and the views
    request_facts, request_chunks, request_metrics, request_gaps, request_clock_offsets,
    clock_pair_offsets, engine_steps, engine_step_requests and request_step_gaps. Values go
    in as $NAME parameters (--param NAME=VALUE), never formatted into the SQL. Read-only: one
    SELECT (or WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN [ANALYZE] of a
    SELECT); anything that would write the database or a file (COPY ... TO,
    ATTACH, INSTALL/LOAD, CREATE, DROP, INSERT, UPDATE, DELETE, SET) is refused, and the
    query runs with DuckDB's file access turned off (the --parquet dump excepted).

    \b
    Example:
      tokentrace sql \\
          "SELECT perspective, avg(ttft_ms) FROM request_metrics GROUP BY ALL" \\
          --db traces.duckdb
      tokentrace sql "SELECT * FROM request_gaps WHERE itl_ms > \\$ms" \\
          --param ms=100 --db traces.duckdb
    """
    bound = parse_params(params)
    con = open_from_flags(db_path, parquet_dir, engine=engine)
    try:
        check_read_only_statement(con, query)
        installed(con)
        lock_down(con, parquet_dir)
        try:
            cur = con.execute(query, bound or None)
        except duckdb.Error as exc:
            raise UserError(f"sql: {duckdb_message(exc)}") from None
        if cur.description is None:
            raise UserError("sql: the statement returned no result set")
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    if output_format == "table":  # rounded for reading, *_ns epoch times as UTC, fitted to the terminal
        from analyzer.cli._views import echo_human

        echo_human("sql", columns, rows, columns_flag=False)
        return
    emit_rows(columns, rows, output_format)
