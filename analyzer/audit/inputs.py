"""Reading report files for the audit: one-line errors that name the file and the key."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analyzer.errors import AuditInputError

__all__ = ["read_json", "number", "optional_number", "integer"]


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; AuditInputError naming the file (and line) when it cannot."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AuditInputError(f"{path}: is a directory, expected a report file") from None
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuditInputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def optional_number(obj: Mapping[str, Any], key: str, path: str | Path) -> float | None:
    """``obj[key]`` as a float; None when absent or null; numeric strings ("538") are parsed.

    AuditInputError naming file and key for a value that is not a finite number.
    """
    if key not in obj or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, bool):
        raise AuditInputError(f"{path}: key {key!r} is a boolean, expected a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise AuditInputError(f"{path}: key {key!r} = {obj[key]!r} is not a number") from None
    if not isinstance(value, (int, float)):
        raise AuditInputError(f"{path}: key {key!r} is {type(value).__name__}, expected a number")
    if not math.isfinite(value):
        raise AuditInputError(f"{path}: key {key!r} = {value!r} is not a finite number")
    return float(value)


def number(obj: Mapping[str, Any], key: str, path: str | Path) -> float:
    """``obj[key]`` as a float; AuditInputError naming file and key when missing or bad."""
    value = optional_number(obj, key, path)
    if value is None:
        raise AuditInputError(f"{path}: missing key {key!r}")
    return value


def integer(obj: Mapping[str, Any], key: str, path: str | Path) -> int | None:
    """``obj[key]`` as an int (None when absent); AuditInputError for a non-integral value."""
    value = optional_number(obj, key, path)
    if value is None:
        return None
    if value != int(value):
        raise AuditInputError(f"{path}: key {key!r} = {value!r} is not a whole number")
    return int(value)
