"""Load policies without an SLA model: per-engine thresholds (Dynamo 1.x) and the 2025 threshold load planner.

**Per-engine thresholds** (`calculate_threshold_replicas`; targets `throughput`, `latency`, `load`). Every load tick,
each engine rank of the pool gives one value from its latest forward-pass metrics:

| pool | target | value per engine | up when any | down when all |
|---|---|---|---|---|
| prefill | throughput | queued prompt tokens / context_length | >= 1.0 | < 0.1 |
| prefill | latency | queued prompt tokens / context_length | >= 0.1 | = 0 |
| prefill | load | queued prompt tokens | >= prefill_scale_up_queue_tokens | <= ..._down_... |
| decode | throughput | (scheduled + queued KV) / max_kv_tokens | > 1.0 | < 0.6 |
| decode | latency | (scheduled + queued KV) / max_kv_tokens | > 0.4 | < 0.1 |
| decode | load | (scheduled + queued KV) / max_kv_tokens | >= decode_scale_up_kv_rate / 100 | <= ..._down_... |

The aggregated pool uses the decode rows with queued prompt tokens added to the KV. One replica up if *any* engine is
over its up threshold; one down if *all* are under the down threshold, unless the survivors would cross the up
threshold at once: `N -> N-1` is refused when `max(value) * N/(N-1) >= up` (anti-oscillation).

**The 2025 threshold planner** (`calculate_threshold_2025`; `load_policy: threshold_2025`), Dynamo's deprecated load
planner on forward-pass metrics. Every load tick is one sample of the prefill queue (queued prefill requests summed
over the prefill engines) and of the decode KV utilisation (mean over the decode engines, queued KV included).
Once per `threshold_2025_adjustment_interval_seconds` the interval averages are compared with the thresholds
(strictly: down below the down threshold, up above the up threshold) and each pool moves by at most one:

- scale-downs first (never below the minimum endpoint), then scale-ups, each within `max_gpu_budget`;
- no decode scale-down for `DECODE_GRACE_INTERVALS` (3) adjustments after a decode worker was added (its KV cache
  fills slowly, so the pool looks idle);
- no prefill scale-up when the interval's trend, `last + (last - first) * PREFILL_TREND_INTERVALS`, predicts the
  queue at or below the up threshold by the time a new worker would be ready;
- sampling stops while a scale is in flight and a new interval opens once it is over; an adjustment is skipped if the
  ready counts changed during the interval.

Both end with the throughput floor and the minimum endpoint (`fleet.finalize_load_proposal`). Pure: no clock (time
is the tick's `now_s`), no I/O; the 2025 planner's samples and counters are `ThresholdPlannerState`.

The package: `per_engine` (the per-engine thresholds) and `planner_2025` (the 2025 planner); every public name is
re-exported here.
"""

from planner_core.policy.thresholds.per_engine import (
    DECODE_GRACE_INTERVALS,
    DECODE_LATENCY_DOWN,
    DECODE_LATENCY_UP,
    DECODE_THROUGHPUT_DOWN,
    DECODE_THROUGHPUT_UP,
    PREFILL_LATENCY_DOWN,
    PREFILL_LATENCY_UP,
    PREFILL_THROUGHPUT_DOWN,
    PREFILL_THROUGHPUT_UP,
    PREFILL_TREND_INTERVALS,
    ThresholdInputs,
    ThresholdMeasure,
    ThresholdRule,
    calculate_threshold_replicas,
    kv_utilisation,
    threshold_rule,
)
from planner_core.policy.thresholds.planner_2025 import (
    Threshold2025Outcome,
    Threshold2025Settings,
    calculate_threshold_2025,
)

__all__ = [
    "DECODE_GRACE_INTERVALS",
    "DECODE_LATENCY_DOWN",
    "DECODE_LATENCY_UP",
    "DECODE_THROUGHPUT_DOWN",
    "DECODE_THROUGHPUT_UP",
    "PREFILL_LATENCY_DOWN",
    "PREFILL_LATENCY_UP",
    "PREFILL_THROUGHPUT_DOWN",
    "PREFILL_THROUGHPUT_UP",
    "PREFILL_TREND_INTERVALS",
    "Threshold2025Outcome",
    "Threshold2025Settings",
    "ThresholdInputs",
    "ThresholdMeasure",
    "ThresholdRule",
    "calculate_threshold_2025",
    "calculate_threshold_replicas",
    "kv_utilisation",
    "threshold_rule",
]
