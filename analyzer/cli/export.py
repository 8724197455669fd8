"""``tokentrace export``: the span tables as Hive-partitioned Parquet, the timeline as a Perfetto trace."""

from __future__ import annotations

import click

from analyzer.cli._group import cli
from analyzer.cli._options import db_option
from analyzer.errors import UserError

__all__ = ["export"]


@cli.command("export")
@db_option
@click.option("--parquet", "parquet_dir", default=None, metavar="DIR", help="Directory to write (Hive partitions).")
@click.option("--perfetto", "perfetto_path", default=None, metavar="FILE",
              help="Perfetto trace to write: a track per request, the engine's steps and counters "
                   "(open it in ui.perfetto.dev; needs the perfetto extra).")
@click.option("--overwrite", is_flag=True, help="Replace the tables in a non-empty DIR, or an existing FILE.")
def export(db_path: str, parquet_dir: str | None, perfetto_path: str | None, overwrite: bool) -> None:
    """Write spans, span_events and span_links as Parquet partitioned by service_name and date
    (--parquet), and/or the engine timeline as a Perfetto protobuf trace (--perfetto).

    Parquet: times stay BIGINT nanoseconds; `tokentrace load DIR` reads the dump back
    losslessly. Perfetto: one process per clock domain (engine or service), in each the
    counters KV blocks used, running and waiting, a slice per engine step, and a track per
    request (queue, prefill, decode slices; an instant per generated token; preemptions);
    timestamps on the engine's clock, the clock-skew verdicts in the trace's metadata
    (docs/report.md, "Perfetto trace"). A Parquet dump or trace files reach it through
    `tokentrace load` first.

    \b
    Example:
      tokentrace export --db traces.duckdb --parquet dump/
      tokentrace load dump/ --db copy.duckdb
      tokentrace export --db traces.duckdb --perfetto run.pftrace
    """
    from pathlib import Path

    from analyzer.errors import ExportError

    if parquet_dir is None and perfetto_path is None:
        raise UserError("export: give --parquet DIR, --perfetto FILE, or both")
    if not Path(db_path).exists():
        raise UserError(f"{db_path}: no such database", hint="load traces first: tokentrace load FILE --db " + db_path)
    if perfetto_path is not None:
        from analyzer.report.perfetto_trace import require_perfetto

        try:
            require_perfetto()  # a missing extra is said before anything is written
        except ExportError as e:
            raise UserError(str(e)) from None
    if parquet_dir is not None:
        _export_parquet(db_path, parquet_dir, overwrite)
    if perfetto_path is not None:
        _export_perfetto(db_path, perfetto_path, overwrite)


def _export_parquet(db_path: str, parquet_dir: str, overwrite: bool) -> None:
    from analyzer.db.store import connect
    from analyzer.errors import ExportError
    from analyzer.formats.parquet_export import export_parquet

    con = connect(db_path, read_only=True)
    try:
        report = export_parquet(con, parquet_dir, overwrite=overwrite)
    except ExportError as e:
        raise UserError(str(e)) from None
    finally:
        con.close()
    click.echo(f"{report.directory}: {report.spans} spans, {report.span_events} events, {report.span_links} links")


def _export_perfetto(db_path: str, path: str, overwrite: bool) -> None:
    from analyzer.cli._query_verb import open_from_flags
    from analyzer.errors import ExportError
    from analyzer.report.perfetto_trace import export_perfetto

    # attached read-only, as every query verb: the views live in memory
    con = open_from_flags(db_path, None)
    try:
        report = export_perfetto(con, path, overwrite=overwrite)
    except ExportError as e:
        raise UserError(str(e)) from None
    finally:
        con.close()
    click.echo(f"{report.path}: {report.requests:,} request tracks, {report.steps:,} engine steps, "
               f"{report.tokens:,} token instants, {report.processes} process(es)")
    if report.no_engine_track:
        click.echo(report.no_engine_track, err=True)
