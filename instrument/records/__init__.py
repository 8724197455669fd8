"""Compact step records: the engine thread packs one record per engine step into a
preallocated buffer (instrument/records/format.py), the buffer crosses to an exporter
process over a non-blocking socket (exporter_process.py), and that process builds the spans of
docs/spans.md from the records (span_builder.py) and exports them with the OpenTelemetry
SDK's exporters (exporter_process.py). Nothing here imports torch or transformers.
"""

from __future__ import annotations

__all__: list[str] = []
