"""tokentrace analyzer: load traces into DuckDB and query them with the SQL in queries/."""
