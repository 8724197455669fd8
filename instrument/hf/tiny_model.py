"""A tiny Llama-style GQA model and a locally trained tokenizer, built offline.

Tests, the demo and the gateway need a real causal LM without the hub or the network. The
model has 8 query heads and 2 KV heads (GQA), 2 layers, hidden size 64 (head_dim 8), random
weights from a fixed seed; the tokenizer is a byte-level BPE trained with ``tokenizers`` on
a small embedded corpus, with a ChatML chat template. Built once and saved to a cache
directory (``$TOKENTRACE_CACHE_DIR`` or ``~/.cache/tokentrace``), then loaded from there.

KV figures of the default build (fp32): 2 x 2 layers x 2 kv_heads x 8 head_dim x 4 bytes =
256 bytes per token.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "TINY_MODEL_VERSION",
    "TINY_CHAT_TEMPLATE",
    "cache_root",
    "tiny_model_dir",
    "build_tiny_model",
    "load_tiny_model",
]

TINY_MODEL_VERSION = "tiny-llama-gqa-v1"
EOS_TOKEN = "<|im_end|>"
BOS_TOKEN = "<|im_start|>"
PAD_TOKEN = "<|pad|>"
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """
One API call hides an entire serving pipeline: request validation, tokenization, admission
control, scheduling, model execution, sampling, streaming, and telemetry. The travel copilot
asks for wheelchair-accessible hotels in Kyoto under $200/night with onsen access.
During prefill the model processes every input token and materializes K and V states for
every attention layer. On each decode step the engine feeds in the previously selected
token, reads the retained KV state, computes new logits, samples the next token, and streams
the decoded text chunk. Time to first token, time per output token, inter-token latency and
end-to-end latency reconcile from explicit assumptions. Grouped-query attention shares each
key and value head across a group of query heads. The quick brown fox jumps over the lazy
dog. 0123456789 Hello, world! How are you today? Fine, thanks: the weather is sunny.
"""


def cache_root() -> Path:
    """Directory for built or converted models: ``$TOKENTRACE_CACHE_DIR`` or ``~/.cache/tokentrace``."""
    env = os.environ.get("TOKENTRACE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tokentrace"


def tiny_model_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the tiny model is (or will be) saved."""
    return Path(cache_dir) if cache_dir is not None else cache_root() / TINY_MODEL_VERSION


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in _CORPUS.splitlines() if line.strip()]
    tok.train_from_iterator(lines * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def build_tiny_model(
    directory: str | Path,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    q_heads: int = 8,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Build the tiny model + tokenizer and save both to ``directory`` (overwritten). Returns it."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=q_heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // q_heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename, so a concurrent reader never sees half a model.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tiny_model(
    cache_dir: str | Path | None = None,
    *,
    dtype: Any = None,
    device: str | None = None,
) -> tuple[Any, Any]:
    """The tiny model (eval mode) and its tokenizer, built on first use and cached on disk.

    ``dtype``: a torch dtype (default float32); ``device``: e.g. ``"cuda"`` (default CPU).
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    directory = tiny_model_dir(cache_dir)
    if not (directory / "config.json").exists() or not (directory / "tokenizer.json").exists():
        build_tiny_model(directory)
    model = LlamaForCausalLM.from_pretrained(directory, dtype=dtype or torch.float32)
    model.config.name_or_path = "tokentrace/" + TINY_MODEL_VERSION
    if device is not None:
        model = model.to(device)  # type: ignore[arg-type]  # transformers types its decorated .to() as unbound
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return model.eval(), tokenizer
