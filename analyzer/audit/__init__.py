"""``tokentrace audit``: check a published latency report against its own numbers, the model
config and (optionally) the traces it claims to describe.

One module per report kind (:mod:`.vllm`, :mod:`.vllm_nightly`, :mod:`.aiperf`,
:mod:`.llmperf`, :mod:`.claims_file` for claims files and tokentrace's own JSON), shared
comparison in :mod:`.compare`, recomputation in ``queries/audit/*.sql``. Every check yields
a :class:`analyzer.audit.claims.Finding` (check, verdict pass | fail | cannot_check, detail,
numbers). Formulas and the real-world failure each check catches: docs/audit.md.
"""

from __future__ import annotations

from analyzer.audit.report import KINDS, audit_report, detect_kind

__all__ = ["KINDS", "audit_report", "detect_kind"]
