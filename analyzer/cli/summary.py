"""``tokentrace summary``: distributions of the per-request metrics (queries/summary.sql)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from analyzer.cli._group import cli
from analyzer.cli._options import format_option, param_option
from analyzer.cli._query_verb import PERSPECTIVES, columns_option, run_verb, source_options

if TYPE_CHECKING:
    from analyzer.query.runner import QueryResult


@cli.command("summary")
@source_options
@click.option("--perspective", type=click.Choice(PERSPECTIVES), default=None,
              help="Only this perspective (default: one row per perspective).")
@click.option("--include-unsuccessful", is_flag=True, default=None,
              help="Also count failed and cancelled requests (default: succeeded only).")
@format_option
@columns_option
@param_option
def summary_command(db_path, parquet_dir, engine, perspective, include_unsuccessful, output_format, chosen_columns, params) -> None:
    """Count, mean, std, min, p50/p90/p95/p99, max of TTFT, TPOT, E2E, ITL and token rates.

    One row per metric and perspective. Percentiles are linear interpolation between order
    statistics (numpy's default; DuckDB quantile_cont). itl_* rows count gaps, the others
    requests; null_count counts requests or gaps without the figure. Under a keep policy the
    itl_* rows count the random sample only (request_set says so, with its size): requests
    kept for a rule are slow by selection. The table names each
    metric with its unit (TTFT ms, TPOT ms, E2E ms, ...) and rounds to 4 significant digits.

    \b
    Example:
      tokentrace summary --db traces.duckdb --columns metric,perspective,p50,p99
      tokentrace summary --db traces.duckdb --perspective client
      tokentrace summary --parquet dump/ --format csv --include-unsuccessful
    """
    notes = ["percentiles: linear interpolation (numpy default 'linear', DuckDB quantile_cont)"]

    def say_request_sets(result: QueryResult) -> QueryResult:
        """A note per perspective whose gap rows count the random sample only (a keep policy)."""
        if "request_set" in result.columns:
            perspective, request_set = result.columns.index("perspective"), result.columns.index("request_set")
            for who, what in sorted({(r[perspective], r[request_set]) for r in result.rows}):
                if what != "every request":
                    notes.append(f"ITL rows, {who}: the {what}")
        return result

    run_verb("summary", engine=engine, db_path=db_path, parquet_dir=parquet_dir,
             flags={"perspective": perspective, "include_unsuccessful": include_unsuccessful},
             raw_params=params, output_format=output_format, notes=notes,
             decorate=say_request_sets if output_format == "table" else None, chosen=chosen_columns)
