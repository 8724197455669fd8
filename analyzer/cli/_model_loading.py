"""Model loading as the CLI's verbs want it: without transformers' progress bars. Not a verb."""

from __future__ import annotations

__all__ = ["quiet_model_loading"]


def quiet_model_loading() -> None:
    """Turn off transformers' progress bars ("Loading weights: 100%|####| 272/272"), which
    leak into a server's log and the demo's output; nothing when transformers is absent."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
