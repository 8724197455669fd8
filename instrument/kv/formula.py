"""KV-cache size math: the one place the formula lives.

For standard MHA / GQA / MQA storage with one K and one V tensor per KV head::

    kv_bytes_per_token = 2 x layers x kv_heads x head_dim x bytes_per_element
    kv_bytes(tokens)   = kv_bytes_per_token x tokens

The figures are *logical, unsharded* K/V payload. They omit physical costs that every result
lists in ``limitations``: quantization scales, padding / alignment / block rounding,
workspace buffers, and tensor-parallel sharding or replication of KV heads.

Architectures whose retained state is not one K and one V vector per KV head per token are
refused (:class:`UnsupportedArchitecture`) unless their real retained length is derivable
(sliding-window layers: see :func:`kv_layout_from_config`). Never a wrong number.

This module is imported by ``instrument`` (span attributes), ``analyzer`` (timeline
calculator) and the audit. It imports neither torch nor duckdb.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KV_DTYPE_BYTES",
    "PHYSICAL_MEMORY_OMISSIONS",
    "KVLayout",
    "UnsupportedArchitecture",
    "kv_bytes_per_token",
    "kv_bytes",
    "bytes_to_mib",
    "dtype_bytes",
    "kv_layout_from_config",
    "load_model_config",
    "query_heads_substitution_factor",
]

MIB = 2**20
GIB = 2**30

# Bytes per element of the KV cache for the dtypes users name. fp8 variants are 1 byte
# (scales are extra and listed as a limitation).
KV_DTYPE_BYTES: dict[str, int] = {
    "fp8": 1,
    "float8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp32": 4,
    "float32": 4,
    "float": 4,
}

PHYSICAL_MEMORY_OMISSIONS: tuple[str, ...] = (
    "quantization scales (per-tensor/per-head/per-block scale factors for fp8/int8 KV)",
    "padding, alignment and paged-block rounding of the cache",
    "workspace and activation buffers",
    "tensor-parallel sharding or replication of KV heads (and pipeline-parallel layer split)",
)


class UnsupportedArchitecture(ValueError):
    """The model's retained state is not one K and one V per KV head per token."""


def dtype_bytes(dtype: str | Any) -> int:
    """Bytes per element for a dtype name (``"bf16"``, ``"torch.float32"``) or a torch dtype.

    Raises ValueError naming the dtype when it is unknown.
    """
    name = str(dtype).lower().strip()
    if name.startswith("torch."):
        name = name[len("torch.") :]
    if name in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[name]
    raise ValueError(
        f"unknown KV dtype {dtype!r}: expected one of fp8, bf16, fp16, fp32 "
        f"(or {', '.join(sorted(KV_DTYPE_BYTES))})"
    )


def canonical_dtype(dtype: str | Any) -> str:
    """Short dtype name used in outputs: fp8, bf16, fp16, fp32 or int8."""
    name = str(dtype).lower().strip().removeprefix("torch.")
    if name in ("bf16", "bfloat16"):
        return "bf16"
    if name in ("fp16", "float16", "half"):
        return "fp16"
    if name in ("fp32", "float32", "float"):
        return "fp32"
    if name == "int8":
        return "int8"
    dtype_bytes(name)  # raises for unknown names
    return "fp8"


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """Logical KV bytes one token adds: 2 x layers x kv_heads x head_dim x bytes_per_element.

    All arguments are positive integers; the result is in bytes.
    """
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def kv_bytes(bytes_per_token: int, tokens: int) -> int:
    """Logical KV bytes for ``tokens`` retained tokens (bytes)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return bytes_per_token * tokens


def bytes_to_mib(n_bytes: float) -> float:
    """Bytes to MiB (2^20 bytes)."""
    return n_bytes / MIB


def query_heads_substitution_factor(q_heads: int, kv_heads: int) -> float:
    """How much a KV figure computed with query heads overstates the truth (q / kv)."""
    return q_heads / kv_heads


@dataclass(frozen=True)
class KVLayout:
    """The inputs of the KV formula for one model, and what the figure leaves out.

    ``layers`` counts the layers that keep a full-length cache. ``sliding_layers`` keep at
    most ``sliding_window_tokens`` past tokens each (0 when the model has none).
    """

    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    bytes_per_element: int
    layout: str  # mha | gqa | mqa
    sliding_layers: int = 0
    sliding_window_tokens: int | None = None
    source: str = "explicit"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_layers(self) -> int:
        return self.layers + self.sliding_layers

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.bytes_per_element

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes per token while every layer still holds it (all layers, full or sliding)."""
        return kv_bytes_per_token(self.total_layers, self.kv_heads, self.head_dim, self.bytes_per_element)

    def kv_bytes(self, tokens: int) -> int:
        """Logical KV bytes retained for a sequence of ``tokens`` tokens.

        Full layers keep every token; sliding layers keep min(tokens, window) tokens.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        per_layer = self.bytes_per_token_per_layer
        full = self.layers * per_layer * tokens
        if self.sliding_layers:
            assert self.sliding_window_tokens is not None
            full += self.sliding_layers * per_layer * min(tokens, self.sliding_window_tokens)
        return full

    @property
    def limitations(self) -> list[str]:
        out = ["logical unsharded K/V payload; omits: " + "; ".join(PHYSICAL_MEMORY_OMISSIONS)]
        if self.bytes_per_element == 1:
            out.append(
                "1-byte KV (fp8/int8): quantization scale tensors and their alignment are not counted"
            )
        out.extend(self.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.total_layers,
            "full_attention_layers": self.layers,
            "sliding_window_layers": self.sliding_layers,
            "sliding_window_tokens": self.sliding_window_tokens,
            "q_heads": self.q_heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "kv_dtype": self.dtype,
            "bytes_per_element": self.bytes_per_element,
            "layout": self.layout,
            "source": self.source,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }


def layout_name(q_heads: int, kv_heads: int) -> str:
    """``mha`` when every query head has its own KV head, ``mqa`` for one KV head, else ``gqa``."""
    if kv_heads == q_heads:
        return "mha"
    if kv_heads == 1:
        return "mqa"
    return "gqa"


def explicit_layout(
    layers: int,
    kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    q_heads: int | None = None,
) -> KVLayout:
    """A layout from explicit numbers (the ``--layers/--kv-heads/--head-dim/--kv-dtype`` flags)."""
    nbytes = dtype_bytes(kv_dtype)
    kv_bytes_per_token(layers, kv_heads, head_dim, nbytes)  # validates
    if q_heads is not None and (q_heads < kv_heads or q_heads % kv_heads):
        raise ValueError(
            f"q_heads ({q_heads}) must be a positive multiple of kv_heads ({kv_heads})"
        )
    return KVLayout(
        layers=layers,
        q_heads=q_heads if q_heads is not None else kv_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=canonical_dtype(kv_dtype),
        bytes_per_element=nbytes,
        layout=layout_name(q_heads, kv_heads) if q_heads is not None else "unknown",
        source="explicit",
    )


def load_model_config(config: str | Path | Mapping[str, Any] | Any) -> dict[str, Any]:
    """A HuggingFace config as a plain dict: from a config.json path, a dict, or a config object.

    Multimodal configs that nest the language model under ``text_config`` are unwrapped.
    """
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: model config not found") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a model config must be a JSON object")
    elif isinstance(config, Mapping):
        data = dict(config)
    elif hasattr(config, "to_dict"):
        data = config.to_dict()
    else:
        raise TypeError(f"cannot read a model config from {type(config).__name__}")
    text = data.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in data:
        merged = dict(text)
        merged.setdefault("torch_dtype", data.get("torch_dtype") or data.get("dtype"))
        data = merged
    return data


def _require_int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model config field {key!r} must be a positive integer, got {value!r}")
    return value


# Families whose configs carry a sliding_window value that their attention ignores unless
# use_sliding_window is true.
_SLIDING_OPT_IN = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})


def _sliding_window_in_use(cfg: Mapping[str, Any], model_type: str) -> bool:
    flag = cfg.get("use_sliding_window")
    if flag is not None:
        return bool(flag)
    return model_type not in _SLIDING_OPT_IN


def kv_layout_from_config(
    config: str | Path | Mapping[str, Any] | Any,
    kv_dtype: str | None = None,
) -> KVLayout:
    """Derive the KV layout of a HuggingFace causal LM from its config.

    Reads ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (default:
    ``num_attention_heads``), ``head_dim`` (default ``hidden_size / num_attention_heads``) and
    the dtype from ``kv_dtype`` (override), else ``torch_dtype`` / ``dtype``.

    Sliding-window layers (``layer_types`` entries ``sliding_attention``, or ``sliding_window``
    with ``use_sliding_window``) keep ``sliding_window - 1`` past tokens, as transformers'
    sliding caches do. Raises :class:`UnsupportedArchitecture` for MLA (``kv_lora_rank``),
    recurrent / hybrid layers, or a sliding window whose extent the config does not state.
    """
    cfg = load_model_config(config)
    model_type = str(cfg.get("model_type", "unknown"))
    if cfg.get("kv_lora_rank"):
        raise UnsupportedArchitecture(
            f"{model_type}: multi-head latent attention (kv_lora_rank={cfg['kv_lora_rank']}) "
            "caches a compressed latent vector per token, not K and V per KV head"
        )
    layers_total, q_heads, kv_heads, head_dim = _attention_shape(cfg)
    dtype, dtype_source = _config_kv_dtype(cfg, kv_dtype)
    nbytes = dtype_bytes(dtype)

    notes: list[str] = [f"bytes_per_element from {dtype_source} ({canonical_dtype(dtype)})"]
    sliding_layers = _sliding_layer_count(cfg, model_type, layers_total)
    window: int | None = None
    if sliding_layers:
        window, note = _sliding_window_tokens(cfg, model_type, sliding_layers)
        notes.append(note)
    return KVLayout(
        layers=layers_total - sliding_layers,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=canonical_dtype(dtype),
        bytes_per_element=nbytes,
        layout=layout_name(q_heads, kv_heads),
        sliding_layers=sliding_layers,
        sliding_window_tokens=window,
        source=f"config ({model_type})",
        notes=tuple(notes),
    )


def _attention_shape(cfg: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(layers, query heads, KV heads, head dim) a config states (ValueError when one is
    missing or not a positive integer; head dim from ``hidden_size`` when not stated)."""
    layers_total = _require_int(cfg, "num_hidden_layers")
    q_heads = _require_int(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or q_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ValueError(f"model config field 'num_key_value_heads' must be a positive integer, got {kv_heads!r}")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        hidden = _require_int(cfg, "hidden_size")
        if hidden % q_heads:
            raise ValueError(
                f"hidden_size {hidden} is not divisible by num_attention_heads {q_heads}; "
                "the config must state head_dim"
            )
        head_dim = hidden // q_heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"model config field 'head_dim' must be a positive integer, got {head_dim!r}")
    return layers_total, q_heads, kv_heads, head_dim


def _config_kv_dtype(cfg: Mapping[str, Any], kv_dtype: str | None) -> tuple[Any, str]:
    """(the KV dtype, where it came from): ``kv_dtype`` when given, else the config's
    ``torch_dtype`` / ``dtype`` (ValueError when it states neither)."""
    if kv_dtype is not None:
        return kv_dtype, "kv_dtype override"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if dtype is None:
        raise ValueError(
            "the model config states no torch_dtype/dtype: pass the KV dtype explicitly (--kv-dtype)"
        )
    return dtype, "config torch_dtype"


def _sliding_layer_count(cfg: Mapping[str, Any], model_type: str, layers_total: int) -> int:
    """How many layers are sliding-window ones (``layer_types``, else ``sliding_window`` in
    use on every layer); UnsupportedArchitecture for non-attention layers or a split this
    tool cannot read."""
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) != layers_total:
            raise ValueError(
                f"layer_types has {len(layer_types)} entries but num_hidden_layers is {layers_total}"
            )
        kinds = {str(t) for t in layer_types}
        other = kinds - {"full_attention", "sliding_attention", "attention"}
        if other:
            raise UnsupportedArchitecture(
                f"{model_type}: layer_types include {sorted(other)}: recurrent / state-space or "
                "other non-attention layers keep state that is not one K and V per KV head per token"
            )
        return sum(1 for t in layer_types if t == "sliding_attention")
    if cfg.get("sliding_window_pattern"):
        raise UnsupportedArchitecture(
            f"{model_type}: sliding_window_pattern without layer_types; which layers slide is "
            "not stated in a form this tool reads"
        )
    if cfg.get("sliding_window") and _sliding_window_in_use(cfg, model_type):
        max_window_layers = cfg.get("max_window_layers")
        if isinstance(max_window_layers, int) and 0 < max_window_layers < layers_total:
            raise UnsupportedArchitecture(
                f"{model_type}: sliding window applies to only part of the layers "
                f"(max_window_layers={max_window_layers}); the split is engine-specific"
            )
        return layers_total
    return 0


def _sliding_window_tokens(cfg: Mapping[str, Any], model_type: str, sliding_layers: int) -> tuple[int, str]:
    """(past tokens a sliding-window layer keeps, the note saying so); UnsupportedArchitecture
    when ``sliding_window`` does not state a window."""
    raw_window = cfg.get("sliding_window")
    if isinstance(raw_window, bool) or not isinstance(raw_window, int) or raw_window <= 1:
        raise UnsupportedArchitecture(
            f"{model_type}: {sliding_layers} sliding-window layers but sliding_window is {raw_window!r}"
        )
    # transformers' sliding-window cache layers keep the last (window - 1) tokens.
    window = raw_window - 1
    return window, (f"{sliding_layers} sliding-window layers keep at most {window} tokens "
                    f"(sliding_window {raw_window} - 1, as transformers' sliding caches retain)")
