"""Channel 1's decoder in the exporter process: vLLM step rows in, spans out.

:class:`RecordConsumer` unpacks each message (instrument/vllm/rows.py), reads the rows in order
into step facts with :class:`~instrument.vllm.steps.StepReader` and hands them to
:meth:`instrument.vllm.spans.SpanBuilder.consume`, which writes the span contract
(docs/spans.md "vLLM"). Runs outside vLLM's processes and imports no vLLM.
"""

from __future__ import annotations

import logging
from typing import Any

from instrument.otel.tracing import get_tracer
from instrument.vllm.keep import DetailKeeper
from instrument.vllm.request_ids import external_request_id
from instrument.vllm.rows import IDLE, unpack
from instrument.vllm.sampling import sampling_from_env
from instrument.vllm.spans import SpanBuilder
from instrument.vllm.steps import StepReader

__all__ = ["RecordConsumer"]

log = logging.getLogger("tokentrace.vllm")


class RecordConsumer:
    """Channel 1's decoder in the exporter process: payloads in, spans out (one thread)."""

    def __init__(self, tracer_provider: Any) -> None:
        self.provider = tracer_provider
        # engine_step spans: the ratio the engine side read from the same environment (inherited);
        # so is the keep policy (its warnings were said by the engine side, at start)
        sampling = sampling_from_env()
        self.keeper = DetailKeeper(sampling.keep_policy) if sampling.keep_policy is not None else None
        self.builder = SpanBuilder(get_tracer(tracer_provider), request_id_of=external_request_id,
                                   on_idle=self._idle, step_bound=sampling.step_bound, keeper=self.keeper)
        self.reader = StepReader()
        self.at_rest = True  # the last message ended with the engine idle (nothing held after it)

    def _idle(self) -> None:
        """No live request: export what was built now (the engine went idle)."""
        self.provider.force_flush()

    def feed(self, payload: memoryview) -> None:
        """Build the spans of every row in ``payload`` (ValueError: malformed; the rows read
        before the fault keep their spans)."""
        rows = unpack(payload)
        self.at_rest = rows[-1][0] == IDLE  # the engine held no request at this send
        try:
            for facts in self.reader.read(rows):
                if facts is None:  # the scheduler held no request
                    self.builder.engine_idle()
                    continue
                try:
                    self.builder.consume(facts)
                except Exception:  # a bug here must not stop the exporter; logged with its step
                    log.exception("tokentrace: spans of vLLM engine step %s not written", facts.step)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"vLLM step records: a row does not read ({type(exc).__name__}: {exc})") from None

    def close(self) -> None:
        """Shutdown: end the requests still running as failed at the engine's last send (its
        shutdown; :meth:`~instrument.vllm.spans.SpanBuilder.end_at_shutdown`: their
        ``engine_request`` spans are exported, ``error.type`` ``shutdown``) and the open engine
        trace; say in a line each how many requests were still running, how many steps
        were scheduled and never updated (an engine error, or in flight at shutdown) and how
        many sampled steps got no engine_step span (held partially by the engine)."""
        live = self.builder.end_at_shutdown(max(self.reader.sent_ns, self.builder.last_end_ns))
        if live:
            log.warning("tokentrace: %d vLLM requests still running at shutdown: ended as failed (error.type "
                        "shutdown)", live)
        never = self.reader.let_go + len(self.reader._opened)
        if never:
            log.warning("tokentrace: %d vLLM engine steps scheduled and never updated: not traced", never)
        if self.keeper is not None:
            log.info("tokentrace: vLLM keep policy (%s): %s", self.keeper.policy.describe(), self.keeper.said())
        if self.builder.partial_steps_sampled:
            log.warning("tokentrace: %d vLLM engine steps sampled here but held partially by the engine (its "
                        "TOKENTRACE_VLLM_STEP_SAMPLE_RATIO differed): no engine_step span",
                        self.builder.partial_steps_sampled)
