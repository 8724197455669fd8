"""``tokentrace kv``: KV-cache bytes per token for a model config."""

from __future__ import annotations

import json

import click

from analyzer.cli._group import cli
from analyzer.cli._kv_options import kv_layout_from_flags, model_options
from instrument.kv.formula import bytes_to_mib


@cli.command("kv")
@model_options
@click.option("--tokens", type=click.IntRange(min=0), default=None, help="Also give the KV bytes for N retained tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def kv_command(model_config, layers, kv_heads, head_dim, query_heads, kv_dtype, tokens, as_json) -> None:
    """KV-cache bytes per token: 2 x layers x kv_heads x head_dim x bytes_per_element.

    Logical, unsharded K/V payload; the output lists what it omits physically. An
    architecture whose retained state is not one K and one V per KV head per token (MLA,
    recurrent/hybrid layers) exits non-zero with the reason.

    \b
    Example:
      tokentrace kv --model-config ./config.json --tokens 1025 --json
      tokentrace kv --layers 80 --kv-heads 8 --query-heads 64 --head-dim 128 \\
          --kv-dtype bf16
    """
    layout = kv_layout_from_flags(model_config, layers, kv_heads, head_dim, query_heads, kv_dtype)
    assert layout is not None
    out = layout.to_dict()
    out["kv_mib_per_token"] = bytes_to_mib(layout.kv_bytes_per_token)
    if tokens is not None:
        out["tokens"] = tokens
        out["kv_bytes"] = layout.kv_bytes(tokens)
        out["kv_mib"] = bytes_to_mib(out["kv_bytes"])
    out["limitations"] = layout.limitations
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    import textwrap

    from analyzer.cli._human import terminal_width

    for key, value in out.items():
        if key == "limitations":  # wrapped to the terminal (80 columns in a pipe)
            for item in value:
                for line in textwrap.wrap(f"limitation: {item}", terminal_width(), subsequent_indent="  ",
                                          break_on_hyphens=False):
                    click.echo(line)
        elif value is not None:
            click.echo(f"{key}: {value}")


__all__ = ["kv_command"]
