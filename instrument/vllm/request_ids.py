"""vLLM's request ids: the engine core's id for a request and the one its frontend shows."""

from __future__ import annotations

import os

__all__ = ["external_request_id"]


def external_request_id(req_id: str) -> str:
    """The id vLLM's ``llm_request`` span carries (``gen_ai.request.id``) for an engine-core id.

    vLLM 0.32's frontend appends ``-`` and 8 random characters to the client-facing id
    (``InputProcessor.assign_request_id``) unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set.
    """
    if os.environ.get("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0").lower() in ("1", "true"):
        return req_id
    head, sep, tail = req_id.rpartition("-")
    return head if sep and len(tail) == 8 else req_id
