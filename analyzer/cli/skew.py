"""``tokentrace skew``: clock-skew rule violations and clock offset bounds
(queries/skew_rules.sql and queries/skew_offsets.sql)."""

from __future__ import annotations

import json

import click

from analyzer.cli._group import cli
from analyzer.cli._options import emit_rows, format_option, to_jsonable
from analyzer.cli._query_verb import (
    check_trace_id,
    merge_params,
    note_if_stale,
    open_from_flags,
    query_rows,
    source_options,
)
from analyzer.errors import OffsetSyntaxError, UserError
from analyzer.verbs.skew import parse_assume_offsets


@cli.command("skew")
@source_options
@click.option("--trace-id", default=None, metavar="HEX32", help="Check the rules on this trace only.")
@click.option("--tolerance-ms", type=click.FloatRange(min=0), default=None,
              help="Rule violations up to this many ms are not reported (default 0).")
@click.option("--offset-tolerance-ms", type=click.FloatRange(min=0), default=None,
              help="Offset bounds excluding 0 by up to this many ms still count as consistent (default 1).")
@click.option("--assume-offset", "assume_offset", multiple=True, metavar="DOMAIN=MS",
              help="DOMAIN's clock runs MS ms ahead of the client's (repeatable); echoed and checked "
                   "against the bounds. Rules never edit timestamps.")
@format_option
def skew_command(db_path, parquet_dir, engine, trace_id, tolerance_ms, offset_tolerance_ms, assume_offset,
                 output_format) -> None:
    """Named clock-skew rules with their violations, and offset bounds per clock-domain pair.

    Rules: child_starts_before_parent, child_ends_after_parent, negative_duration,
    event_outside_span, decode_steps_overlap, chunks_out_of_order (trace, span, domains,
    magnitude_ms). Offsets: theta = server clock - client clock is bounded per request by
    gateway.start - client.start (upper) and gateway.end - client.end (lower); the verdict
    per pair is consistent, skew_detected or contradiction. Exit status 0 either way.

    \b
    Example:
      tokentrace skew --db traces.duckdb
      tokentrace skew --db traces.duckdb --assume-offset skewed-client=35 \\
          --format json
    """
    try:
        offsets = parse_assume_offsets(assume_offset)
    except OffsetSyntaxError as exc:
        raise UserError(str(exc)) from None
    rule_params = merge_params("skew_rules", {"tolerance_ms": tolerance_ms, "trace_id": check_trace_id(trace_id)}, ())
    offset_params = merge_params("skew_offsets", {"tolerance_ms": offset_tolerance_ms, **offsets.params()}, ())
    con = open_from_flags(db_path, parquet_dir, engine=engine)
    try:
        rules = query_rows(con, "skew_rules", rule_params)
        bounds = query_rows(con, "skew_offsets", offset_params)
        note_if_stale(con, db_path)
    finally:
        con.close()
    if output_format == "json":
        click.echo(json.dumps(to_jsonable({
            "rules": rules.dicts(),
            "offsets": bounds.dicts(),
            "assumed_offsets": dict(zip(offsets.domains, offsets.offsets_ms)),
            "notes": offsets.notes(),
        }), indent=2))
        return
    for i, (title, result, notes) in enumerate((("skew_rules", rules, ()), ("skew_offsets", bounds, offsets.notes()))):
        if output_format == "table":  # the query's human view (analyzer/cli/_views.py)
            _echo_table(title, result, notes, first=not i)
            continue
        click.echo(f"# {title}")
        emit_rows(result.columns, result.rows, output_format, notes=notes)


#: The rules queries/skew_rules.sql checks, as the table names them when none is broken.
RULES = ("child_starts_before_parent", "child_ends_after_parent", "negative_duration", "event_outside_span",
         "decode_steps_overlap", "chunks_out_of_order")


def _echo_table(title: str, result, notes, first: bool) -> None:
    """One section as a table: no empty rules table (one line says no rule is broken), and
    clock domains under short names that still tell them apart, spelled out below."""
    import textwrap

    from analyzer.cli._human import terminal_width
    from analyzer.cli._views import echo_human

    width = terminal_width()
    click.echo(("" if first else "\n") + f"{title}: {len(result.rows)} row(s)")
    if title == "skew_rules" and not result.rows:
        click.echo(textwrap.fill(f"no span breaks a rule ({', '.join(RULES)})", width, subsequent_indent="  "))
        return
    rows, legend = with_short_domains(result.columns, result.rows)
    echo_human(title, result.columns, rows, notes=[*notes, *legend], columns_flag=False)


def with_short_domains(columns, rows) -> tuple[list, list[str]]:
    """``rows`` with their client and server clock domains under :func:`short_domain_names`,
    and the legend lines that spell each shortened one out (skew, the demo)."""
    at = [columns.index(c) for c in ("client_domain", "server_domain") if c in columns]
    if not at:
        return list(rows), []
    names = short_domain_names({row[i] for row in rows for i in at if row[i]})
    short = [tuple(names.get(v, v) if j in at else v for j, v in enumerate(row)) for row in rows]
    return short, [f"clock {s}: {full}" for full, s in sorted(names.items(), key=lambda kv: kv[1]) if s != full]


def short_domain_names(domains: set[str]) -> dict[str, str]:
    """A short name per clock domain (``service.name|service.instance.id|host.name``): the
    service name, with as much of the instance id (then the host) as tells it from the
    others of the same service."""
    parts = {d: (d.split("|") + ["", ""])[:3] for d in domains}
    names: dict[str, str] = {}
    for domain, (service, instance, _host) in parts.items():
        same = [p for d, p in parts.items() if d != domain and p[0] == service]
        if not same:
            names[domain] = service or domain
            continue
        for n in range(4, len(instance) + 1):
            if all(not p[1].startswith(instance[:n]) for p in same):
                names[domain] = f"{service}|{instance[:n]}"
                break
        else:
            names[domain] = domain
    return names
