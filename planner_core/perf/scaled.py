"""A forward-pass model whose engines run faster or slower than it, per phase.

Two users, one arithmetic: the simulator times engines that differ from their profile with it (`planner bench
--engine-speed`, `planner_core.lab.sim.des.speed`), and the closed loop (`planner_core.policy.feedback`) sizes each
pool with the engine speed it learned from the latency the pool served. A speed of 0.8 makes every iteration of that
phase take 1 / 0.8 of the model's time. A mixed iteration (a prompt chunk on a decode batch) is split as the model
times it: the decode step of its batch (`decode_wall_s(n, kv)`) at the decode speed, the rest at the prefill speed.
"""

from __future__ import annotations

from planner_core.perf.forward import ForwardPassModel

__all__ = ["SpeedScaledModel", "speed_scaled"]


class SpeedScaledModel:
    """`model` run by engines at `prefill_speed` and `decode_speed` times its own speed (module docstring)."""

    __slots__ = ("decode_speed", "model", "prefill_speed")

    def __init__(self, model: ForwardPassModel, *, prefill_speed: float, decode_speed: float) -> None:
        self.model, self.prefill_speed, self.decode_speed = model, prefill_speed, decode_speed

    def is_ready(self) -> bool:
        return self.model.is_ready()

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self.model.prefill_wall_s(prefill_tokens) / self.prefill_speed

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.model.decode_wall_s(num_decode_requests, decode_kv_tokens) / self.decode_speed

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        mixed_s = self.model.mixed_wall_s(prefill_tokens, num_decode_requests, decode_kv_tokens)
        if num_decode_requests <= 0:
            return mixed_s / self.prefill_speed
        decode_s = self.model.decode_wall_s(num_decode_requests, decode_kv_tokens)
        return decode_s / self.decode_speed + max(mixed_s - decode_s, 0.0) / self.prefill_speed


def speed_scaled(model: ForwardPassModel, *, prefill_speed: float = 1.0, decode_speed: float = 1.0) -> ForwardPassModel:
    """`model` itself at speed 1.0 in both phases (the same arithmetic, bit for bit), else `SpeedScaledModel`."""
    if prefill_speed == 1.0 and decode_speed == 1.0:
        return model
    return SpeedScaledModel(model, prefill_speed=prefill_speed, decode_speed=decode_speed)
