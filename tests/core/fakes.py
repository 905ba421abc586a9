"""Hand-checkable stand-ins shared by the decision-core and the simulator tests (tests/lab/test_sim_des.py and
those built on it): a linear forward-pass model whose iteration times can be worked out by hand, and a request
trace written from lists. Pure: no simulator, no runtime."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner_core.traces import RequestTrace


@dataclass(frozen=True, slots=True)
class LinearFwd:
    """prefill: 10 ms + 0.1 ms per 1k tokens... written out: 0.010 + tokens * 1e-5 s; decode: 0.005 + 1e-4 per
    request + 1e-8 per KV token."""

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return 0.010 + prefill_tokens * 1e-5

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return 0.005 + num_decode_requests * 1e-4 + decode_kv_tokens * 1e-8

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.prefill_wall_s(prefill_tokens) + self.decode_wall_s(num_decode_requests, decode_kv_tokens)


FWD = LinearFwd()


def make_trace(arrival_s: list[float], isl: list[int], osl: list[int]) -> RequestTrace:
    def frozen(values: list[float] | list[int]) -> np.ndarray:
        array = np.asarray(values, dtype=float)
        array.flags.writeable = False
        return array

    return RequestTrace(source="test", start_epoch_s=0.0, arrival_s=frozen(arrival_s), isl=frozen(isl), osl=frozen(osl))
