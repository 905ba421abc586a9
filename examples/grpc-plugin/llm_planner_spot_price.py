"""Example out-of-process planner plugin: a GPU spot-price feed and a price cap, served over gRPC.

One process serves two stages of the planner's plugin contract (`dynamo.planner.plugin.v1`):

* OBSERVE (`ObservePlugin.Observe`): the GPU price at the tick's time, `spot_price_usd_per_gpu_hour`, from a
  price per hour of the day (UTC). The planner records the value with the tick and hands it to every later stage.
* CONSTRAIN (`ConstrainPlugin.Constrain`): while that price is above `--max-price`, a ceiling (`AT_MOST`) on the
  pools given with `--max-decode` / `--max-prefill`; otherwise no opinion. The planner's own floors (minimum
  endpoints) still apply after it.

It reads the tick's time from the request (`tick_time_s`), never its own clock, and keeps no state, so the same
tick always gets the same answer. Run it with `llm-planner-spot-price --listen 127.0.0.1:50061 --price 3.2
--max-price 2.5 --max-decode 2` and list it in the planner config (docs/plugins.md, "Out-of-process plugins").
"""

from __future__ import annotations

import argparse
import signal
import sys
from concurrent import futures

import grpc

from planner_core.runtime.plugin_proto import plugin_pb2 as pb
from planner_core.runtime.plugin_proto import plugin_pb2_grpc as pb_grpc

PRICE_NAME = "spot_price_usd_per_gpu_hour"


def hourly_prices(text: str) -> tuple[float, ...]:
    """`3.2` (all day) or 24 comma-separated prices, one per UTC hour."""
    prices = tuple(float(part) for part in text.split(","))
    if len(prices) not in (1, 24) or any(p < 0 for p in prices):
        raise argparse.ArgumentTypeError(f"--price {text!r}: one price or 24 comma-separated prices, all >= 0")
    return prices


class SpotPrice(pb_grpc.ObservePluginServicer, pb_grpc.ConstrainPluginServicer):
    """Both stages; stateless."""

    def __init__(self, prices: tuple[float, ...], max_price: float, caps: dict[str, int]) -> None:
        self.prices, self.max_price, self.caps = prices, max_price, caps

    def price_at(self, tick_time_s: float) -> float:
        if len(self.prices) == 1:
            return self.prices[0]
        return self.prices[int(tick_time_s // 3600) % 24]

    def Observe(self, request: pb.ObserveStageRequest, _context: grpc.ServicerContext) -> pb.ObserveStageResponse:  # noqa: N802
        price = self.price_at(request.context.tick_time_s)
        return pb.ObserveStageResponse(values={PRICE_NAME: price}, reason="hourly spot price")

    def Constrain(self, request: pb.ConstrainStageRequest, _context: grpc.ServicerContext) -> pb.ConstrainStageResponse:  # noqa: N802
        values = request.context.observations.plugin_values
        if PRICE_NAME not in values:  # the feed did not answer this tick: no opinion rather than a guess
            return pb.ConstrainStageResponse(accept=pb.AcceptResult())
        price = values[PRICE_NAME]
        if price <= self.max_price:
            return pb.ConstrainStageResponse(accept=pb.AcceptResult())
        targets = [
            pb.ComponentTarget(sub_component_type=pool, replicas=cap, type=pb.AT_MOST)
            for pool, cap in self.caps.items()
        ]
        reason = f"spot price {price:g} > {self.max_price:g} USD per GPU-hour"
        return pb.ConstrainStageResponse(override=pb.OverrideResult(targets=targets, reason=reason))


def serve(listen: str, plugin: SpotPrice) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ObservePluginServicer_to_server(plugin, server)
    pb_grpc.add_ConstrainPluginServicer_to_server(plugin, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"--listen {listen!r}: cannot bind")
    server.start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50061", help="host:port to serve on")
    parser.add_argument("--price", type=hourly_prices, default=(1.0,), help="price, or 24 hourly prices (UTC)")
    parser.add_argument("--max-price", type=float, default=2.5, help="above this price the caps apply")
    parser.add_argument("--max-decode", type=int, default=None, help="decode ceiling while expensive")
    parser.add_argument("--max-prefill", type=int, default=None, help="prefill ceiling while expensive")
    args = parser.parse_args(argv)
    caps = {pool: cap for pool, cap in (("prefill", args.max_prefill), ("decode", args.max_decode)) if cap is not None}
    server = serve(args.listen, SpotPrice(args.price, args.max_price, caps))
    sys.stdout.write(f"spot-price plugin serving on {args.listen}\n")  # tests and scripts wait for this line
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=None))
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
