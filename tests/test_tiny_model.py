"""The offline tiny Llama GQA model: built from a config with a locally trained tokenizer, cached on disk."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from instrument.hf.tiny_model import TINY_MODEL_VERSION, load_tiny_model, tiny_model_dir
from instrument.kv import formula as kv


def test_tiny_model_is_a_gqa_llama_with_a_working_tokenizer(tmp_path):
    model, tok = load_tiny_model(tmp_path / "tiny")
    cfg = model.config
    assert (cfg.model_type, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers) == ("llama", 8, 2, 2)
    layout = kv.kv_layout_from_config(cfg, kv_dtype="fp32")
    assert (layout.layout, layout.kv_bytes_per_token) == ("gqa", 256)
    text = "The quick brown fox, onsen access in Kyoto!"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert cfg.name_or_path == "tokentrace/" + TINY_MODEL_VERSION


def test_build_is_cached_and_deterministic(tmp_path):
    directory = tmp_path / "tiny"
    first, _ = load_tiny_model(directory)
    stamp = (directory / "config.json").stat().st_mtime_ns
    second, _ = load_tiny_model(directory)
    assert (directory / "config.json").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert a.equal(b), name
    assert tiny_model_dir(directory) == directory
