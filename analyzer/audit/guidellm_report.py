"""Reading a guidellm report (``benchmarks.json`` or its YAML twin, guidellm >= 0.8, report
schema ``metadata.version`` 2) into DuckDB tables for the audit's SQL.

``guidellm_records``: one row per per-request record of ``benchmarks[i].requests.<status>``
(status successful | incomplete | errored) with its raw timings (``info.timings``, seconds
since the epoch), usage (tokens) and the per-request figures guidellm stored beside them
(``stored_*``); ``guidellm_windows``: each benchmark's measured window
(``scheduler_metrics.measure_start_time`` ... ``measure_end_time``, s), the window every
guidellm figure is computed over. Bad input: :class:`AuditInputError`, one line naming the
file and the field (``benchmarks[0].requests.successful[3].info.timings.request_start``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from analyzer.audit.compare import create_table
from analyzer.audit.inputs import read_json
from analyzer.errors import AuditInputError

__all__ = ["STATUSES", "GuidellmReport", "is_guidellm_report", "load_guidellm", "read_report_file"]

STATUSES = ("successful", "incomplete", "errored")
SCHEMA_VERSION = 2

_TIMINGS = ("request_start", "resolve_start", "request_end", "resolve_end", "first_token_iteration",
            "first_output_token_iteration", "last_token_iteration", "last_request_sent", "request_sent_sum",
            "token_received_sum", "targeted_start", "predecessor_completed")
_TIMING_COUNTS = ("token_iterations", "request_iterations", "request_sent_count", "token_received_count")
_STORED = {"stored_request_latency_s": "request_latency", "stored_ttft_ms": "time_to_first_token_ms",
           "stored_ttfot_ms": "time_to_first_output_token_ms", "stored_tpot_ms": "time_per_output_token_ms",
           "stored_itl_ms": "inter_token_latency_ms", "stored_tokens_per_second": "tokens_per_second",
           "stored_output_tokens_per_second": "output_tokens_per_second", "stored_prompt_tokens": "prompt_tokens",
           "stored_output_tokens": "output_tokens", "stored_total_tokens": "total_tokens"}
_RECORD_COLUMNS = {
    "benchmark": "INTEGER", "status": "VARCHAR", "record_index": "INTEGER", "response_id": "VARCHAR",
    "request_id": "VARCHAR", "error": "VARCHAR",
    "request_start": "DOUBLE", "resolve_start": "DOUBLE", "request_end": "DOUBLE", "resolve_end": "DOUBLE",
    "first_token": "DOUBLE", "first_output_token": "DOUBLE", "last_token": "DOUBLE", "last_request_sent": "DOUBLE",
    "request_sent_sum": "DOUBLE", "token_received_sum": "DOUBLE", "targeted_start": "DOUBLE",
    "predecessor_completed": "DOUBLE", "preceding_nodes": "BIGINT",
    "token_iterations": "BIGINT", "request_iterations": "BIGINT", "request_sent_count": "BIGINT",
    "token_received_count": "BIGINT", "prompt_tokens": "DOUBLE", "output_usage_tokens": "DOUBLE",
    **{name: "DOUBLE" for name in _STORED},
}


@dataclass(frozen=True)
class GuidellmReport:
    """What the audit needs of a parsed report beside its tables: the file, guidellm's version,
    and per benchmark its summary ``metrics`` object, ``config`` and record counts."""

    path: Path
    guidellm_version: str
    benchmarks: list[dict[str, Any]]
    records: list[dict[str, int]]  # per benchmark: status -> number of records in the file


def is_guidellm_report(data: Any) -> bool:
    """A guidellm report's top level: a ``benchmarks`` list (with ``metadata`` from guidellm 0.8 on;
    claims files and the other tools' reports have neither)."""
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list)


def read_report_file(path: Path) -> Any:
    """The parsed JSON, or YAML for ``.yaml`` / ``.yml`` (guidellm's YAML output)."""
    if path.suffix.lower() not in (".yaml", ".yml"):
        return read_json(path)
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise AuditInputError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None


def _number(obj: Mapping[str, Any], key: str, path: Path, where: str, *, required: bool = False) -> float | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise AuditInputError(f"{path}: {where}.{key} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AuditInputError(f"{path}: {where}.{key} = {value!r} is not a number")
    return float(value)


def _mapping(obj: Any, key: str, path: Path, where: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    if not isinstance(value, dict):
        raise AuditInputError(f"{path}: {where}.{key} is missing or not an object"
                              + (" (truncated or not a guidellm >= 0.8 report?)" if value is None else ""))
    return value


def _schema(path: Path, data: Any) -> str:
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise AuditInputError(f"{path}: a guidellm report is an object with a 'benchmarks' list")
    meta = data.get("metadata")
    if not isinstance(meta, dict):
        raise AuditInputError(f"{path}: no 'metadata' object: a guidellm report from before 0.8 (its "
                              f"schema is not read here; rerun with guidellm >= 0.8)")
    version = meta.get("version")
    if version != SCHEMA_VERSION:
        raise AuditInputError(f"{path}: metadata.version = {version!r}: report schema {SCHEMA_VERSION} "
                              f"(guidellm >= 0.8) is read here (guidellm_version {meta.get('guidellm_version')!r})")
    if not data["benchmarks"]:
        raise AuditInputError(f"{path}: 'benchmarks' is empty: guidellm ran no benchmark")
    return str(meta.get("guidellm_version"))


def _record_row(path: Path, rec: Any, where: str, benchmark: int, status: str, index: int) -> tuple[Any, ...]:
    if not isinstance(rec, dict):
        raise AuditInputError(f"{path}: {where} is not an object")
    info = _mapping(rec, "info", path, where)
    timings = _mapping(info, "timings", path, f"{where}.info")
    tw = f"{where}.info.timings"
    values: dict[str, Any] = {"benchmark": benchmark, "status": status, "record_index": index,
                              "response_id": rec.get("response_id"), "request_id": rec.get("request_id"),
                              "error": None if info.get("error") is None else str(info.get("error"))}
    renamed = {"first_token_iteration": "first_token", "first_output_token_iteration": "first_output_token",
               "last_token_iteration": "last_token"}
    for key in _TIMINGS:
        values[renamed.get(key, key)] = _number(timings, key, path, tw)
    for key in _TIMING_COUNTS:
        count = _number(timings, key, path, tw)
        if count is not None and count != int(count):
            raise AuditInputError(f"{path}: {tw}.{key} = {count!r} is not a whole number")
        values[key] = None if count is None else int(count)
    if values["token_iterations"] is None:
        values["token_iterations"] = 0  # guidellm's default
    preceding = _number(info, "preceding_nodes", path, f"{where}.info")
    values["preceding_nodes"] = None if preceding is None else int(preceding)
    for key, column in (("input_metrics", "prompt_tokens"), ("output_metrics", "output_usage_tokens")):
        metrics = _mapping(rec, key, path, where)
        values[column] = _number(metrics, "total_tokens", path, f"{where}.{key}")
    for column, key in _STORED.items():
        values[column] = _number(rec, key, path, where)
    return tuple(values[c] for c in _RECORD_COLUMNS)


def load_guidellm(path: Path, data: Any, con: duckdb.DuckDBPyConnection) -> GuidellmReport:
    """Create ``guidellm_records`` and ``guidellm_windows`` from a parsed report."""
    version = _schema(path, data)
    rows: list[tuple[Any, ...]] = []
    windows: list[tuple[Any, ...]] = []
    records: list[dict[str, int]] = []
    benchmarks: list[dict[str, Any]] = []
    for b, bench in enumerate(data["benchmarks"]):
        where = f"benchmarks[{b}]"
        if not isinstance(bench, dict):
            raise AuditInputError(f"{path}: {where} is not an object")
        _mapping(bench, "metrics", path, where)
        sched = _mapping(bench, "scheduler_metrics", path, where)
        start = _number(sched, "measure_start_time", path, f"{where}.scheduler_metrics", required=True)
        end = _number(sched, "measure_end_time", path, f"{where}.scheduler_metrics", required=True)
        windows.append((b, start, end))
        requests = _mapping(bench, "requests", path, where)
        counts: dict[str, int] = {}
        for status in STATUSES:
            items = requests.get(status)
            if items is None:
                items = []
            if not isinstance(items, list):
                raise AuditInputError(f"{path}: {where}.requests.{status} is not a list")
            counts[status] = len(items)
            for i, rec in enumerate(items):
                rows.append(_record_row(path, rec, f"{where}.requests.{status}[{i}]", b, status, i))
        records.append(counts)
        benchmarks.append(bench)
    create_table(con, "guidellm_records", _RECORD_COLUMNS, rows)
    create_table(con, "guidellm_windows", {"benchmark": "INTEGER", "measure_start": "DOUBLE",
                                           "measure_end": "DOUBLE"}, windows)
    return GuidellmReport(path, version, benchmarks, records)
