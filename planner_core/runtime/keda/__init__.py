"""KEDA external scaler: the planner's targets served to KEDA over its External Scaler gRPC API.

`scaler` is the server; `externalscaler_pb2*` are the generated stubs of `externalscaler.proto` (see README.md).
"""

DEFAULT_MAX_AGE_S = 600.0  # ten throughput ticks at the default 60 s interval: then the target is stale
