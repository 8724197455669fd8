"""Field-level parsing shared by every reader: ids, int64 timestamps, enums, attribute values.

Tolerance matches what the OpenTelemetry Collector accepts (docs/loading.md): camelCase or
snake_case keys, int64 as JSON strings or numbers, enums as integers or names, upper- or
lowercase hex ids, base64 ids that decode to exactly 16/8 bytes. A value that cannot be read
raises :class:`BadRecord` carrying a stable reason code (the keys of ``loads.rejected_by_reason``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any

__all__ = [
    "BadRecord",
    "INT64_MAX",
    "JSON_TEXT_SEPARATORS",
    "any_value_to_plain",
    "json_text",
    "parse_enum",
    "parse_id",
    "parse_time_ns",
    "parse_uint",
    "split_any_values",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
JSON_TEXT_SEPARATORS = (",", ":")

_HEX = re.compile(r"[0-9a-f]+\Z")


class BadRecord(Exception):
    """A record that cannot become a canonical row; ``reason`` is a stable reason code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def parse_id(value: Any, nbytes: int, what: str, *, pad: bool = False) -> str:
    """A trace id (``nbytes`` 16) or span id (8) as lowercase hex.

    Accepts hex in either case or base64 decoding to exactly ``nbytes`` bytes; ``pad``
    (Jaeger) left-pads shorter hex with zeros. Missing, empty or all-zero ids raise
    ``empty_<what>``; anything else unreadable raises ``invalid_<what>``.
    """
    if value is None or value == "":
        raise BadRecord(f"empty_{what}")
    if not isinstance(value, str):
        raise BadRecord(f"invalid_{what}", f"{value!r} is not a string")
    digits = 2 * nbytes
    low = value.lower()
    if len(low) == digits and _HEX.match(low):
        hex_id = low
    elif pad and len(low) < digits and _HEX.match(low):
        hex_id = low.rjust(digits, "0")
    else:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != nbytes:
            raise BadRecord(f"invalid_{what}", f"{value!r} is neither {digits} hex digits nor base64 of {nbytes} bytes")
        hex_id = raw.hex()
    if hex_id.count("0") == digits:
        raise BadRecord(f"empty_{what}", "all zeros")
    return hex_id


def _to_int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, str):
        s = value.strip()
        if s and s.isascii() and (s.isdigit() or (s[0] == "-" and s[1:].isdigit())):
            return int(s)
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_time_ns(value: Any, what: str) -> int:
    """A nanosecond timestamp given as a JSON string or number; 0 or missing is ``missing_<what>``."""
    if value is None:
        raise BadRecord(f"missing_{what}")
    n = _to_int(value)
    if n is None or n < 0 or n > INT64_MAX or isinstance(value, bool):
        raise BadRecord("invalid_time", f"{what} {value!r} is not a non-negative int64")
    if n == 0:
        raise BadRecord(f"missing_{what}")
    return n


def parse_uint(value: Any, what: str) -> int:
    """A non-negative count or flag word (uint32 in OTLP) given as a string or number; missing is 0."""
    if value is None:
        return 0
    n = _to_int(value)
    if n is None or n < 0 or n > INT64_MAX or isinstance(value, bool):
        raise BadRecord("invalid_field", f"{what} {value!r} is not a non-negative integer")
    return n


def parse_enum(value: Any, names: tuple[str, ...], prefix: str, what: str) -> str:
    """An OTLP enum given as an integer or a name (``SPAN_KIND_SERVER`` or ``SERVER``, any case)."""
    if value is None:
        return names[0]
    if type(value) is int:
        if 0 <= value < len(names):
            return names[value]
    elif isinstance(value, str):
        up = value.upper()
        if up.startswith(prefix):
            up = up[len(prefix):]
        if up in names:
            return up
        n = _to_int(value)
        if n is not None and 0 <= n < len(names):
            return names[n]
    raise BadRecord("invalid_field", f"{what} {value!r} is not one of {', '.join(names)}")


def json_text(value: Any) -> str:
    """Plain JSON text as stored in ``attr_json`` (compact, ASCII, NaN/Inf as strings)."""
    return json.dumps(value, separators=JSON_TEXT_SEPARATORS)


def _finite(x: float) -> Any:
    return x if math.isfinite(x) else repr(x)


_KIND = {
    "stringValue": 0, "string_value": 0,
    "intValue": 1, "int_value": 1,
    "doubleValue": 2, "double_value": 2,
    "boolValue": 3, "bool_value": 3,
    "arrayValue": 4, "array_value": 4,
    "kvlistValue": 5, "kvlist_value": 5,
    "bytesValue": 6, "bytes_value": 6,
}  # fmt: skip


def _int64(v: Any, key: str) -> int:
    n = _to_int(v)
    if n is None or not INT64_MIN <= n <= INT64_MAX or isinstance(v, bool):
        raise BadRecord("invalid_attribute", f"{key!r}: {v!r} is not an int64")
    return n


def _double(v: Any, key: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)  # "NaN", "Infinity", "-Infinity" as proto3 JSON writes them
        except ValueError:
            pass
    raise BadRecord("invalid_attribute", f"{key!r}: {v!r} is not a double")


def _bytes_b64(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise BadRecord("invalid_attribute", f"{key!r}: bytes value is not base64 text")
    try:
        return base64.b64encode(base64.b64decode(v, validate=True)).decode("ascii")
    except (binascii.Error, ValueError):
        raise BadRecord("invalid_attribute", f"{key!r}: bytes value is not base64") from None


def any_value_to_plain(value: Any, key: str = "") -> Any:
    """An OTLP AnyValue as a plain JSON value: arrays -> lists, kvlists -> objects,
    bytes -> ``{"bytes_base64": ...}``, non-finite doubles -> their repr, empty -> None."""
    if not isinstance(value, dict):
        raise BadRecord("invalid_attribute", f"{key!r}: value is not an object")
    for vk, v in value.items():
        kind = _KIND.get(vk)
        if kind is None:
            continue  # unknown field: ignored
        if kind == 0:
            if not isinstance(v, str):
                raise BadRecord("invalid_attribute", f"{key!r}: stringValue {v!r} is not a string")
            return v
        if kind == 1:
            return _int64(v, key)
        if kind == 2:
            return _finite(_double(v, key))
        if kind == 3:
            if not isinstance(v, bool):
                raise BadRecord("invalid_attribute", f"{key!r}: boolValue {v!r} is not a bool")
            return v
        if kind == 4:
            items = (v or {}).get("values") or []
            return [any_value_to_plain(x, key) for x in items]
        if kind == 5:
            items = (v or {}).get("values") or []
            return {_key(kv): any_value_to_plain(kv.get("value") or {}, key) for kv in items}
        return {"bytes_base64": _bytes_b64(v, key)}
    return None


def _key(kv: Any) -> str:
    if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
        raise BadRecord("invalid_attribute", f"attribute {kv!r} has no string key")
    return kv["key"]


AttrMaps = tuple[list, list, list, list, list]


def split_any_values(attrs: Any) -> AttrMaps:
    """OTLP ``[{key, value: AnyValue}]`` into the five typed maps (str, int, double, bool, json)
    as lists of (key, value) pairs. A repeated key keeps its last value, at its first position."""
    s: list = []
    i: list = []
    d: list = []
    b: list = []
    j: list = []
    if not attrs:
        return s, i, d, b, j
    if not isinstance(attrs, list):
        raise BadRecord("invalid_attribute", "attributes is not a list")
    seen: dict[str, Any] = {}
    for kv in attrs:
        key = _key(kv)
        val = kv.get("value")
        if val is None:
            val = {}
        kind = -1
        raw = None
        if isinstance(val, dict):
            for vk, raw in val.items():  # noqa: B007 - raw is read after the loop: the value of the kind found
                kind = _KIND.get(vk, -1)
                if kind >= 0:
                    break
        else:
            raise BadRecord("invalid_attribute", f"{key!r}: value is not an object")
        if kind == 0:
            if not isinstance(raw, str):
                raise BadRecord("invalid_attribute", f"{key!r}: stringValue {raw!r} is not a string")
            seen[key] = (0, raw)
        elif kind == 1:
            seen[key] = (1, _int64(raw, key))
        elif kind == 2:
            seen[key] = (2, _double(raw, key))
        elif kind == 3:
            if not isinstance(raw, bool):
                raise BadRecord("invalid_attribute", f"{key!r}: boolValue {raw!r} is not a bool")
            seen[key] = (3, raw)
        else:
            seen[key] = (4, json_text(any_value_to_plain(val, key)))
    maps = (s, i, d, b, j)
    for key, (kind, v) in seen.items():
        maps[kind].append((key, v))
    return maps
