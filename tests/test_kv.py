"""KV-cache math: the worked example's figures, its broken MHA-for-GQA case, and config parsing."""

from __future__ import annotations

import json

import pytest

from instrument.kv.formula import (
    UnsupportedArchitecture,
    bytes_to_mib,
    dtype_bytes,
    explicit_layout,
    kv_bytes_per_token,
    kv_layout_from_config,
    query_heads_substitution_factor,
)

LLAMA_70B_LIKE = {
    "model_type": "llama",
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


def test_seed_kv_figures() -> None:
    per_token = kv_bytes_per_token(80, 8, 128, 2)
    assert per_token == 327_680
    assert bytes_to_mib(per_token) == 0.3125
    layout = explicit_layout(80, 8, 128, "bf16", q_heads=64)
    assert layout.kv_bytes(1025) == 335_872_000
    assert bytes_to_mib(layout.kv_bytes(1025)) == 320.3125
    assert layout.kv_bytes(1025 + 149) == 384_696_320
    assert bytes_to_mib(layout.kv_bytes(1025 + 149)) == 366.875
    assert layout.layout == "gqa"


def test_seed_broken_query_heads_case_is_8x() -> None:
    wrong = kv_bytes_per_token(80, 64, 128, 2)
    assert bytes_to_mib(wrong) == 2.5
    assert wrong / kv_bytes_per_token(80, 8, 128, 2) == query_heads_substitution_factor(64, 8) == 8


def test_alt_exercise_fp8() -> None:
    layout = explicit_layout(48, 4, 128, "fp8", q_heads=32)
    assert layout.kv_bytes_per_token == 49_152
    assert bytes_to_mib(layout.kv_bytes_per_token) == 0.046875
    assert layout.kv_bytes(4096) / 2**30 == 0.1875
    assert any("quantization scale" in item for item in layout.limitations)


def test_config_gqa_defaults_and_dtype_override() -> None:
    layout = kv_layout_from_config(LLAMA_70B_LIKE)
    assert (layout.total_layers, layout.kv_heads, layout.head_dim, layout.bytes_per_element) == (80, 8, 128, 2)
    assert layout.kv_bytes_per_token == 327_680
    assert kv_layout_from_config(LLAMA_70B_LIKE, kv_dtype="fp8").kv_bytes_per_token == 163_840
    mha = dict(LLAMA_70B_LIKE)
    del mha["num_key_value_heads"]  # defaults to num_attention_heads
    assert kv_layout_from_config(mha).layout == "mha"
    assert kv_layout_from_config(mha).kv_bytes_per_token == 2_621_440


def test_smollm2_config_from_file(tmp_path) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert kv_layout_from_config(path).kv_bytes_per_token == 23_040
    assert kv_layout_from_config(tmp_path, kv_dtype="fp32").kv_bytes_per_token == 46_080  # folder works too


def test_mqa_layout_name() -> None:
    assert explicit_layout(4, 1, 64, "fp16", q_heads=8).layout == "mqa"


def test_sliding_window_layers_keep_window_minus_one() -> None:
    cfg = {"model_type": "gemma3_text", "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 256, "torch_dtype": "bfloat16", "sliding_window": 512,
           "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    layout = kv_layout_from_config(cfg)
    per_layer = 2 * 1 * 256 * 2
    assert layout.sliding_layers == 5 and layout.sliding_window_tokens == 511
    assert layout.kv_bytes(100) == 6 * per_layer * 100
    assert layout.kv_bytes(2000) == per_layer * 2000 + 5 * per_layer * 511


def test_qwen2_sliding_window_off_unless_enabled() -> None:
    cfg = {"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
           "hidden_size": 896, "torch_dtype": "bfloat16", "sliding_window": 32768, "use_sliding_window": False}
    layout = kv_layout_from_config(cfg)
    assert layout.sliding_layers == 0
    assert layout.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"kv_lora_rank": 512}, "latent"),
        ({"layer_types": ["full_attention", "mamba"]}, "non-attention"),
        ({"sliding_window_pattern": 6}, "sliding_window_pattern"),
    ],
)
def test_unsupported_architectures_refused(extra, reason) -> None:
    cfg = {"model_type": "x", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
           "torch_dtype": "float32", **extra}
    with pytest.raises(UnsupportedArchitecture, match=reason):
        kv_layout_from_config(cfg)


def test_bad_inputs_name_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_layout_from_config({"num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float32"})
    with pytest.raises(ValueError, match="torch_dtype"):
        kv_layout_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(ValueError, match="unknown KV dtype"):
        dtype_bytes("fp12")
    with pytest.raises(ValueError, match="kv_heads must be a positive integer"):
        kv_bytes_per_token(2, 0, 64, 2)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json:1: not valid JSON"):
        kv_layout_from_config(bad)
    assert dtype_bytes("torch.float16") == 2
