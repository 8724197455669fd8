"""OpenTelemetry plumbing: tracing setup, the span writer, OTLP/JSON files, export health, stopping."""

from __future__ import annotations

__all__: list[str] = []
