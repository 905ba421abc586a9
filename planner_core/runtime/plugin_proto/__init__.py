"""The out-of-process plugin contract: `plugin.proto` (package `dynamo.planner.plugin.v1`) and its generated stubs
`plugin_pb2*` (see README.md). The planner's client is `planner_core.runtime.plugin_client`; the example server is
`examples/grpc-plugin/`.
"""
