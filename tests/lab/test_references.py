"""The hindsight references `static-best` and `oracle-budget` (`planner_core.lab.sim.references`): the search of
the cheapest fixed size against a brute force, the knapsack choice as a pure function, and the per-window budget
run in the simulator against the oracle."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from planner_core.lab.sim.bench import FixedPolicy, build_policies, run_bench
from planner_core.lab.sim.des import SimSpec
from planner_core.lab.sim.dynamo_engine import dynamo_bench
from planner_core.lab.sim.frontier import REFERENCES, frontier_points, startup_goal
from planner_core.lab.sim.oracle import OracleSettings, OracleWindow, oracle_windows
from planner_core.lab.sim.policies import OracleBudgetPolicy, StaticBestPolicy
from planner_core.lab.sim.references import budget_choice, budget_sizes, static_best
from planner_core.perf.model import ProfilePerfModel
from tests.conftest import PROFILE_DIR
from tests.lab.test_bench import busy_trace

TTFT_MS, ITL_MS, WINDOW_S = 1000.0, 50.0, 60.0


@dataclass(frozen=True, slots=True)
class SlowFwd:
    """`tests.core.fakes.LinearFwd` ten times slower: a few workers per pool for the busy trace below."""

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return 0.010 + prefill_tokens * 1e-4

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return 0.005 + num_decode_requests * 1e-3 + decode_kv_tokens * 1e-7

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.prefill_wall_s(prefill_tokens) + self.decode_wall_s(num_decode_requests, decode_kv_tokens)


FWD = SlowFwd()


@pytest.fixture(scope="module")
def case():
    """A load step (the rate doubles halfway) of 6000 requests over 10 minutes and its oracle windows: 2 to 3
    prefill and 2 to 5 decode workers per window."""
    trace = busy_trace(6000, 600.0)
    windows = oracle_windows(trace, FWD, SimSpec(), ttft_ms=TTFT_MS, itl_ms=ITL_MS, window_s=WINDOW_S)
    return trace, windows


def test_static_best_is_the_cheapest_fixed_size_meeting_the_target_over_the_whole_run(case) -> None:
    trace, windows = case
    lines: list[str] = []
    found = static_best(trace, FWD, SimSpec(), windows, ttft_ms=TTFT_MS, itl_ms=ITL_MS, progress=lines.append)
    peak = (max(w.num_prefill for w in windows), max(w.num_decode for w in windows))
    # brute force: every fixed size up to the oracle's peak per pool, run and scored as any bench row
    sizes = list(itertools.product(range(1, peak[0] + 1), range(1, peak[1] + 1)))
    policies = [FixedPolicy(name=f"fixed:{p}:{d}", num_prefill=p, num_decode=d) for p, d in sizes]
    runs = run_bench(policies, trace, FWD, SimSpec(), ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    met = {size: round(run.row.sla_attainment * trace.num_requests) for size, run in zip(sizes, runs, strict=True)}
    meeting = [size for size in sizes if met[size] >= found.num_required]
    cheapest = min(meeting, key=lambda s: (s[0] + s[1], -met[s]))
    assert found.feasible and found.size == cheapest
    assert found.num_met == met[cheapest]
    assert found.num_required == 5940 and found.num_attainable == 6000  # ceil(0.99 * attainable)
    # cheaper than the static peak here, and every size it counted was simulated in full (one progress line each)
    assert cheapest[0] + cheapest[1] < peak[0] + peak[1]
    assert len(lines) == len(found.tried) < len(sizes)
    assert all(met[(p, d)] == m for p, d, m in found.tried)


def test_budget_choice_spends_the_misses_where_they_are_cheapest() -> None:
    # two windows; option (cost, met). Required 18 of 20: the second window's miss is cheaper to allow.
    menus = [[(4.0, 8), (6.0, 10)], [(1.0, 8), (4.0, 10)]]
    choice = budget_choice(menus, 18, fallback=[1, 1])
    assert choice.chosen == (1, 0) and choice.cost == 7.0 and choice.met == 18 and not choice.from_fallback
    # enough with the cheapest options: price 0
    assert budget_choice(menus, 16, fallback=[1, 1]).chosen == (0, 0)
    assert budget_choice(menus, 16, fallback=[1, 1]).price == 0.0
    # nothing reaches the total: the fallback
    assert budget_choice(menus, 21, fallback=[1, 1]).from_fallback
    with pytest.raises(ValueError, match="one non-empty menu"):
        budget_choice(menus, 18, fallback=[1])


def test_budget_choice_is_feasible_and_never_dearer_than_the_fallback_against_brute_force() -> None:
    import random

    rng = random.Random(7)
    for _ in range(200):
        menus = []
        for _window in range(rng.randint(1, 4)):
            options = sorted({(rng.randint(1, 12), rng.randint(0, 10)) for _ in range(rng.randint(1, 4))})
            menus.append([(float(c), m) for c, m in options])
        best_met = sum(max(m for _, m in menu) for menu in menus)
        required = rng.randint(0, best_met)
        fallback = [max(range(len(menu)), key=lambda i, m=menu: (m[i][1], -m[i][0])) for menu in menus]
        choice = budget_choice(menus, required, fallback=fallback)
        exact = min(
            sum(menus[w][i][0] for w, i in enumerate(pick))
            for pick in itertools.product(*(range(len(menu)) for menu in menus))
            if sum(menus[w][i][1] for w, i in enumerate(pick)) >= required
        )
        assert choice.met >= required
        assert choice.cost == sum(menus[w][i][0] for w, i in enumerate(choice.chosen))
        assert exact <= choice.cost <= sum(menus[w][i][0] for w, i in enumerate(fallback))


def test_budget_sizes_take_the_menus_and_keep_a_window_without_one() -> None:
    def window(index: int, size: tuple[int, int], met: int, menu: tuple[tuple[int, int, int], ...]) -> OracleWindow:
        attainable = 10 if menu else 0
        return OracleWindow(
            index=index, start_s=60.0 * index, num_requests=10, num_attainable=attainable, num_required=attainable,
            num_prefill=size[0], num_decode=size[1], num_ttft_met=met, num_met=met, feasible=True,
            num_simulations=len(menu), menu=menu,
        )  # fmt: skip

    windows = [
        window(0, (2, 2), 10, ((2, 2, 10), (2, 1, 9))),  # one decode worker fewer loses one request
        window(1, (3, 2), 10, ((3, 2, 10), (2, 2, 5))),  # one prefill worker fewer loses half
        window(2, (1, 1), 0, ()),  # nothing attainable, no menu: kept
    ]
    sizes, choice = budget_sizes(windows, target_attainment=0.95, gpus=(1, 1), window_s=60.0)
    assert sizes == [(2, 1), (3, 2), (1, 1)]  # 19 of 20 required: the cheap miss
    assert choice.met == 19 and not choice.from_fallback


def test_oracle_budget_meets_the_target_over_the_run_for_no_more_than_the_oracle(case) -> None:
    trace, _ = case
    base = {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "throughput_adjustment_interval_seconds": int(WINDOW_S)}
    perf = ProfilePerfModel.load(PROFILE_DIR)
    policies = build_policies(
        ["oracle", "static-peak", "static-best", "oracle-budget"], base, trace, perf, FWD, SimSpec(), window_s=WINDOW_S
    )
    budget, best = policies[3], policies[2]
    assert isinstance(budget, OracleBudgetPolicy) and isinstance(best, StaticBestPolicy)
    assert budget.num_required == 5940 and budget.choice is not None and budget.choice.met >= 5940
    runs = run_bench(policies, trace, FWD, SimSpec(), ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    rows = {run.row.policy: run.row for run in runs}
    assert rows["oracle-budget"].gpu_hours <= rows["oracle"].gpu_hours
    assert rows["oracle-budget"].sla_attainment / rows["oracle-budget"].attainable >= 0.99  # measured
    assert rows["static-best"].sla_attainment / rows["static-best"].attainable >= 0.99
    assert rows["static-best"].gpu_hours < rows["static-peak"].gpu_hours
    # references, never competitors of the shipped policy
    assert {"static-best", "oracle-budget"} <= set(REFERENCES)
    points = frontier_points([{"policy": "planner", "gpu_hours": 9.0, "sla_attainment": 0.5}] + [
        {"policy": name, "gpu_hours": row.gpu_hours, "sla_attainment": row.sla_attainment}
        for name, row in rows.items()
    ])  # fmt: skip
    assert "static-best" not in startup_goal(points).cheaper_and_better
    assert "oracle-budget" not in startup_goal(points).cheaper_and_better


def test_the_references_run_on_the_default_engine_only(case) -> None:
    trace, _ = case
    with pytest.raises(ValueError, match="static-best run on --engine sim only"):
        dynamo_bench(
            ["oracle", "static-best"], lambda _names: [], trace, SimSpec(), ttft_ms=TTFT_MS, itl_ms=ITL_MS,
            window_s=WINDOW_S, settings=OracleSettings(), initial="oracle", dynamo_python=None, profile_dir=None,
        )  # fmt: skip
