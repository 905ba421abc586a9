"""Prefill sizing for a router that spreads requests by count (ours): round robin, which the config declares with
`router: round_robin` (Dynamo's frontend default, `--router-mode round-robin`).

Why: the burst rule (`planner_core.policy.throughput.burst_prefill_replicas`) pools a burst's prompt tokens over
every engine, which a load-aware router approximates. A router that spreads requests by count makes each engine its
own queue: a long prompt holds its engine while the router keeps sending it every P-th request. On Mooncake x2 at
500 ms that needs about twice the engines (docs/results/closed-loop/dynamo-mooncake-cause.md: 99 % of the best
attainment at 7 engines least loaded, 12-14 round robin, in our simulator and in Dynamo's replay alike).

The size (`by_count_prefill_need`): the fewest engines for which a first-come-first-served dispatch of the window's
recorded prompts by count (request i to engine i mod P, each prompt's compute at the learned speed) serves the
target share of the prompts that can meet the TTFT target alone within it. Against Dynamo's replay at 7, 10 and 14
fixed engines this dispatch predicted the share within 500 ms at 0.664, 0.720, 0.740 where Dynamo served 0.673, 0.725,
0.745 (a dispatch to the engine free first: 0.726, 0.747, 0.749).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner_core.domain import Component, ReasonCode, StepName, StepRecord, TrafficObservation

__all__ = ["by_count_prefill_need", "by_count_prefill_size", "prompt_compute_s"]


def by_count_prefill_need(
    arrivals_s: Sequence[float],
    compute_s: Sequence[float],
    *,
    ttft_s: float,
    target_share: float,
    max_replicas: int,
) -> int | None:
    """The fewest engines (up to `max_replicas`) for which a by-count dispatch of the prompts arriving at
    `arrivals_s` (sorted) and computing for `compute_s` each serves `target_share` of the prompts that can meet
    `ttft_s` alone within it; `max_replicas` when none does; None without such a prompt."""
    attainable = sum(1 for c in compute_s if c <= ttft_s)
    if attainable == 0 or max_replicas < 1:
        return None
    required = target_share * attainable

    def served(replicas: int) -> int:
        free_s = [0.0] * replicas
        within = 0
        for index, (at_s, work_s) in enumerate(zip(arrivals_s, compute_s, strict=True)):
            engine = index % replicas
            free_s[engine] = max(at_s, free_s[engine]) + work_s
            within += free_s[engine] - at_s <= ttft_s
        return within

    # each try is one pass over the window's prompts: the scan from one engine up costs little
    return next((replicas for replicas in range(1, max_replicas + 1) if served(replicas) >= required), max_replicas)


def prompt_compute_s(lengths: Sequence[float], hit: float, prefill_s: Callable[[float], float]) -> list[float]:
    """Each prompt's compute (s) with `hit` of it found in a prefix cache, at least one token computed."""
    return [prefill_s(max(1.0, float(round(length * (1.0 - hit))))) for length in lengths]


def by_count_prefill_size(
    traffic: TrafficObservation,
    chunked_s: Callable[[float], float] | None,
    *,
    hit: float,
    ttft_ms: float,
    target_share: float,
    max_replicas: int,
    current: int,
) -> tuple[int | None, StepRecord]:
    """The prefill size a by-count router needs for the window just observed (`by_count_prefill_need` on its
    recorded prompts, each computed by `chunked_s` with `hit` of it cached), and its `burst` step: raised over
    `current`, covered by it, or unavailable (None: no per-request prompts recorded, or no model)."""
    arrivals = traffic.prompt_arrivals
    if chunked_s is None or arrivals is None or arrivals.resolution_s != 0 or not arrivals.isl:
        why = "no forward-pass model" if chunked_s is None else "no per-request prompts recorded in the window"
        return None, _unavailable(why)
    compute_s = prompt_compute_s(arrivals.isl, hit, chunked_s)
    need = by_count_prefill_need(
        arrivals.at_s, compute_s, ttft_s=ttft_ms / 1000.0, target_share=target_share, max_replicas=max_replicas
    )
    if need is None:
        return None, _unavailable(f"no prompt of the window can meet TTFT {ttft_ms:g} ms alone")
    size = max(need, current)
    step = StepRecord(
        step=StepName.BURST,
        component=Component.PREFILL,
        value=size,
        reason=ReasonCode.BURST_BY_COUNT_SIZED if need > current else ReasonCode.BURST_BY_COUNT_COVERED,
        detail=(
            f"a by-count dispatch of the window's {len(compute_s)} prompts serves {target_share:.0%} of those that "
            f"can meet TTFT {ttft_ms:g} ms alone with {need} engines; size {current} -> {size}"
        ),
    )
    return need, step


def _unavailable(why: str) -> StepRecord:
    return StepRecord(
        step=StepName.BURST,
        component=Component.PREFILL,
        reason=ReasonCode.BURST_BY_COUNT_UNAVAILABLE,
        detail=f"{why}: not sized by count",
    )
