"""Discrete-event simulator of a serving cluster (disaggregated prefill/decode pools, or one pool of aggregated
engines), driven by a request trace.

Role: the rig that tells what a scaling policy costs (GPU-hours) and what it delivers (per-request TTFT and ITL)
without GPUs. Engine time comes from a `ForwardPassModel` (calibrated on measured data), so the simulator and the
planner's SLA models share one notion of engine speed.

Model:
- Prefill engines (disaggregated) run chunked prefill: each iteration takes prompt tokens from the head of the
  engine's FIFO queue, at most `max_num_batched_tokens` tokens and `max_num_seqs` requests, and lasts
  `prefill_wall_s(tokens)`. When a prompt's last chunk is done its KV cache moves to a decode engine
  (`kv_transfer_s_per_token * ISL`).
- Decode engines run continuous batching: every iteration advances each running request by one token and lasts
  `decode_wall_s(num_running, kv_tokens)`. A request is admitted when a sequence slot is free and its KV fits
  (`kv_allocation` below: by default its prompt, then one token per iteration, with preemption when the cache
  is full), otherwise it waits in the engine's queue. To
  stay fast, iterations are not events: between membership changes a decode engine runs a segment of
  identical-length iterations (the KV size at the segment's midpoint); an admission interrupts the segment at the
  next iteration boundary.
- First token: with `first_token_from_decode` (default) the client's first token is the decode engine's first
  iteration after admission, as in a disaggregated deployment where the decode worker streams every token (the
  prefill worker's sampled token is not returned); the request then decodes OSL iterations. Otherwise the first
  token appears when the prefill (plus transfer) ends and decode runs OSL - 1 iterations.
- Aggregated engines (`SimSpec.aggregated`, the decode pool only, `decode_limits`): chunked prefill piggybacked
  on the decode batch. Each iteration every running request decodes one token and takes one token of the
  `max_num_batched_tokens` budget; the rest of the budget goes to admitted prompts in FIFO order. A mixed
  iteration lasts `mixed_wall_s(prefill tokens, num_decode, kv)` (`prefill_wall_s` with nothing decoding); the
  iteration that finishes a prompt yields its first token. A prompt is admitted when a sequence slot
  (running + prefilling < `max_num_seqs`) and its KV fit (`kv_allocation`). Pure-decode stretches run as
  segments, as above; an arriving request interrupts a segment at the next iteration boundary.
- KV allocation (`kv_allocation`): RESERVE holds a request's whole footprint (ISL + OSL tokens) from admission,
  so nothing is preempted, but it uses the output length and leaves KV idle. ON_DEMAND (default), as vLLM's
  scheduler: a decode or
  aggregated engine holds a request's prompt from admission and one more token per iteration. At every iteration
  boundary the running requests' next tokens are allocated first: while they do not fit `max_kv_tokens`, the most
  recently admitted request (running or prefilling) is preempted (its KV freed, it goes back to the head of the
  engine's queue, counted in `SimResult.num_preemptions`); one request alone is never preempted. Only at a boundary
  without preemption are waiting requests admitted, in FIFO order, when a sequence slot is free and their KV (the
  prompt, or for a preempted request its prompt plus the tokens generated so far) fits beside the running
  requests' next tokens and `kv_watermark * max_kv_tokens` of headroom. A preempted request is recomputed on its
  engine: its prompt and generated tokens are prefilled again (chunked, in mixed iterations with the running
  batch, `mixed_wall_s`, or `prefill_wall_s` alone; on an aggregated engine the leading prompt blocks still in its
  prefix cache are skipped), the iteration that completes it yields its next token, and it then decodes the rest.
  KV is counted in tokens, not blocks. Pure-decode segments end before the iteration whose growth would not fit.
  `recompute_after_handoffs` has a disaggregated decode engine admit transferred requests before preempted ones.
- Prefix caching (`prefix_caching`, when the trace has prefix block ids): every prefill or aggregated engine keeps
  an LRU cache of `max_kv_tokens // block_tokens` blocks. When the engine first schedules a request, the
  leading blocks of its prompt found there are skipped (at least one token is always computed); its blocks enter
  the cache as chunks complete them, and when the prompt is done they are ordered for eviction tail first.
- Scaling is not free: a new worker is ready `startup_s` after it is requested; a removed worker first stops
  receiving requests, then leaves when its queue and batch are empty (starting workers are cancelled first).
  GPU-seconds accrue on starting, ready and draining workers.
- A router spreads requests over ready, non-draining workers: round-robin or least-loaded (queued prompt tokens
  for prefill; reserved plus waiting KV tokens for decode and aggregated engines). With no ready worker,
  requests wait at the router.
- Router `slo` (`SloRouting`, `planner_core.routing`): at each stage the engine with the lowest predicted latency
  among those predicted within `SLO x dispatch threshold` (prefill and aggregated engines: TTFT from their queued
  prompt tokens, in chunks, with their decode batch; decode engines: TPOT with the request in the batch). With
  none, the request has no available endpoint, counted once per stage (`SimResult.num_unplaced`), and then: with
  `adaptive_pd`, a prompt of at most `adaptive_max_prompt_tokens` is prefilled on the decode engine predicted to
  give the lowest TTFT within the threshold (chunked, in mixed iterations with its batch, as a recompute; ON_DEMAND
  only; counted in `num_local_prefills`); else `no_endpoint` REJECT drops it (never served, a miss) or QUEUE holds
  it at the frontend, FIFO, retried every `retry_s`: the head is placed when an engine is predicted within the
  threshold, or, once it has waited `max_wait_s` (default the TTFT target: past it the request misses its TTFT
  anyway), on the lowest-predicted engine whatever the prediction (`num_overdue`). Every placement records its
  prediction (`SimResult.predicted_ttft_ms` / `predicted_tpot_ms`) for the predictor's error against the
  measured latency.

- Engine speed (`SimSpec.engine_speed`, `speed_change`; `planner_core.lab.sim.des.speed`): the engines can run
  faster or slower than the profile the planners read, per phase, and change speed at a given time.

Deterministic for a given trace, spec and scaling timeline. No wall clock; time is the offset (s) from the first
request of the trace.
"""

from planner_core.lab.sim.des.cluster import ClusterSimulator
from planner_core.lab.sim.des.spec import (
    KvAllocation,
    NoEndpointAction,
    RouterPolicy,
    SimResult,
    SimSpec,
    SloRouting,
    spec_for_config,
    window_kv_hit_rate,
    window_observation,
)
from planner_core.lab.sim.des.speed import (
    PROFILE_SPEED,
    EngineSpeed,
    SpeedChange,
    engine_model,
    parse_engine_speed,
    parse_speed_change,
)

__all__ = [
    "PROFILE_SPEED",
    "ClusterSimulator",
    "EngineSpeed",
    "KvAllocation",
    "NoEndpointAction",
    "RouterPolicy",
    "SimResult",
    "SimSpec",
    "SloRouting",
    "SpeedChange",
    "engine_model",
    "parse_engine_speed",
    "parse_speed_change",
    "spec_for_config",
    "window_kv_hit_rate",
    "window_observation",
]
