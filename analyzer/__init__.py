"""tokentrace analyzer: load traces into DuckDB and query them with the SQL in queries/.

Layers, bottom to top (docs/architecture.md; tests/test_layers.py enforces that no import
climbs): ``errors`` → ``db`` → ``query`` → ``formats`` → ``collect``, ``audit``, ``report``
→ ``verbs`` → ``cli``.
"""
