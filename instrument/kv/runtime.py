"""KV attributes from the cache ``generate`` really built (dtype as held at run time).

The formula lives in :mod:`instrument.kv.formula`; this module only decides its inputs from the
returned cache: the dtype its key tensors hold (a GGUF model dequantized to fp32 on CPU holds
fp32 even when its config says bf16), whether the cache is static (pre-allocated), and a
cross-check: for a dynamic cache the summed ``nbytes`` of the returned K/V tensors must equal
``batch x layout.kv_bytes(tokens held)``. When they disagree, or the cache cannot be read,
the layout is ``unsupported:<reason>`` and no byte figures are written. Never a wrong number.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from instrument.kv import formula as kv

__all__ = ["RuntimeKV", "inspect_runtime_kv", "cache_tensor_bytes"]


@dataclass(frozen=True)
class RuntimeKV:
    """KV figures for spans. ``layout is None`` means unsupported (``layout_name`` says why)."""

    layout: kv.KVLayout | None
    layout_name: str
    allocated_bytes: int | None = None

    def bytes_held(self, tokens: int) -> int | None:
        """Logical KV bytes of one sequence holding ``tokens`` tokens (None when unsupported)."""
        return self.layout.kv_bytes(tokens) if self.layout is not None else None

    def prefill_attributes(self) -> dict[str, Any]:
        """The formula's inputs, for the prefill span (``tokentrace.kv.*``)."""
        if self.layout is None:
            return {"tokentrace.kv.layout": self.layout_name}
        out: dict[str, Any] = {
            "tokentrace.kv.layers": self.layout.total_layers,
            "tokentrace.kv.heads": self.layout.kv_heads,
            "tokentrace.kv.head_dim": self.layout.head_dim,
            "tokentrace.kv.dtype": self.layout.dtype,
            "tokentrace.kv.layout": self.layout_name,
            "tokentrace.kv.bytes_per_token": self.layout.kv_bytes_per_token,
        }
        if self.allocated_bytes is not None:
            out["tokentrace.kv.allocated_bytes"] = self.allocated_bytes
        return out


def _unsupported(reason: str) -> RuntimeKV:
    return RuntimeKV(layout=None, layout_name="unsupported:" + reason)


def cache_tensor_bytes(cache: Any) -> int:
    """Summed ``nbytes`` of every layer's key and value tensors of a transformers Cache."""
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is not None and hasattr(tensor, "nbytes"):
                total += int(tensor.nbytes)
    return total


# (id(config), dtype) -> (weak reference to the config, layout). Reading a transformers
# config (``to_dict``) costs ~50-100 µs per generate call; the layout of one config object
# and dtype does not change between calls, and every call still cross-checks it against the
# bytes the returned cache really holds.
_LAYOUTS: dict[tuple[int, str], tuple[Any, kv.KVLayout]] = {}


def _layout_for(config: Any, dtype: str) -> kv.KVLayout:
    key = (id(config), dtype)
    cached = _LAYOUTS.get(key)
    if cached is not None and cached[0]() is config:
        return cached[1]
    layout = kv.kv_layout_from_config(config, kv_dtype=dtype)
    try:
        ref = weakref.ref(config)
    except TypeError:
        return layout
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    _LAYOUTS[key] = (ref, layout)
    return layout


def inspect_runtime_kv(model: Any, cache: Any, *, batch_size: int, tokens_held: int) -> RuntimeKV:
    """Derive the KV layout of ``model`` with the dtype ``cache`` holds, cross-checked against it.

    ``tokens_held``: tokens per sequence the cache holds after generate (padded prompt length
    + decode steps); ``batch_size``: sequences in the cache.
    """
    if cache is None:
        return _unsupported("no KV cache returned (use_cache=False or a cache-less model)")
    layers = getattr(cache, "self_attention_cache", cache)
    layers = getattr(layers, "layers", None)
    if not layers:
        return _unsupported(f"{type(cache).__name__} has no per-layer K/V tensors to read")
    kinds = {type(layer).__name__ for layer in layers}
    if any("Quantized" in name for name in kinds):
        return _unsupported(f"quantized KV cache ({', '.join(sorted(kinds))}): scales and packing differ from the formula")
    if any("LinearAttention" in name for name in kinds):
        return _unsupported("linear-attention / recurrent layers keep state that is not one K and V per KV head per token")
    keys = getattr(layers[0], "keys", None)
    if keys is None or not hasattr(keys, "dtype"):
        return _unsupported(f"{type(layers[0]).__name__} holds no key tensor after generate")
    try:
        layout = _layout_for(model.config, str(keys.dtype))
    except kv.UnsupportedArchitecture as exc:
        return _unsupported(str(exc))
    except ValueError as exc:  # e.g. a cache dtype the formula has no byte size for
        return _unsupported(f"cache dtype {keys.dtype}: {exc}")
    name = layout.layout if layout.layout != "unknown" else "gqa"
    measured_bytes = cache_tensor_bytes(cache)
    if any(getattr(layer, "is_compileable", False) and "Static" in type(layer).__name__ for layer in layers):
        return RuntimeKV(layout=layout, layout_name=name, allocated_bytes=measured_bytes)
    expected_bytes = batch_size * layout.kv_bytes(tokens_held)
    if measured_bytes != expected_bytes:
        return _unsupported(
            f"the returned cache holds {measured_bytes} bytes for {batch_size} x {tokens_held} tokens "
            f"but the formula gives {expected_bytes}"
        )
    return RuntimeKV(layout=layout, layout_name=name)
