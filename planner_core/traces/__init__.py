"""Request traces: load Azure CSV, Mooncake JSONL and Dynamo request-trace-v1 JSONL files into arrays, and
summarise time windows of them.

A `RequestTrace` is a value: arrival offsets (s, from the first request), input and output lengths, the
wall-clock time of the first request, and where the trace's own clock starts (for Dynamo's window origin).
Loading is I/O; everything else here is pure.

Formats (chosen by suffix; a `.jsonl` / `.jsonl.gz` file is sniffed from its first record):
- Azure LLM inference CSV: `TIMESTAMP` (wall clock, UTC), `ContextTokens`, `GeneratedTokens`.
- Mooncake JSONL: `timestamp` (ms, relative to the trace's zero), `input_length`, `output_length`, and optionally
  `hash_ids` (ids of the prompt's 512-token prefix blocks: equal ids mean equal content, for prefix caching).
- Dynamo `dynamo.request.trace.v1` JSONL: only `request_end` events count; arrival
  `request.request_received_ms` (Unix ms), lengths `request.replay.input_length` and `request.output_tokens`.
  A record may be wrapped as `{"event": {...}}`. Other event types (e.g. `tool_end`) are skipped.

`load_traces(spec)` takes a file, a glob or a folder (searched recursively for `.csv`, `.jsonl`, `.jsonl.gz`)
and merges the files on one global time origin, as Dynamo does for warm-up shards.

Making load from a base trace (all pure): `RequestTrace.scaled` (more requests per second, same duration),
`RequestTrace.compressed` (the same requests in less time), and `shape_trace` (the base trace's requests and
burstiness under a rate shape, e.g. ServeGen's daily cycle from `load_servegen_shape`, for multi-hour and
multi-day load).

The package: `trace` (the `RequestTrace` value, its bounds and windows), `formats` (the readers), `shapes` (rate
shapes and shaped traces); every public name is re-exported here.
"""

from planner_core.traces.formats import (
    detect_format,
    load_trace,
    load_traces,
    resolve_trace_paths,
)
from planner_core.traces.shapes import DAY_S, RateShape, load_servegen_shape, shape_trace
from planner_core.traces.trace import (
    DYNAMO_TRACE_SCHEMA,
    MAX_EPOCH_MS,
    MAX_REQUEST_TOKENS,
    MAX_TRACE_SPAN_S,
    MOONCAKE_EPOCH_S,
    TRACE_SUFFIXES,
    RequestTrace,
    TraceError,
    TraceFormat,
    bucket_window_starts,
    bucket_windows,
)

__all__ = [
    "DAY_S",
    "DYNAMO_TRACE_SCHEMA",
    "MAX_EPOCH_MS",
    "MAX_REQUEST_TOKENS",
    "MAX_TRACE_SPAN_S",
    "MOONCAKE_EPOCH_S",
    "TRACE_SUFFIXES",
    "RateShape",
    "RequestTrace",
    "TraceError",
    "TraceFormat",
    "bucket_window_starts",
    "bucket_windows",
    "detect_format",
    "load_servegen_shape",
    "load_trace",
    "load_traces",
    "resolve_trace_paths",
    "shape_trace",
]
