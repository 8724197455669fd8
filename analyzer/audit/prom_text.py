"""Prometheus text exposition format (``GET /metrics``, format 0.0.4) for the audit: the
histograms of a scrape, and the window between two scrapes.

:func:`read_histograms` returns each histogram family's series (labels without ``le``) with
its cumulative buckets (upper bound -> count, ``+Inf`` included), ``_count`` and ``_sum``.
:func:`window` subtracts a baseline scrape from a later one, series by series: lifetime
counts and warm-up drop out. Bad input: :class:`AuditInputError`, one line naming the file,
line or family: a line that is not a sample, a histogram without its ``+Inf`` bucket, scrapes
of different servers (a baseline series the later scrape lacks; another engine or process), a
counter reset between them (a later count below the baseline's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import AuditInputError

__all__ = ["Histogram", "looks_like_prometheus_text", "read_histograms", "window"]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
#: labels that name the server process: scrapes whose values differ are of different servers
IDENTITY_LABELS = ("engine", "instance", "job", "pod", "server")

Series = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    """One histogram family: per series (sorted label pairs, ``le`` left out) its cumulative
    buckets {upper bound (s or the family's unit): count}, count and sum."""

    name: str
    buckets: dict[Series, dict[float, float]] = field(default_factory=dict)
    counts: dict[Series, float] = field(default_factory=dict)
    sums: dict[Series, float] = field(default_factory=dict)


def looks_like_prometheus_text(path: Path) -> bool:
    """A text file whose first non-blank line is ``# HELP`` / ``# TYPE`` or a sample line."""
    try:
        with path.open("r", encoding="utf-8", errors="strict") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                return line.startswith(("# HELP ", "# TYPE ")) or bool(_SAMPLE.match(line)) and not line.startswith("{")
    except (OSError, UnicodeDecodeError):
        return False
    return False


def _labels(text: str, path: Path, number: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise AuditInputError(f"{path}:{number}: bad label set {{{text}}}")
        out[m[1]] = m[2].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def _value(raw: str, path: Path, number: int) -> float:
    try:
        return float(raw)  # "+Inf", "NaN" included
    except ValueError:
        raise AuditInputError(f"{path}:{number}: {raw!r} is not a sample value") from None


def read_histograms(path: Path) -> dict[str, Histogram]:
    """The histogram families of a scrape (``# TYPE <name> histogram``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AuditInputError(f"{path}: is a directory, expected a Prometheus text scrape") from None
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    kinds: dict[str, str] = {}
    out: dict[str, Histogram] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                kinds[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise AuditInputError(f"{path}:{number}: not a Prometheus sample line: {line[:80]!r}")
        name, labels, value = m[1], _labels(m[3] or "", path, number), _value(m[4], path, number)
        for suffix in ("_bucket", "_count", "_sum"):
            family = name[: -len(suffix)] if name.endswith(suffix) else None
            if family is None or kinds.get(family) != "histogram":
                continue
            hist = out.setdefault(family, Histogram(family))
            if suffix == "_bucket":
                if "le" not in labels:
                    raise AuditInputError(f"{path}:{number}: {name} has no 'le' label")
                le = _value(labels.pop("le"), path, number)
                hist.buckets.setdefault(tuple(sorted(labels.items())), {})[le] = value
            elif suffix == "_count":
                hist.counts[tuple(sorted(labels.items()))] = value
            else:
                hist.sums[tuple(sorted(labels.items()))] = value
            break
    for hist in out.values():
        for series, buckets in hist.buckets.items():
            if math.inf not in buckets:
                raise AuditInputError(f"{path}: histogram {hist.name}{_shown(series)} has no +Inf bucket")
    return out


def _shown(series: Series) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in series) + "}" if series else ""


def window(after: dict[str, Histogram], before: dict[str, Histogram], after_path: Path,
           before_path: Path) -> dict[str, Histogram]:
    """``after - before`` series by series (a series new in ``after`` counts from 0)."""
    _same_server(after, before, after_path, before_path)
    out: dict[str, Histogram] = {}
    for name, hist in after.items():
        base = before.get(name, Histogram(name))
        missing = [s for s in base.buckets if s not in hist.buckets]
        if missing:
            raise AuditInputError(f"{after_path}: histogram {name}{_shown(missing[0])} of the baseline {before_path} "
                                  "is missing: scrapes of different servers (or label sets)")
        diff = Histogram(name)
        for series, buckets in hist.buckets.items():
            old = base.buckets.get(series, {})
            if old and set(old) != set(buckets):
                raise AuditInputError(f"{after_path}: histogram {name}{_shown(series)} has other bucket bounds than "
                                      f"in {before_path}: scrapes of different servers")
            diff.buckets[series] = {}
            for le, count in buckets.items():
                previous = old.get(le, 0.0)
                if count < previous:
                    raise AuditInputError(f"{after_path}: {name}_bucket{_shown(series)} le={le:g}: {count:g} < "
                                          f"{previous:g} in {before_path}: a counter reset (server restart) between "
                                          "the scrapes")
                diff.buckets[series][le] = count - previous
            diff.counts[series] = hist.counts.get(series, buckets[math.inf]) - base.counts.get(series, old.get(
                math.inf, 0.0))
            diff.sums[series] = hist.sums.get(series, 0.0) - base.sums.get(series, 0.0)
        out[name] = diff
    return out


def _same_server(after: dict[str, Histogram], before: dict[str, Histogram], after_path: Path,
                 before_path: Path) -> None:
    """Refuse scrapes whose identity labels (engine, instance, pod ...) differ, or that share no
    histogram family."""
    if before and after and not set(before) & set(after):
        raise AuditInputError(f"{after_path}: no histogram family in common with {before_path}: scrapes of "
                              "different servers")

    def identities(scrape: dict[str, Histogram]) -> set[tuple[str, str]]:
        return {(k, v) for h in scrape.values() for s in h.buckets for k, v in s if k in IDENTITY_LABELS}

    a, b = identities(after), identities(before)
    if a and b and a != b:
        only = min(a ^ b)
        raise AuditInputError(f"{after_path}: label {only[0]}={only[1]!r} is in one scrape only ({before_path} is "
                              "the other): scrapes of different servers or engines")
