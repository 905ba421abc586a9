"""A plugin server for the tests of out-of-process plugins: one process serving every stage of the plugin contract.

Run as `python tests/runtime/grpc_plugin_server.py --port 0 --mode-file PATH`; it prints `port <n>` once serving. Each
call reads the behaviour from the mode file (so a test can change it without restarting the process):

* `ok`: OBSERVE `queue_depth` = 42; PREDICT num_req 1000, isl 2000 (no osl); PROPOSE decode AT_LEAST
  `queue_depth` / 10 (rounded up; it reads the OBSERVE value from the context); RECONCILE prefill AT_MOST 7 and
  echoes how many PROPOSE results it saw in its reason; CONSTRAIN decode AT_MOST 9.
* `slow`: sleeps 2 s, then answers as `ok` (the client's deadline is shorter).
* `garbage`: replies bytes that are not the response message.
* `error`: fails the call with FAILED_PRECONDITION.
* `bad`: a well-formed reply that breaks the contract (negative replicas, a NaN forecast, an unknown pool).
* `reject`: PROPOSE / RECONCILE / CONSTRAIN reject the tick.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc

from planner_core.runtime.plugin_proto import plugin_pb2 as pb

SERVICE = "dynamo.planner.plugin.v1"
STAGES = {
    "ObservePlugin": ("Observe", pb.ObserveStageRequest),
    "PredictPlugin": ("Predict", pb.PredictStageRequest),
    "ProposePlugin": ("Propose", pb.ProposeStageRequest),
    "ReconcilePlugin": ("Reconcile", pb.ReconcileStageRequest),
    "ConstrainPlugin": ("Constrain", pb.ConstrainStageRequest),
}


def ok_reply(method: str, request) -> bytes:
    if method == "Observe":
        return pb.ObserveStageResponse(values={"queue_depth": 42.0}, reason="external queue").SerializeToString()
    if method == "Predict":
        data = pb.PredictionData(predicted_num_req=1000.0, predicted_isl=2000.0, source="test")
        return pb.PredictStageResponse(predictions=data, reason="forecast service").SerializeToString()
    if method == "Propose":
        depth = request.context.observations.plugin_values.get("queue_depth", 0.0)
        target = pb.ComponentTarget(sub_component_type="decode", replicas=math.ceil(depth / 10), type=pb.AT_LEAST)
        return pb.ProposeStageResponse(
            override=pb.OverrideResult(targets=[target], reason=f"queue {depth:g}")
        ).SerializeToString()
    if method == "Reconcile":
        target = pb.ComponentTarget(sub_component_type="prefill", replicas=7, type=pb.AT_MOST)
        reason = f"saw {len(request.proposals)} proposals"
        return pb.ReconcileStageResponse(
            override=pb.OverrideResult(targets=[target], reason=reason)
        ).SerializeToString()
    target = pb.ComponentTarget(sub_component_type="decode", replicas=9, type=pb.AT_MOST)
    return pb.ConstrainStageResponse(override=pb.OverrideResult(targets=[target], reason="cap")).SerializeToString()


def bad_reply(method: str) -> bytes:
    if method == "Observe":
        return pb.ObserveStageResponse(values={"queue_depth": math.nan}).SerializeToString()
    if method == "Predict":
        return pb.PredictStageResponse(predictions=pb.PredictionData(predicted_num_req=-5.0)).SerializeToString()
    if method == "Propose":
        target = pb.ComponentTarget(sub_component_type="decode", replicas=-3, type=pb.SET)
        return pb.ProposeStageResponse(override=pb.OverrideResult(targets=[target])).SerializeToString()
    target = pb.ComponentTarget(sub_component_type="encoder", replicas=2, type=pb.AT_MOST)
    response = pb.ReconcileStageResponse if method == "Reconcile" else pb.ConstrainStageResponse
    return response(override=pb.OverrideResult(targets=[target])).SerializeToString()


def reject_reply(method: str) -> bytes:
    response = {"Propose": pb.ProposeStageResponse, "Reconcile": pb.ReconcileStageResponse}.get(
        method, pb.ConstrainStageResponse
    )
    return response(reject=pb.RejectResult(reason="maintenance window")).SerializeToString()


def handler(mode_file: Path, method: str, request_type):
    def answer(raw: bytes, context: grpc.ServicerContext) -> bytes:
        mode = mode_file.read_text().strip()
        request = request_type.FromString(raw)
        if mode == "slow":
            time.sleep(2.0)
            mode = "ok"
        if mode == "garbage":
            return b"\xff\xff\xff\xff"  # field number 0 / truncated varint: not a protobuf message
        if mode == "error":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "plugin not configured")
        if mode == "bad":
            return bad_reply(method)
        if mode == "reject" and method not in ("Observe", "Predict"):
            return reject_reply(method)
        return ok_reply(method, request)

    # raw bytes both ways, so that `garbage` can send what no generated servicer would
    return grpc.unary_unary_rpc_method_handler(answer)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode-file", type=Path, required=True)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for service, (method, request_type) in STAGES.items():
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    f"{SERVICE}.{service}", {method: handler(args.mode_file, method, request_type)}
                ),
            )
        )
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    sys.stdout.write(f"port {port}\n")
    sys.stdout.flush()
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
