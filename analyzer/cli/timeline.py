"""``tokentrace timeline``: the worked example's request-timeline calculator, through DuckDB SQL."""

from __future__ import annotations

import json
import sys

import click

from analyzer.cli._group import cli
from analyzer.cli._kv_options import kv_layout_from_flags, model_options
from analyzer.cli._options import db_option, to_jsonable
from analyzer.errors import UserError


@cli.command("timeline")
@click.argument("csv_path", metavar="CSV", type=click.Path())
@model_options
@click.option("--input-tokens", type=click.IntRange(min=0), default=None, help="Prompt tokens I (for prompt/stop KV).")
@click.option("--output-tokens", type=int, required=True, help="Visible output tokens O (>= 1).")
@click.option("--window-s", type=float, default=None, help="System window length in seconds (closed cohort).")
@click.option("--attempted", type=int, default=None, help="Requests attempted in the window.")
@click.option("--succeeded", type=int, default=None, help="Requests that succeeded.")
@click.option("--slo-passing", type=int, default=None, help="Succeeded requests that met every SLO.")
@click.option("--claim-kv-bytes-per-token", type=float, default=None,
              help="A published KV bytes/token figure to check (flags the query-heads-for-KV-heads error).")
@click.option("--claim-e2e-ms", type=float, default=None,
              help="A published E2E in ms to check (flags O gaps charged for O tokens).")
@db_option(optional="Keep the synthetic trace in this DuckDB database (default: in memory only).")
@click.option("--json", "as_json", is_flag=True, help="Print the artifact as JSON (every figure at full precision).")
def timeline_command(csv_path, model_config, layers, kv_heads, head_dim, query_heads, kv_dtype, input_tokens,
                     output_tokens, window_s, attempted, succeeded, slo_passing, claim_kv_bytes_per_token,
                     claim_e2e_ms, db_path, as_json) -> None:
    """Reproduce a request's TTFT, E2E, TPOT, token rates and KV figures from a timeline CSV.

    The CSV has columns event,time_ms,detail with events client_send, first_visible_token
    and last_visible_token (required), server_arrival and scheduler_admit (optional), all on
    one reference clock in milliseconds. It is loaded as a synthetic trace and every timing
    figure comes from queries/requests.sql; with --window-s/--attempted/--succeeded/
    --slo-passing the window figures come from queries/window.sql over a synthetic closed
    cohort with those counts. Exits 1 when a --claim-* check fails.

    \b
    Example (the worked example, analyzer/examples/):
      tokentrace timeline request-timeline.csv --layers 80 --kv-heads 8 \\
          --head-dim 128 --kv-dtype bf16 --input-tokens 1025 --output-tokens 150 \\
          --window-s 10 --attempted 100 --succeeded 98 --slo-passing 95 --json
    """
    from analyzer.audit.claims import check_e2e_claim, check_kv_claim
    from analyzer.db.store import connect
    from analyzer.errors import TimelineError
    from analyzer.verbs.timeline import WindowCounts, compute_artifact, read_timeline_csv

    kv = kv_layout_from_flags(model_config, layers, kv_heads, head_dim, query_heads, kv_dtype,
                              required=claim_kv_bytes_per_token is not None)
    window_flags = {"--window-s": window_s, "--attempted": attempted, "--succeeded": succeeded,
                    "--slo-passing": slo_passing}
    given = [k for k, v in window_flags.items() if v is not None]
    window = None
    if given:
        missing = [k for k, v in window_flags.items() if v is None]
        if missing:
            raise UserError(f"the system window needs {', '.join(missing)} as well (given: {', '.join(given)})")
        window = WindowCounts(window_s, attempted, succeeded, slo_passing)
    try:
        times = read_timeline_csv(csv_path)
        con = connect(db_path) if db_path else None
        try:
            artifact = compute_artifact(times, input_tokens=input_tokens, output_tokens=output_tokens, kv=kv,
                                        window=window, con=con)
            if con is not None:  # the synthetic trace is kept: derive its tables as tokentrace load does
                from analyzer.db.derived import build_derived

                build_derived(con)
        finally:
            if con is not None:
                con.close()
    except TimelineError as exc:
        raise UserError(str(exc)) from None
    findings = []
    if claim_kv_bytes_per_token is not None:
        assert kv is not None
        findings.append(check_kv_claim(claim_kv_bytes_per_token, kv, query_heads))
    if claim_e2e_ms is not None:
        findings.append(check_e2e_claim(claim_e2e_ms, artifact["ttft_ms"], artifact["tpot_ms"], output_tokens,
                                        recomputed_e2e_ms=artifact["e2e_ms"]))
    if findings:
        artifact["findings"] = [f.to_dict() for f in findings]
    if as_json:
        click.echo(json.dumps(to_jsonable(artifact), indent=2))
    else:
        _print_artifact(artifact)
    failed = [f for f in findings if f.verdict == "fail"]
    for f in failed:
        click.echo(f"FAIL {f.check}: {f.detail}", err=True)
    if failed:
        sys.exit(1)


def _print_artifact(artifact: dict) -> None:
    """The figures one per line, rounded for reading as the query verbs round them (units in
    the names; --json keeps full precision), long texts wrapped to the terminal."""
    import textwrap

    from analyzer.cli._human import cell_text, terminal_width

    width = terminal_width()
    shown = {k: v for k, v in artifact.items() if k not in ("limitations", "findings", "kv_layout")}
    key_width = max((len(k) for k in shown), default=0) + 2
    for key, value in shown.items():
        text = cell_text(value, key=key) if value is not None else "-"
        lines = textwrap.wrap(text, max(20, width - key_width)) or [""]
        click.echo(f"{key:<{key_width}}{lines[0]}")
        for more in lines[1:]:
            click.echo(" " * key_width + more)
    for f in artifact.get("findings", []):
        for line in textwrap.wrap(f"check {f['check']}: {f['verdict']} - {f['detail']}", width,
                                  subsequent_indent="  "):
            click.echo(line)
    for item in artifact.get("limitations", []):
        for line in textwrap.wrap(f"limitation: {item}", width, subsequent_indent="  "):
            click.echo(line)
