"""The model flags shared by ``timeline``, ``kv`` and ``audit``: a KV layout from
``--model-config`` or from explicit ``--layers/--kv-heads/--head-dim/--kv-dtype``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from analyzer.errors import UserError
from instrument.kv.formula import KVLayout, UnsupportedArchitecture, explicit_layout, kv_layout_from_config

__all__ = ["kv_layout_from_flags", "model_options"]

KV_DTYPES = ["fp8", "bf16", "fp16", "fp32"]


def model_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for decorator in reversed(
        [
            click.option("--model-config", type=click.Path(dir_okay=True), default=None,
                         help="HuggingFace config.json (or its folder) to derive the KV layout from."),
            click.option("--layers", type=click.IntRange(min=1), default=None, help="Decoder layers."),
            click.option("--kv-heads", type=click.IntRange(min=1), default=None,
                         help="Key/value heads per layer (not query heads)."),
            click.option("--head-dim", type=click.IntRange(min=1), default=None, help="Dimension per head."),
            click.option("--query-heads", type=click.IntRange(min=1), default=None,
                         help="Query heads per layer (names the layout; checks a query-heads KV claim)."),
            click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default=None,
                         help="KV cache dtype: fp8 = 1 byte, bf16/fp16 = 2, fp32 = 4. Overrides the "
                              "config's dtype; default bf16 with explicit flags."),
        ]
    ):
        func = decorator(func)
    return func


def _naming(model_config: str, message: str) -> str:
    """``message`` led by the config path once: instrument.kv.formula's errors about the file already
    name it (``config.json:1: not valid JSON``, ``dir/config.json: model config not found``)."""
    return message if message.startswith(str(model_config)) else f"{model_config}: {message}"


def kv_layout_from_flags(
    model_config: str | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    query_heads: int | None,
    kv_dtype: str | None,
    required: bool = True,
) -> KVLayout | None:
    """The KV layout the flags describe; UserError for missing or contradictory flags."""
    explicit = [layers, kv_heads, head_dim]
    if model_config:
        if any(v is not None for v in explicit):
            raise UserError("give either --model-config or --layers/--kv-heads/--head-dim, not both")
        try:
            layout = kv_layout_from_config(model_config, kv_dtype=kv_dtype)
        except UnsupportedArchitecture as exc:
            raise UserError(_naming(model_config, f"unsupported architecture: {exc}")) from None
        except UnicodeDecodeError as exc:
            raise UserError(f"{model_config}: not UTF-8 text ({exc.reason}), not a JSON model config") from None
        except ValueError as exc:
            raise UserError(_naming(model_config, str(exc))) from None
        if query_heads is not None and query_heads != layout.q_heads:
            raise UserError(
                f"--query-heads {query_heads} contradicts the config's num_attention_heads {layout.q_heads}"
            )
        return layout
    if all(v is None for v in explicit):
        if required:
            raise UserError("the KV figures need --model-config PATH or --layers, --kv-heads and --head-dim")
        return None
    missing = [n for n, v in zip(("--layers", "--kv-heads", "--head-dim"), explicit) if v is None]
    if missing:
        raise UserError(f"missing {', '.join(missing)} (explicit KV layout needs --layers, --kv-heads, --head-dim)")
    try:
        assert layers is not None and kv_heads is not None and head_dim is not None  # none missing: checked above
        return explicit_layout(layers, kv_heads, head_dim, kv_dtype or "bf16", q_heads=query_heads)
    except ValueError as exc:
        raise UserError(str(exc)) from None
