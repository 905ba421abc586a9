"""Two hindsight references for `planner bench`, asked for by name: `static-best` and `oracle-budget`.

Both know the whole trace, like the oracle; what they answer is what a user compares an autoscaler with.

`static-best`: the cheapest fixed size (P prefill, D decode workers; A aggregated engines in aggregated mode) that
serves at least the target share (`OracleSettings.target_attainment`, the bench's `--oracle-target`) of the
attainable requests within both targets over the whole run: the static allocation a user would have bought.
"Cheapest" is the fewest GPUs (a fixed size's GPU-hours are its GPUs times the run's length), ties broken by more
requests met. The search (`static_best`) simulates the whole trace at fixed sizes in the bench's simulator, each
size once:

- bounds from the oracle's per-window sizes: per pool from the smallest to the largest (`static-peak`) size any
  window needed. A fixed size below every window's need misses the target in every window. When the largest
  size does not reach the target over the whole run (warm-up and drain effects the windows do not see), both
  pools are doubled until it does (at most `max_replicas`);
- a staircase walk over the (P, D) grid from the most prefill and the fewest decode workers: a size that meets
  the target is a candidate and the walk takes one prefill worker off; one that fails takes one decode worker
  more. It assumes more workers in a pool never lower the whole run's attainment, and it uses that only to choose
  which sizes to simulate: a size is a candidate only once its whole run has been simulated and counted. Sizes
  with more GPUs than the best candidate so far are not simulated (they cannot win). About (P range + D range)
  simulations of the whole trace.

`oracle-budget`: per-window sizes such that the whole run (not each window) meets the target, at the fewest
GPU-hours: the misses spent in the windows where serving them is dearest. The oracle holds every window to the
target, so its GPU-hours are not a lower bound on what meeting the target over the whole run costs (on nearly flat
traffic a fixed size can even beat it); `oracle-budget` is that lower bound, as far as the oracle's window
simulations measure it. The choice (`budget_choice`) is made on the oracle's own per-window simulations
(`OracleWindow.menu`: every size simulated for a window and the requests it met there): one size per window,
minimising the GPU cost subject to the total requests met >= ceil(target * attainable requests). That is a
multiple-choice knapsack; it is solved approximately:

1. Lagrangian relaxation: at a price per request met, each window takes the size minimising
   cost - price * met; the price is bisected to the smallest one whose choice meets the total;
2. greedy repair: while the total exceeds what is required, the window whose switch to a cheaper size of its menu
   saves the most GPU-seconds without going under the total switches;
3. never dearer than the oracle's own choice (which meets the total, every window meeting its own share): if the
   result costs more, the oracle's sizes are kept.

The menus are what the oracle's search happened to simulate (3 to 6 sizes per window, around the oracle's answer)
with the warm-up at the oracle's previous size, not the chosen one; so the choice is approximate twice over. The
chosen sizes are then run like the oracle's (`OraclePolicy`: instant, at each window's start) in the full
simulator and scored like every row: the row's attainment is measured, not the menu's sum.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner_core.lab.sim.des import ClusterSimulator, SimSpec
from planner_core.lab.sim.oracle import OracleSettings, OracleWindow, attainable_mask
from planner_core.perf.forward import ForwardPassModel
from planner_core.traces import RequestTrace

__all__ = [
    "BudgetChoice",
    "StaticSearch",
    "budget_choice",
    "budget_sizes",
    "static_best",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticSearch:
    """`static_best`'s answer: the size, its whole run's figures and every size simulated on the way."""

    size: tuple[int, int]
    num_met: int  # requests within both targets over the whole run at `size`
    num_attainable: int
    num_required: int  # ceil(target * num_attainable)
    feasible: bool  # False: no size up to `max_replicas` met the target; `size` is the best one simulated
    tried: tuple[tuple[int, int, int], ...]  # (prefill, decode, requests met), in the order simulated
    search_s: float


def _whole_run_met(
    trace: RequestTrace, fwd: ForwardPassModel, spec: SimSpec, size: tuple[int, int], *, ttft_ms: float, itl_ms: float
) -> int:
    """Requests within both targets when the whole trace is served at a fixed size (as `FixedPolicy` runs and
    `score` counts it)."""
    sim = ClusterSimulator(trace, fwd, spec, num_prefill=size[0], num_decode=size[1])
    sim.run_to_completion()
    result = sim.result()
    ttft = result.ttft_s * 1000.0
    itl = result.itl_s * 1000.0
    ttft_met = np.isfinite(ttft) & (ttft <= ttft_ms)
    itl_met = np.isfinite(result.finish_s) & (~np.isfinite(itl) | (itl <= itl_ms))
    return int((ttft_met & itl_met).sum())


def static_best(
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    windows: Sequence[OracleWindow],
    *,
    ttft_ms: float,
    itl_ms: float,
    settings: OracleSettings = OracleSettings(),  # noqa: B008 - frozen value
    progress: Callable[[str], None] | None = None,
) -> StaticSearch:
    """The cheapest fixed size meeting the target over the whole run (module docstring), searched from the
    oracle's `windows`. `progress` gets one line per size simulated (default: stderr)."""
    started = time.perf_counter()
    say = progress if progress is not None else (lambda line: sys.stderr.write(line + "\n"))
    num_attainable = int(attainable_mask(trace, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms).sum())
    required = math.ceil(settings.target_attainment * num_attainable - 1e-9)
    gpus = (spec.prefill_limits.num_gpu, spec.decode_limits.num_gpu)
    floor = (0 if spec.aggregated else settings.min_prefill, settings.min_decode)
    sizes = [(w.num_prefill, w.num_decode) for w in windows] or [floor]
    low = (max(floor[0], min(p for p, _ in sizes)), max(floor[1], min(d for _, d in sizes)))
    high = [max(low[0], max(p for p, _ in sizes)), max(low[1], max(d for _, d in sizes))]
    tried: dict[tuple[int, int], int] = {}

    def met(size: tuple[int, int]) -> int:
        if size not in tried:
            tried[size] = _whole_run_met(trace, fwd, spec, size, ttft_ms=ttft_ms, itl_ms=itl_ms)
            share = tried[size] / num_attainable if num_attainable else 1.0
            say(f"static-best: {size[0]}/{size[1]} serves {share:.2%} of attainable ({len(tried)} simulated)")
        return tried[size]

    def cost(size: tuple[int, int]) -> int:
        return size[0] * gpus[0] + size[1] * gpus[1]

    cap = settings.max_replicas
    while met((high[0], high[1])) < required:
        grown = [min(cap, high[0] * 2), min(cap, high[1] * 2)]  # 0 prefill (aggregated mode) stays 0
        if grown == high:
            break
        high = grown
    best: tuple[int, int] | None = None
    prefill, decode = high[0], low[1]
    while prefill >= low[0] and decode <= high[1]:
        size = (prefill, decode)
        if best is not None and cost(size) > cost(best):  # dearer than a candidate: only fewer prefill can win
            prefill -= 1
        elif met(size) >= required:
            if best is None or (cost(size), -tried[size]) < (cost(best), -tried[best]):
                best = size
            prefill -= 1
        else:
            decode += 1
    feasible = best is not None
    if best is None:  # the most requests met, at the fewest GPUs
        best = min(tried, key=lambda s: (-tried[s], cost(s)))
    return StaticSearch(
        size=best,
        num_met=tried[best],
        num_attainable=num_attainable,
        num_required=required,
        feasible=feasible,
        tried=tuple((p, d, m) for (p, d), m in tried.items()),
        search_s=time.perf_counter() - started,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetChoice:
    """`budget_choice`'s answer: the option chosen per window, its total cost and requests met, and the price."""

    chosen: tuple[int, ...]
    cost: float
    met: int
    price: float  # the Lagrangian price per request met (0: the cheapest options already meet the total)
    from_fallback: bool  # the fallback was kept (the relaxation's choice was not cheaper, or nothing met the total)


def budget_choice(
    menus: Sequence[Sequence[tuple[float, int]]], required: int, *, fallback: Sequence[int]
) -> BudgetChoice:
    """One option per window, (cost, requests met) from each window's menu, minimising the total cost subject to
    total met >= `required` (approximately: the module docstring's steps 1 to 3). `fallback` (one index per
    window, e.g. the oracle's sizes) is returned when the choice found is not cheaper or when no choice meets
    `required`. Pure; deterministic (ties go to the cheaper option, then the earlier one)."""
    if len(fallback) != len(menus) or any(not menu for menu in menus):
        raise ValueError("budget_choice: one non-empty menu and one fallback index per window")

    def pick(price: float) -> list[int]:
        return [min(range(len(menu)), key=lambda i, m=menu: (m[i][0] - price * m[i][1], m[i][0], i)) for menu in menus]

    def totals(chosen: Sequence[int]) -> tuple[float, int]:
        return (
            float(sum(menus[w][i][0] for w, i in enumerate(chosen))),
            int(sum(menus[w][i][1] for w, i in enumerate(chosen))),
        )

    spread = max(max(c for c, _ in menu) - min(c for c, _ in menu) for menu in menus)
    high = spread + 1.0  # above it, one more request met is worth any option's extra cost: the most met per window
    fallback_cost, fallback_met = totals(fallback)
    kept = BudgetChoice(chosen=tuple(fallback), cost=fallback_cost, met=fallback_met, price=high, from_fallback=True)
    if totals(pick(high))[1] < required:
        return kept
    low = 0.0
    if totals(pick(low))[1] >= required:
        high = low
    else:
        for _ in range(100):  # bisection: the smallest price whose choice meets the total
            middle = (low + high) / 2.0
            if totals(pick(middle))[1] >= required:
                high = middle
            else:
                low = middle
            if high - low <= 1e-9 * max(1.0, high):
                break
    chosen = pick(high)
    _repair(menus, chosen, required)
    cost, met = totals(chosen)
    if cost >= fallback_cost and fallback_met >= required:
        return dataclasses.replace(kept, price=high)
    return BudgetChoice(chosen=tuple(chosen), cost=cost, met=met, price=high, from_fallback=False)


def _repair(menus: Sequence[Sequence[tuple[float, int]]], chosen: list[int], required: int) -> None:
    """Step 2: while the total met exceeds `required`, switch the window whose cheaper option saves the most cost
    without the total going under it (in place)."""
    slack = sum(menus[w][i][1] for w, i in enumerate(chosen)) - required
    while slack > 0:
        best: tuple[float, int, int, int] | None = None  # (saving, -loss, window, option)
        for w, menu in enumerate(menus):
            cost_now, met_now = menu[chosen[w]]
            for i, (cost, met) in enumerate(menu):
                loss = met_now - met
                if cost < cost_now and loss <= slack:
                    candidate = (cost_now - cost, -loss, -w, -i)
                    if best is None or candidate > best:
                        best = candidate
        if best is None:
            return
        _, neg_loss, neg_w, neg_i = best
        chosen[-neg_w] = -neg_i
        slack += neg_loss


def budget_sizes(
    windows: Sequence[OracleWindow], *, target_attainment: float, gpus: tuple[int, int], window_s: float
) -> tuple[list[tuple[int, int]], BudgetChoice]:
    """`oracle-budget`'s size per window from the oracle's windows and their menus (module docstring): the
    knapsack `budget_choice` over GPU-seconds per window (GPUs times `window_s`), with the oracle's sizes as the
    fallback. A window without a menu keeps the oracle's size."""
    menus: list[list[tuple[int, int, int]]] = []
    fallback: list[int] = []
    for window in windows:
        own = (window.num_prefill, window.num_decode, window.num_met)
        menu = list(window.menu) or [own]
        index = next((i for i, (p, d, _) in enumerate(menu) if (p, d) == own[:2]), None)
        if index is None:
            menu.append(own)
            index = len(menu) - 1
        menus.append(menu)
        fallback.append(index)
    required = math.ceil(target_attainment * sum(w.num_attainable for w in windows) - 1e-9)
    priced = [[(float((p * gpus[0] + d * gpus[1]) * window_s), met) for p, d, met in menu] for menu in menus]
    choice = budget_choice(priced, required, fallback=fallback)
    sizes = [(menus[w][i][0], menus[w][i][1]) for w, i in enumerate(choice.chosen)]
    return sizes, choice
