"""The human view of a query's rows (``--format table``): the columns a person reads first,
rounded for reading, epoch nanoseconds as UTC ISO times, laid out to fit the terminal.

What fits is decided here, from the rows already fetched (no second query): every column of
rank 0 is shown, an id cut at its end (``…``) when even those do not fit; then the others in
rank order while they fit; a free-text column (a reason) takes what width is left. Columns
left out are named in a note, with how to see them (``--columns``, ``--format csv``); a
column that is empty in every row is left out without a note. csv and json never pass
through here: they keep every column at full precision under the query's names.

The width is the terminal's (``$COLUMNS``, else the terminal of stdout, else 80 when stdout
is not a terminal: :func:`terminal_width`). Not a verb (the leading underscore keeps it out
of verb discovery); the views themselves are in :mod:`analyzer.cli._views`.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.query.utc_columns import utc_ms_text

__all__ = ["Col", "View", "auto_view", "cell_text", "render", "terminal_width", "utc_ms_text"]

#: Narrowest layout we lay out for (a narrower terminal gets this width and wraps).
MIN_WIDTH = 40
#: Columns are separated by this many spaces.
GAP = 2
#: A free-text column is shown only with at least this many characters left for it.
MIN_FILL = 12
#: An id is never cut shorter than this (characters, the ellipsis included).
MIN_ID = 10
#: An epoch timestamp in nanoseconds is after 2001-09-09 (1e18 ns); smaller *_ns values are durations.
_EPOCH_NS_FLOOR = 10**18


@dataclass(frozen=True)
class Col:
    """One column of a human view.

    ``key``: the query's column (its csv/json name); ``head`` and ``unit``: the two header
    lines (the unit line is printed when any column has one); ``kind``: how values print
    (``ms``: milliseconds, 0.1 ms; ``fraction``: 3 decimals; ``utc``: epoch ns as UTC ISO to
    the millisecond; ``count``; ``text``; ``auto``: by the value and the column's name);
    ``rank``: 0 always shown, higher ranks give way first; ``cut``: text that may be cut at
    its end to fit (ids, reasons); ``fill``: free text that takes the width left over;
    ``value``: the cell's value from the row when it is not just ``row[key]``.
    """

    key: str
    head: str
    unit: str = ""
    kind: str = "auto"
    rank: int = 0
    cut: bool = False
    fill: bool = False
    value: Callable[[Mapping[str, Any]], Any] | None = None

    def get(self, row: Mapping[str, Any]) -> Any:
        return self.value(row) if self.value is not None else row.get(self.key)


@dataclass(frozen=True)
class View:
    """How one query's rows read: its columns in display order; ``group_by`` prints a block
    of rows per value of that column under ``group_title(value, rows)``; ``transpose`` prints
    each row as ``name  value`` lines (one-row results such as window); ``prepare`` adds
    values computed over all the rows (e.g. an id that must be unique) and returns notes."""

    columns: tuple[Col, ...]
    group_by: str | None = None
    group_title: Callable[[Any, Sequence[Mapping[str, Any]]], str] | None = None
    transpose: bool = False
    prepare: Callable[[list[dict[str, Any]]], list[str]] | None = None


def terminal_width() -> int:
    """The width to lay out for: ``$COLUMNS``, else the terminal's, else 80 (not a terminal)."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def _ellipsis() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return "…" if encoding.startswith("utf") else "~"


def decimals_for(values: Sequence[Any]) -> int | None:
    """The decimals that give the largest of ``values`` (floats) 4 significant digits, so
    every figure of one column or one row prints alike (14.90 beside 13.93, not 14 beside
    13.93); None when there is no finite non-zero float among them."""
    import math

    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0]
    if not floats:
        return None
    return max(0, min(6, 3 - math.floor(math.log10(max(floats)))))


def _number_text(value: float, decimals: int | None = None) -> str:
    """A float for reading: 4 significant digits, never an exponent between 1e-4 and 1e15;
    ``decimals``: that many instead (the figure's column or row, :func:`decimals_for`)."""
    if decimals is not None and (value == 0 or abs(value) >= 10 ** -decimals):
        return f"{value:.{decimals}f}"
    if value == 0:
        return "0"
    if abs(value) >= 1e4:
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.1e}"
    text = f"{value:.4g}"
    return text if "e" not in text else f"{value:.6f}".rstrip("0")


def cell_text(value: Any, kind: str = "auto", key: str = "", decimals: int | None = None) -> str:
    """One value as the human view prints it; ``-`` for NULL. ``decimals``: a float of kind
    ``auto`` printed with that many (its column's, :func:`decimals_for`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if kind == "utc" or (kind == "auto" and key.endswith("_ns") and isinstance(value, int)
                         and value >= _EPOCH_NS_FLOOR):
        return utc_ms_text(value) if isinstance(value, int) else str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "-"
        if kind == "fraction":
            return f"{value:.3f}"
        if kind == "ms" or (kind == "auto" and key.endswith("_ms")):
            return f"{value:.1f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"
        if kind == "count" and value.is_integer():
            return str(int(value))
        return _number_text(value, decimals)
    if isinstance(value, int):
        return str(value)
    return str(value).replace("\r", " ").replace("\n", " ")


def _numeric(col: Col, values: Sequence[Any]) -> bool:
    if col.kind in ("ms", "fraction", "count"):
        return True
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present) \
        and col.kind != "utc" and not (col.key.endswith("_ns") and col.kind == "auto")


def auto_view(columns: Sequence[str]) -> View:
    """A view of any query: every column in its order, earlier columns first to be shown,
    ``*_id`` columns cut when needed, reasons and details filling what width is left."""
    out = []
    for i, name in enumerate(columns):
        free = name.endswith(("reason", "detail", "note", "_rule"))
        out.append(Col(name, name, rank=0 if i == 0 else i, cut=name.endswith("_id") or free, fill=free))
    return View(tuple(out))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + _ellipsis()


def _layout(view: View, rows: Sequence[Mapping[str, Any]], width: int | None,
            chosen: Sequence[str] | None) -> tuple[list[Col], dict[str, int], list[str]]:
    """The columns shown, each one's width, and the names of the columns left out."""
    cols = list(view.columns)
    if chosen:  # headed by the names the user gave, formatted as the view formats them
        kinds = {c.key: c.kind for c in cols if c.value is None}
        cols = [Col(k, k, kind=kinds.get(k, "auto")) for k in chosen]
    texts = {c.key: column_texts(c, rows) for c in cols}
    natural = {c.key: max([len(c.head), len(c.unit), *map(len, texts[c.key])]) for c in cols}
    if chosen or width is None:
        return cols, natural, []
    present = [c for c in cols if c.rank == 0 or any(c.get(r) is not None for r in rows)]
    shown = [c for c in present if c.rank == 0]
    widths = {c.key: natural[c.key] for c in shown}

    def total() -> int:
        return sum(widths.values()) + GAP * (len(widths) - 1)

    # ids and text of rank 0 give way when even rank 0 does not fit, the widest first
    cuttable = [c for c in shown if c.cut or c.fill]
    while total() > width and cuttable:
        widest = max(cuttable, key=lambda c: widths[c.key])
        if widths[widest.key] <= max(len(widest.head), MIN_ID):
            cuttable.remove(widest)
            continue
        widths[widest.key] -= 1
    for c in sorted((c for c in present if c.rank > 0 and not c.fill), key=lambda c: c.rank):
        if total() + GAP + natural[c.key] <= width:
            shown.append(c)
            widths[c.key] = natural[c.key]
    for c in sorted((c for c in present if c.rank > 0 and c.fill), key=lambda c: c.rank):
        left = width - total() - GAP
        if left >= max(MIN_FILL, len(c.head)):
            shown.append(c)
            widths[c.key] = min(natural[c.key], left)
    order = {c.key: i for i, c in enumerate(cols)}
    shown.sort(key=lambda c: order[c.key])
    hidden = [c.key for c in present if c not in shown]
    return shown, widths, hidden


def _table_lines(shown: Sequence[Col], widths: Mapping[str, int], rows: Sequence[Mapping[str, Any]],
                 numeric: Mapping[str, bool]) -> list[str]:
    def line(values: Sequence[str]) -> str:
        parts = []
        for c, v in zip(shown, values):
            v = _cut(v, widths[c.key])
            parts.append(v.rjust(widths[c.key]) if numeric[c.key] else v.ljust(widths[c.key]))
        return (" " * GAP).join(parts).rstrip()

    lines = [line([c.head for c in shown])]
    if any(c.unit for c in shown):
        lines.append(line([c.unit for c in shown]))
    lines.append((" " * GAP).join("-" * widths[c.key] for c in shown))
    texts = [column_texts(c, rows) for c in shown]
    lines.extend(line([t[i] for t in texts]) for i in range(len(rows)))
    return lines


def column_texts(col: Col, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The cells of one column: floats of kind ``auto`` with one number of decimals for the
    whole column (:func:`decimals_for`)."""
    values = [col.get(r) for r in rows]
    decimals = decimals_for(values) if col.kind == "auto" and not col.key.endswith("_ms") else None
    return [cell_text(v, col.kind, col.key, decimals) for v in values]


def _transposed_lines(view: View, rows: Sequence[Mapping[str, Any]], width: int | None,
                      chosen: Sequence[str] | None) -> list[str]:
    cols = [c for c in view.columns if c.value is None or not chosen]
    if chosen:
        kinds = {c.key: c.kind for c in cols}
        cols = [Col(k, k, kind=kinds.get(k, "auto")) for k in chosen]
    names = [f"{c.head} ({c.unit})" if c.unit else c.head for c in cols]
    name_width = max(map(len, names), default=0)
    out: list[str] = []
    for i, r in enumerate(rows):
        if i:
            out.append("")
        for c, name in zip(cols, names):
            value = cell_text(c.get(r), c.kind, c.key)
            room = (width or 10**6) - name_width - GAP
            wrapped = textwrap.wrap(value, max(room, 20)) or [value]
            out.append(f"{name.ljust(name_width)}{' ' * GAP}{wrapped[0]}".rstrip())
            out.extend(" " * (name_width + GAP) + part for part in wrapped[1:])
    return out


def wrap_note(text: str, width: int | None) -> list[str]:
    """``note: text`` wrapped to the width, continuation lines indented."""
    return textwrap.wrap(f"note: {text}", width or 10**6, subsequent_indent="  ", break_on_hyphens=False) or ["note:"]


def render(view: View, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int | None = None,
           chosen: Sequence[str] | None = None, notes: Sequence[str] = (),
           columns_flag: bool = True) -> list[str]:
    """The lines of the human view of ``rows`` (tuples in ``columns`` order). ``width`` None:
    no fitting (every column of the view). ``chosen``: exactly these query columns, in this
    order, whatever the width. The note on the columns left out
    offers ``--columns`` when the verb has that option (``columns_flag``)."""
    dicts = [dict(zip(columns, r)) for r in rows]
    prepared = view.prepare(dicts) if view.prepare is not None and not chosen else []
    if view.transpose:
        lines = _transposed_lines(view, dicts, width, chosen)
        hidden: list[str] = []
    else:
        shown, widths, hidden = _layout(view, dicts, width, chosen)
        numeric = {c.key: _numeric(c, [c.get(r) for r in dicts]) for c in shown}
        lines = []
        if view.group_by and not chosen and view.group_by in columns:
            groups: dict[Any, list[Mapping[str, Any]]] = {}
            for r in dicts:
                groups.setdefault(r[view.group_by], []).append(r)
            for i, (value, members) in enumerate(groups.items()):
                if i:
                    lines.append("")
                title = view.group_title(value, members) if view.group_title else f"{value}: {len(members)} row(s)"
                lines.extend(textwrap.wrap(title, width or 10**6))
                lines.extend(_table_lines(shown, widths, members, numeric))
        else:
            lines.extend(_table_lines(shown, widths, dicts, numeric))
        if not dicts:
            lines.append("(no rows)")
    extra: list[str] = []
    if hidden:
        how = "--format csv or json has every column"
        if columns_flag:
            how = f"choose with --columns NAME,...; {how}"
        extra.append(f"not shown at {width} columns: {', '.join(hidden)} ({how})")
    reasons = [r.get("null_reason") for r in dicts if r.get("null_reason")]
    if reasons and "null_reason" in hidden:
        extra.append(f"{len(reasons)} row(s) have empty figures ('-'): null_reason says why")
    for note in [*prepared, *extra, *notes]:
        lines.extend(wrap_note(note, width))
    return lines
