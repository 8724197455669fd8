"""``tokentrace export``: the span tables as Hive-partitioned Parquet."""

from __future__ import annotations

import click

from analyzer.cli.group import cli
from analyzer.cli.options import db_option
from analyzer.errors import UserError

__all__ = ["export"]


@cli.command("export")
@db_option
@click.option("--parquet", "parquet_dir", required=True, metavar="DIR", help="Directory to write (Hive partitions).")
@click.option("--overwrite", is_flag=True, help="Replace the tables in a non-empty DIR.")
def export(db_path: str, parquet_dir: str, overwrite: bool) -> None:
    """Write spans, span_events and span_links as Parquet partitioned by service_name and date.

    Times stay BIGINT nanoseconds; `tokentrace load DIR` reads the dump back losslessly.

    \b
    Example:
      tokentrace export --db traces.duckdb --parquet dump/
      tokentrace load dump/ --db copy.duckdb
    """
    from pathlib import Path

    from analyzer.formats.parquet_export import export_parquet
    from analyzer.errors import ExportError
    from analyzer.db.store import connect

    if not Path(db_path).exists():
        raise UserError(f"{db_path}: no such database", hint="load traces first: tokentrace load FILE --db " + db_path)
    con = connect(db_path, read_only=True)
    try:
        report = export_parquet(con, parquet_dir, overwrite=overwrite)
    except ExportError as e:
        raise UserError(str(e)) from None
    finally:
        con.close()
    click.echo(f"{report.directory}: {report.spans} spans, {report.span_events} events, {report.span_links} links")
