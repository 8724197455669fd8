"""The audit's claims file (YAML or JSON) and tokentrace's own metrics JSON, as claims.

A claims file holds any subset of the worked example's figure names (docs/metrics.md). Each figure is one request's
value unless the file (top-level ``stat``) or the figure (``{value: 25, stat: p99}``) says
``mean | p50 | p90 | p99``. A figure is judged within the precision it is written to (an
integer ``148`` stands for 147.5 ... 148.5; counts and ``kv_bytes_per_token`` are exact).
``model`` gives ``layers``, ``q_heads``, ``kv_heads``,
``head_dim``, ``kv_dtype`` or ``config`` (an HF config.json, relative to the claims file);
``measured: true | false`` says whether the figures are measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.audit.compare import written_half_unit
from analyzer.audit.inputs import read_json
from analyzer.errors import AuditInputError
from instrument.kv.formula import KVLayout, UnsupportedArchitecture, explicit_layout, kv_layout_from_config

__all__ = [
    "COUNT_FIGURES",
    "FIGURES",
    "STATS",
    "Claim",
    "Claims",
    "claims_from_mapping",
    "read_claims_file",
    "read_tokentrace_artifact",
]

FIGURES = (
    "input_tokens", "output_tokens", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
    "decode_output_tokens_per_second", "whole_request_output_tokens_per_second", "kv_bytes_per_token",
    "window_s", "attempted", "succeeded", "slo_passing", "request_throughput_rps",
    "observed_goodput_rps", "error_rate",
)
COUNT_FIGURES = frozenset({"input_tokens", "output_tokens", "kv_bytes_per_token", "attempted", "succeeded",
                           "slo_passing"})
STATS = ("request", "mean", "p50", "p90", "p99")
_OTHER_KEYS = ("model", "measured", "stat", "source", "title", "notes")
_MODEL_KEYS = ("layers", "q_heads", "kv_heads", "head_dim", "kv_dtype", "config")


@dataclass(frozen=True)
class Claim:
    """One claimed figure: its value (unit in its name), statistic (``request`` = one request)
    and ``half_unit``, the precision it is written to: half a unit of its last written digit
    (``tpot_ms: 148`` stands for 147.5 ... 148.5, ``147.8`` for 147.75 ... 147.85); 0 for
    counts and model constants (COUNT_FIGURES: exact)."""

    name: str
    value: float
    stat: str = "request"
    half_unit: float = 0.0


@dataclass
class Claims:
    """The figures of one claims file or artifact, its model and its measured/synthetic label."""

    path: Path
    figures: dict[str, Claim] = field(default_factory=dict)
    model: KVLayout | None = None
    model_q_heads: int | None = None
    measured: bool | None = None
    self_labelled_synthetic: bool = False

    def value(self, name: str, stat: str | None = "request") -> float | None:
        """The claimed value, only when it has the given statistic (None: any statistic)."""
        claim = self.figures.get(name)
        if claim is None or (stat is not None and claim.stat != stat):
            return None
        return claim.value


def _figure(path: Path, name: str, raw: Any, default_stat: str) -> Claim:
    stat = default_stat
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - {"value", "stat"})
        if unknown:
            raise AuditInputError(f"{path}: key {name!r}: unknown field(s) {', '.join(unknown)}; expected value, stat")
        if "value" not in raw:
            raise AuditInputError(f"{path}: key {name!r}: missing 'value'")
        stat = str(raw.get("stat", default_stat))
        raw = raw["value"]
    if stat not in STATS:
        raise AuditInputError(f"{path}: key {name!r}: stat {stat!r} is not one of {', '.join(STATS[1:])}")
    written = raw
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        if isinstance(raw, str):
            try:
                raw = float(raw.replace(",", "").strip())
            except ValueError:
                raise AuditInputError(f"{path}: key {name!r} = {raw!r} is not a number") from None
        else:
            raise AuditInputError(f"{path}: key {name!r} = {raw!r} is not a number")
    if name in COUNT_FIGURES and float(raw) != int(raw):
        raise AuditInputError(f"{path}: key {name!r} = {raw!r} must be a whole number")
    if raw < 0:
        raise AuditInputError(f"{path}: key {name!r} = {raw!r} must not be negative")
    return Claim(name, float(raw), stat, 0.0 if name in COUNT_FIGURES else written_half_unit(written))


def _model(path: Path, raw: Any, model_config: str | Path | None) -> tuple[KVLayout | None, int | None]:
    if model_config is not None:
        raw = {"config": str(model_config)} if not isinstance(raw, Mapping) else {**raw, "config": str(model_config)}
        base = Path.cwd()
    else:
        base = path.parent
    if raw is None:
        return None, None
    if not isinstance(raw, Mapping):
        raise AuditInputError(f"{path}: key 'model' must be a mapping of {', '.join(_MODEL_KEYS)}")
    unknown = sorted(set(raw) - set(_MODEL_KEYS))
    if unknown:
        raise AuditInputError(f"{path}: key 'model': unknown field(s) {', '.join(unknown)}; known: {', '.join(_MODEL_KEYS)}")
    q_heads = raw.get("q_heads")
    # who named the config: the --model-config flag (blame it), else the file's 'model' key
    where = f"--model-config {model_config}" if model_config is not None else f"{path}: key 'model'"
    try:
        if raw.get("config"):
            config = Path(str(raw["config"]))
            config = config if config.is_absolute() else base / config
            layout = kv_layout_from_config(config, kv_dtype=raw.get("kv_dtype"))
            return layout, q_heads if q_heads is not None else layout.q_heads
        missing = [k for k in ("layers", "kv_heads", "head_dim") if raw.get(k) is None]
        if missing:
            raise AuditInputError(f"{path}: key 'model': missing {', '.join(missing)} (or give 'config')")
        layout = explicit_layout(raw["layers"], raw["kv_heads"], raw["head_dim"], str(raw.get("kv_dtype", "bf16")),
                                 q_heads=q_heads)
        return layout, q_heads
    except UnsupportedArchitecture as exc:
        raise AuditInputError(f"{where}: unsupported architecture: {exc}") from None
    except AuditInputError:
        raise
    except (ValueError, TypeError) as exc:
        text = str(exc)
        if model_config is not None and text.startswith(f"{model_config}: "):
            text = text[len(f"{model_config}: "):]  # the flag already names the file
        raise AuditInputError(f"{where}: {text}") from None


def claims_from_mapping(path: Path, data: Any, model_config: str | Path | None = None) -> Claims:
    """Claims from a parsed claims file; AuditInputError naming the file and the key."""
    if not isinstance(data, Mapping):
        raise AuditInputError(f"{path}: a claims file must be a mapping of figure names to values")
    unknown = sorted(set(data) - set(FIGURES) - set(_OTHER_KEYS))
    if unknown:
        raise AuditInputError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))}; known figures: "
                              f"{', '.join(FIGURES)}; other keys: {', '.join(_OTHER_KEYS)}")
    default_stat = str(data.get("stat", "request"))
    if default_stat not in STATS:
        raise AuditInputError(f"{path}: key 'stat' = {default_stat!r} is not one of {', '.join(STATS[1:])}")
    measured = data.get("measured")
    if measured is not None and not isinstance(measured, bool):
        raise AuditInputError(f"{path}: key 'measured' must be true or false, got {measured!r}")
    claims = Claims(path=path, measured=measured)
    for name in FIGURES:
        if name in data and data[name] is not None:
            claims.figures[name] = _figure(path, name, data[name], default_stat)
    claims.model, claims.model_q_heads = _model(path, data.get("model"), model_config)
    if not claims.figures and claims.model is None:
        raise AuditInputError(f"{path}: no figure to check: none of {', '.join(FIGURES)} and no model")
    return claims


def read_claims_file(path: str | Path, model_config: str | Path | None = None) -> Claims:
    """A YAML (``.yaml``/``.yml``) or JSON claims file."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise AuditInputError(f"{path}: no such file") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise AuditInputError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    else:
        data = read_json(path)
    return claims_from_mapping(path, data, model_config)


def read_tokentrace_artifact(path: str | Path, data: Mapping[str, Any], model_config: str | Path | None = None) -> Claims:
    """tokentrace's own metrics JSON (``tokentrace timeline --json``) as claims.

    Its figures are one request's values (window figures: the window's). The artifact labels
    itself synthetic through its ``scope`` (``"... synthetic ..."``) or ``tokentrace.synthetic``.
    """
    path = Path(path)
    picked = {k: data[k] for k in FIGURES if data.get(k) is not None}
    if "measured" in data:
        picked["measured"] = data["measured"]
    layout_raw = data.get("kv_layout")
    if isinstance(layout_raw, Mapping) and model_config is None:
        picked["model"] = {"layers": layout_raw.get("layers"), "kv_heads": layout_raw.get("kv_heads"),
                           "head_dim": layout_raw.get("head_dim"), "kv_dtype": layout_raw.get("kv_dtype"),
                           "q_heads": layout_raw.get("q_heads") if layout_raw.get("layout") != "unknown" else None}
    claims = claims_from_mapping(path, picked, model_config)
    scope = str(data.get("scope", ""))
    claims.self_labelled_synthetic = "synthetic" in scope.lower() or bool(data.get("tokentrace.synthetic"))
    return claims
