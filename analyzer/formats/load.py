"""Load trace files into the canonical tables: inputs -> readers -> dedupe -> insert -> accounting.

Example::

    con = connect("traces.duckdb")
    report = load_paths(con, ["otel-traces.jsonl.zst"], lenient=True)
    print(report.files[0].spans_loaded)

Every file gets one row in ``loads`` (records and spans read, loaded, deduplicated and
rejected by reason) and, in lenient mode, each rejected record is kept raw in ``rejects``.
One call has one ``load_id``; each file is one transaction: in strict mode the first bad
record raises :class:`LoadError` and nothing of that file stays in the database (files
before it stay loaded; loading them again only counts duplicates).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import duckdb

from analyzer.db.store import next_load_id, record_load
from analyzer.errors import LoadError
from analyzer.formats import otlp_json, otlp_json_duckdb, otlp_proto, parquet_dump, stage
from analyzer.formats.canonical import LENIENT_HINT, Reject, RowSink
from analyzer.formats.inputs import (
    GZIP_MAGIC,
    INPUT_FORMATS,
    ZSTD_MAGIC,
    InputFile,
    detect_format,
    expand_inputs,
    open_stream,
)
from analyzer.formats.jaeger_json import is_jaeger_document, read_jaeger_document

__all__ = ["FileReport", "INPUT_FORMATS", "LoadReport", "load_paths"]


@dataclass
class FileReport:
    """What one input file gave (the same figures as its ``loads`` row). Counts are records/spans."""

    file: str
    format: str
    records_read: int = 0
    spans_read: int = 0
    spans_loaded: int = 0
    duplicates_identical: int = 0
    duplicates_conflicting: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    incomplete_last_line: bool = False

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())


@dataclass
class LoadReport:
    """The result of :func:`load_paths`: one :class:`FileReport` per input, in order."""

    load_id: int
    files: list[FileReport]

    def total(self, name: str) -> int:
        """Sum of one integer field over all files (e.g. ``total("spans_loaded")``)."""
        return sum(getattr(f, name) for f in self.files)


BULK_MIN_BYTES = 1 << 20  # smaller OTLP/JSON lines files go straight to the Python reader
ProgressFn = Callable[[str, int, int | None], None]  # (file, bytes_done_increment, file_size_bytes)


def load_paths(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[str],
    *,
    lenient: bool = False,
    input_format: str = "auto",
    progress: ProgressFn | None = None,
    batch_spans: int = 20_000,
) -> LoadReport:
    """Load files, directories, globs or ``-`` (stdin) into ``con``'s canonical tables.

    ``input_format`` is one of ``INPUT_FORMATS`` (``auto`` sniffs each file). Strict mode
    (default) raises :class:`LoadError` (``file:line: reason``) on the first bad record;
    ``lenient`` loads the rest and keeps rejects. Spans are deduplicated on (trace_id, span_id)
    against the same file, earlier files and the database.
    """
    if input_format not in INPUT_FORMATS:
        raise LoadError("--input-format", None, "invalid_option", f"{input_format!r}: expected one of {', '.join(INPUT_FORMATS)}")
    inputs = expand_inputs(paths)
    load_id = next_load_id(con)
    files: list[FileReport] = []
    for index, f in enumerate(inputs):
        try:
            files.append(_load_one(con, f, load_id, lenient, input_format, progress, batch_spans))
        except LoadError as exc:  # the files before it stay committed: the error says which
            exc.load_id, exc.committed = load_id, list(files)
            exc.not_read = [later.name for later in inputs[index + 1:]]
            raise
    return LoadReport(load_id, files)


def _load_one(
    con: duckdb.DuckDBPyConnection, f: InputFile, load_id: int, lenient: bool, input_format: str,
    progress: ProgressFn | None, batch_spans: int,
) -> FileReport:  # fmt: skip
    """One file, one transaction: on any error nothing of this file stays in the database."""
    report = _load_bulk(con, f, load_id, input_format, progress)
    if report is not None:
        return report
    con.execute("BEGIN TRANSACTION")
    try:
        report = _load_in_transaction(con, f, load_id, lenient, input_format, progress, batch_spans)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        stage.drop_stage(con)
    return report


def _load_in_transaction(
    con: duckdb.DuckDBPyConnection, f: InputFile, load_id: int, lenient: bool, input_format: str,
    progress: ProgressFn | None, batch_spans: int,
) -> FileReport:  # fmt: skip
    stage.create_stage(con)
    sink = _sink(con, f, lenient, progress, batch_spans)
    fmt = _read(con, f, sink, input_format)
    sink.flush_now()
    result = stage.commit_stage(con, load_id)
    assert result is not None  # insert_if_conflicts (the default): a result
    for line, ordinal, trace_id, span_id, raw in result.conflicting:
        sink.reject(Reject(line, ordinal, "conflicting_duplicate", raw, trace_id, span_id,
                           "same trace and span id as an earlier span, different content"))  # fmt: skip
    reasons = dict(sink.reasons)
    report = FileReport(
        f.name, fmt, sink.records_read, sink.spans_read, result.spans_loaded, result.duplicates_identical,
        reasons.get("conflicting_duplicate", 0), reasons, sink.incomplete_last_line,
    )  # fmt: skip
    _record(con, load_id, report)
    _insert_rejects(con, load_id, f.name, sink.rejects)
    return report


def _record(con: duckdb.DuckDBPyConnection, load_id: int, report: FileReport) -> None:
    record_load(
        con, load_id, report.file, report.format, records_read=report.records_read, spans_read=report.spans_read,
        spans_loaded=report.spans_loaded, duplicates_identical=report.duplicates_identical,
        duplicates_conflicting=report.duplicates_conflicting, rejected_by_reason=report.rejected_by_reason,
        incomplete_last_line=report.incomplete_last_line,
    )  # fmt: skip


def _sink(con: duckdb.DuckDBPyConnection, f: InputFile, lenient: bool, progress: ProgressFn | None, batch_spans: int) -> RowSink:
    schemas = stage.stage_schemas(con)
    sink = RowSink(f.name, strict=not lenient, flush=lambda s, e, links: stage.append_stage(con, schemas, s, e, links), batch_spans=batch_spans)
    if progress is not None:
        size = f.size_bytes
        sink.on_progress = lambda n: progress(f.name, n, size)
    return sink


def _load_bulk(
    con: duckdb.DuckDBPyConnection, f: InputFile, load_id: int, input_format: str, progress: ProgressFn | None
) -> FileReport | None:
    """Load a large on-disk OTLP/JSON lines file with the SQL bulk reader, in its own
    transaction; None (rolled back, progress rewound) when it is not such a file or the bulk
    reader hands it to the Python reader."""
    compression = _bulk_candidate(f, input_format)
    if compression is None:
        return None

    def bulk_progress(n: int) -> None:
        if progress is not None:
            progress(f.name, n, f.size_bytes)

    report: FileReport | None = None

    def record(result: otlp_json_duckdb.BulkResult) -> None:
        nonlocal report
        report = FileReport(f.name, "otlp_json_lines", result.records_read, result.spans_read, result.spans_loaded,
                            result.duplicates_identical)  # fmt: skip
        _record(con, load_id, report)

    if otlp_json_duckdb.load_json_lines(con, f.path, compression, load_id, record, bulk_progress) is None:  # type: ignore[arg-type]  # f.path is set: a bulk candidate is a file on disk
        return None
    return report


def _bulk_candidate(f: InputFile, input_format: str) -> str | None:
    """The compression (none, gzip, zstd) of a large on-disk OTLP/JSON lines file the bulk
    reader may try, or None (not such a file: the Python readers take it)."""
    if f.path is None or f.dataset_dir or input_format not in ("auto", "otlp-json") or (f.size_bytes or 0) < BULK_MIN_BYTES:
        return None
    with open(f.path, "rb") as fh:
        magic = fh.read(4)
    compression = "gzip" if magic[:2] == GZIP_MAGIC else "zstd" if magic == ZSTD_MAGIC else "none"
    stream = open_stream(f)
    try:
        head = stream.peek(1 << 16)[: 1 << 16]
        if detect_format(f.name, head) != "json" or not _is_json_lines(head):
            return None
        _first_line_check(f.name, head)
    except LoadError:
        return None  # the Python path raises it again, with the same message
    finally:
        stream.close()
    return compression


def _read(con: duckdb.DuckDBPyConnection, f: InputFile, sink: RowSink, input_format: str) -> str:
    """Run the right reader over one input; returns the shape read (``loads.format``)."""
    if f.dataset_dir:
        if input_format not in ("auto", "parquet"):
            raise LoadError(f.name, None, "wrong_format", f"a Parquet dataset directory, not {input_format}")
        return parquet_dump.read_parquet_dump(con, f, sink)
    stream = open_stream(f)
    try:
        head = stream.peek(1 << 16)[: 1 << 16]
        detected = detect_format(f.name, head) if input_format == "auto" else input_format
        if detected == "empty":
            return "empty"
        if detected == "parquet":
            if f.path is None:
                raise LoadError(f.name, None, "unsupported", "Parquet cannot be read from stdin: give the file")
            return parquet_dump.read_parquet_dump(con, f, sink)
        if detected == "otlp-proto":
            return otlp_proto.read_proto_stream(stream, sink)
        return _read_json(stream, head, sink, input_format)
    finally:
        if f.path is not None:
            stream.close()


def _is_json_lines(head: bytes) -> bool:
    """True when the first line is a JSON object on its own and not a Jaeger document
    (Jaeger JSON is one document, minified or not; its keys say ``traceID``, OTLP ``traceId``)."""
    nl = head.find(b"\n")
    if nl < 0:
        return b'"traceID"' not in head  # one (long) line
    try:
        first = otlp_json.loads_json(head[:nl])
    except ValueError:
        return False
    return isinstance(first, dict) and not is_jaeger_document(first)


def _later_line_is_traces(data: bytes, max_lines: int = 1000) -> bool:
    for line in data.split(b"\n")[1 : max_lines + 1]:
        try:
            if otlp_json.is_traces_document(otlp_json.loads_json(line)):
                return True
        except ValueError:
            continue
    return False


def _not_traces_detail(doc: object) -> str:
    if isinstance(doc, dict):
        keys = ", ".join(list(doc)[:5])
        what = "OTLP logs/metrics" if any(k.startswith("resource") for k in doc) else f"a JSON object with keys {keys}"
        return f"{what}, not traces (expected OTLP resourceSpans, Jaeger data/traceID/spans, or a Jaeger span array)"
    return "a JSON array that is neither Jaeger spans nor traces"


def _first_line_check(name: str, head: bytes) -> None:
    """File-level error when the first JSON line is not a traces document (e.g. benchmark results)."""
    nl = head.find(b"\n")
    try:
        first = otlp_json.loads_json(head[:nl] if nl >= 0 else head)
    except ValueError:
        return
    if not otlp_json.is_traces_document(first):
        raise LoadError(name, 1, "not_traces", _not_traces_detail(first))


def _read_json(stream, head: bytes, sink: RowSink, input_format: str) -> str:
    if input_format != "jaeger-json" and _is_json_lines(head):
        _first_line_check(sink.file, head)
        otlp_json.read_json_lines(stream, sink)
        if sink.records_read and sink.reasons.get("not_traces") == sink.records_read:
            raise LoadError(sink.file, 1, "not_traces", "no line holds an OTLP traces document (resourceSpans)")
        return "otlp_json_lines"
    data = stream.read()
    sink.progress(len(data))
    try:
        doc = otlp_json.loads_json(data)
    except ValueError as e:
        if _later_line_is_traces(data):  # JSON lines whose first line is damaged
            otlp_json.read_json_lines(io.BytesIO(data), sink)
            return "otlp_json_lines"
        if sink.strict:
            raise LoadError(sink.file, None, "invalid_json", str(e).split("\n")[0], hint=LENIENT_HINT) from None
        sink.records_read += 1
        sink.reject(Reject(1, 0, "invalid_json", data.decode("utf-8", "replace"), detail=str(e)))
        return "json"
    if is_jaeger_document(doc):
        if input_format == "otlp-json":
            raise LoadError(sink.file, None, "wrong_format", "this is Jaeger JSON, not OTLP/JSON (--input-format)")
        return read_jaeger_document(doc, sink)
    if input_format == "jaeger-json":
        raise LoadError(sink.file, None, "wrong_format", "not Jaeger JSON (no data[], traceID/spans or span array)")
    if not otlp_json.is_traces_document(doc):
        raise LoadError(sink.file, None, "not_traces", _not_traces_detail(doc))
    otlp_json.read_json_document(doc, sink)
    return "otlp_json_apiv3" if isinstance(doc, dict) and "result" in doc else "otlp_json"


def _insert_rejects(con: duckdb.DuckDBPyConnection, load_id: int, file: str, rejects: list[Reject]) -> None:
    if not rejects:
        return
    con.executemany(
        "INSERT INTO rejects VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(load_id, file, r.line, r.record_index, r.trace_id, r.span_id, r.reason, r.raw) for r in rejects],
    )


def reasons_summary(report: FileReport) -> str:
    """``reason=count, ...`` sorted by count (for the CLI)."""
    return ", ".join(f"{k}={v}" for k, v in Counter(report.rejected_by_reason).most_common())
