"""The inputs: one reader per input shape (and the request-timeline CSV) producing the canonical rows, the loader that drives them, and the Parquet dump writer.

- :mod:`load` — ``load_paths``: files into the tables, counted read / loaded / duplicate / rejected
- :mod:`timeline` — the worked example's request-timeline CSV as a synthetic trace
- :mod:`parquet_export` — the tables as a Hive-partitioned Parquet dump (``tokentrace export``)

- :mod:`otlp_json` — OTLP/JSON lines, documents, Jaeger api_v3 wrapper
- :mod:`otlp_json_duckdb` (SQL in :mod:`otlp_json_sql`) — the bulk path for large OTLP/JSON
  lines files: DuckDB ``read_json`` straight into the tables, handing anything unusual to
  :mod:`otlp_json`
- :mod:`otlp_proto` — OTLP/protobuf, length-prefixed (Collector file exporter), zstd per message
- :mod:`jaeger_json` — Jaeger /api/traces, UI trace object, bare span array
- :mod:`parquet_dump` — Parquet written by ``tokentrace export``
- :mod:`inputs` — paths, globs, stdin, gzip/zstd, sniffing; :mod:`values` — field parsing;
  :mod:`canonical` — row layout and the counting sink; :mod:`stage` — staging and dedupe.

See docs/loading.md for what each reader accepts and rejects.
"""

__all__: list[str] = []  # a package of modules: import what you need from each
