"""Numbers in the configuration: no booleans or text taken for a number, and the upper bound of every kind of field.

`Number` and `Whole` are the annotated float and int of every numeric field; the `_NAME` mappings are the bounds those
fields spread into `Field(...)` (private to the package: the models of `policy`, `plugins` and `service` share them).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError


def _number_only(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into a number: `true` is not 1 ms, `"50"` is not 50."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("float_type", "must be a number")
    return value


def _whole_only(value: Any) -> Any:
    """As `_number_only`, for integer fields (a whole float such as 60.0 still passes, 2.5 does not)."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("int_type", "must be an integer")
    return value


Number = Annotated[float, BeforeValidator(_number_only)]
Whole = Annotated[int, BeforeValidator(_whole_only)]

# Upper bounds. A value past one of these is a typo or an attack, never a deployment: unbounded, `min_endpoint: 2**40`
# overflowed the database's integer columns on every tick and a million made the demo's simulated cluster grow
# past 3 GB. Each is far above any real cluster and inside Postgres' 32-bit `integer`.
MAX_REPLICAS = 10_000
"""Most replicas of one pool (min_endpoint, role floors, max_throughput_scaling_replicas)."""
MAX_GPUS = 1_000_000
"""Most GPUs of a budget (max_gpu_budget, min_gpu_budget)."""
MAX_GPUS_PER_ENGINE = 1024
"""Most GPUs one engine spans."""
MAX_INTERVAL_S = 86_400
"""Longest loop interval, deadline or hold (s): one day."""
MAX_LATENCY_MS = 3_600_000.0
"""Longest TTFT / ITL target (ms): one hour."""
MAX_TOKENS = 1_000_000_000
"""Most tokens of an engine limit (batched tokens, KV tokens, context length) or a queue threshold."""
MAX_COUNT = 1_000_000
"""Most samples, windows, observations or sequences a field may ask to be kept or run (memory is per count)."""
_REPLICAS = {"le": MAX_REPLICAS}
_GPUS = {"le": MAX_GPUS}
_INTERVAL = {"le": MAX_INTERVAL_S}
_TOKENS = {"le": MAX_TOKENS}
_COUNT = {"le": MAX_COUNT}
_LATENCY = {"le": MAX_LATENCY_MS}
_ENGINE_GPUS = {"le": MAX_GPUS_PER_ENGINE}
_PRIORITY = {"ge": -MAX_COUNT, "le": MAX_COUNT}
_SPECULATIVE = {"le": 64}  # draft tokens per step; real drafts propose a handful
_POWER = {"le": 1_000_000_000}  # watts: a gigawatt
_HOURS = {"le": 24 * 366}  # a year
# Thresholds and noise variances have no natural maximum; this one keeps their arithmetic finite.
_MAGNITUDE = {"le": 1e12}
_PORT = {"ge": 0, "le": 65535}  # a TCP port
