"""The benchmark's oracle: per window, the fewest workers with which that window's requests meet the SLA.

Role: the lower bound of GPU-hours that `planner bench` compares every policy with. The oracle knows the whole
trace in advance and scales instantly (no start-up time), so what it spends is what the traffic needs, window by
window, as the simulator itself (`planner_core.lab.sim.des`) judges it, not as any capacity model predicts it.

How it is computed, exactly:

1. Windows are `[k * window_s, (k + 1) * window_s)` in offsets from the first request, k = 0, 1, ...; the oracle
   holds one size (P prefill, D decode workers) per window and changes it at the window edges, instantly.
2. Attainable requests: a request is attainable when it meets both targets alone on an idle cluster (on the engines
   that serve the bench: at `SimSpec.engine_speed`, or the changed speed for a request arriving after
   `SimSpec.speed_change`, whatever the profile says): its prompt,
   computed in chunks of `max_num_batched_tokens` (`chunked_prefill_s`), plus its KV transfer, plus (when the first
   token comes from the decode engine, `SimSpec.first_token_from_decode`) one decode iteration of a batch of 1 over
   the prompt, within the TTFT target; and (if it has more than one output token) one decode iteration of a batch of
   1 at its mid-decode context, `decode_wall_s(1, ISL + (OSL - 1) / 2)`, within the ITL target. A window of n_a
   attainable requests must have at least `required = ceil(target_attainment * n_a)` requests meeting both targets
   (counting every request of the window, attainable or not).
3. Each window is simulated on its own, with `context_s` of the trace before it (warm-up: the backlog it
   inherits) and after it (tail: the traffic its last requests share the engines with); only the window's own
   requests are scored. The warm-up runs at the size the oracle chose for the previous window (the candidate
   size for the first window), which switches to the candidate size at the window's start as in the oracle's
   own run: added workers are ready at once, removed ones stop taking requests and drain their queues. The
   tail runs at the candidate size.
4. Disaggregation makes the pools separable, so the size is searched one pool at a time:
   - prefill: the prefill part of TTFT (to the end of prefill and KV transfer) depends only on the prefill pool,
     so the prefill pool is simulated alone (every request given one output token, first token at prefill end).
     P is the fewest prefill workers with which at least `required` of the window's requests meet the TTFT
     target with that part alone (a necessary condition);
   - decode: ITL depends only on the decode pool and on when requests reach it (their first-token times), so the
     decode pool is simulated alone, fed each request at its first-token time from the prefill run (an instant
     prefill stands in for the prefill pool). D is the fewest decode workers with which at least `required` of
     the window's requests meet both targets (TTFT = the prefill run's part + this run's wait for and time of the
     first decode iteration, ITL from this run);
   - the same decode search is repeated with P + 1 prefill workers, and the cheaper of (P, D(P)) and
     (P + 1, D(P + 1)) in GPUs is kept (fewer prefill workers on a tie): one more prefill worker can leave a
     bigger ITL-miss budget and so save a decode worker.
5. Each search assumes attainment grows with the pool's size: it starts from the previous window's answer, gallops
   (steps 1, 2, 4, ...) to bracket the target and bisects; the answer X always has X - 1 simulated and failing
   (or X at the minimum endpoint). At least `min_prefill` / `min_decode` workers; a pool that cannot reach the
   target with `max_replicas` workers is marked infeasible and gets the fewest workers, among the minimum times
   1, 2, 4, ... and `max_replicas`, that reach the most requests met (more would buy nothing).

Aggregated mode (`SimSpec.aggregated`: one pool of aggregated engines, chunked prefill piggybacked on decode):

- attainable: a request is attainable when, alone on an idle aggregated engine, its prompt computed in chunks
  of the engine's `max_num_batched_tokens` (`chunked_prefill_s` with `prefill_wall_s`, the mixed iteration with
  nothing decoding) is within the TTFT target (the iteration that ends the prompt yields the first token: no KV
  transfer, no extra decode iteration), and (if it has more than one output token) one decode iteration of a batch
  of 1 at its mid-decode context, `decode_wall_s(1, ISL + (OSL - 1) / 2)`, is within the ITL target; `required`
  as in step 2;
- the size is the number A of aggregated engines (no prefill pool: P = 0). Prefill and decode share the engines,
  so nothing is separable: each candidate A simulates the window with its context (step 3's rules: warm-up at the
  previous window's A, instant switch at the window's start, tail at A) on aggregated engines, and A is the
  fewest engines with which at least `required` of the window's requests meet both targets, searched with step
  5's gallop and bisection (at least `min_decode`; beyond `max_replicas` infeasible, with step 5's fallback).

Engines faster or slower than the profile (`SimSpec.engine_speed`, `speed_change`, `planner bench --engine-speed`):
the oracle is the clairvoyant reference on the engines that serve the bench, not on the profile: every window is
simulated with the spec's speeds (and its change, at its time: windows keep the trace's offsets), and
attainability uses them too. The planners still read the profile; what they lose to the lie is measured against
what the real engines needed.

The oracle policy then runs these sizes in the full simulator like any other policy (draining workers still cost
GPU-seconds there). Its GPU-hours are the lower bound for policies that hold one size per window; a policy that
resizes faster than the window could in principle spend less.

Cost: every candidate is a simulation of `window_s + 2 * context_s` of traffic for one pool; about 3 to 6
candidates per pool and window once the previous window's answer seeds the search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner_core.lab.sim.des import ClusterSimulator, SimSpec
from planner_core.perf.capacity import chunked_prefill_s
from planner_core.perf.forward import ForwardPassModel
from planner_core.traces import RequestTrace

__all__ = [
    "OracleSettings",
    "OracleWindow",
    "attainable_mask",
    "oracle_first_window",
    "oracle_windows",
    "smallest_meeting",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class OracleSettings:
    """How the oracle sizes each window (see the module docstring)."""

    target_attainment: float = 0.99  # fraction of a window's attainable requests that must meet both targets
    context_s: float = 60.0  # simulated traffic before and after each window, at the window's size
    min_prefill: int = 1
    min_decode: int = 1
    max_replicas: int = 512  # per pool; beyond it a window is infeasible


@dataclass(frozen=True, slots=True, kw_only=True)
class OracleWindow:
    """The oracle's answer for one window and the figures of the simulation that justified it."""

    index: int
    start_s: float
    num_requests: int
    num_attainable: int  # requests that meet both targets alone on an idle cluster
    num_required: int  # ceil(target_attainment * num_attainable)
    num_prefill: int  # 0 in aggregated mode
    num_decode: int  # aggregated engines in aggregated mode
    num_ttft_met: int  # requests of the window within the TTFT target at num_prefill (aggregated: at num_decode)
    num_met: int  # requests of the window within both targets at (num_prefill, num_decode)
    feasible: bool
    num_simulations: int
    # every size simulated through both pools for this window, (prefill, decode, requests within both targets), in
    # the order simulated: the menu `oracle-budget` chooses from (`planner_core.lab.sim.references`); empty for a
    # window with nothing required (held at the minimum size)
    menu: tuple[tuple[int, int, int], ...] = ()


class _InstantPrefill:
    """A forward-pass model whose prefill takes no time: the decode pool simulated on its own."""

    __slots__ = ("_fwd",)

    def __init__(self, fwd: ForwardPassModel) -> None:
        self._fwd = fwd

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:  # noqa: ARG002
        return 0.0

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self._fwd.decode_wall_s(num_decode_requests, decode_kv_tokens)

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:  # noqa: ARG002
        return self._fwd.decode_wall_s(num_decode_requests, decode_kv_tokens)


def attainable_mask(
    trace: RequestTrace, fwd: ForwardPassModel, spec: SimSpec, *, ttft_ms: float, itl_ms: float
) -> np.ndarray:
    """Per request: whether it meets both targets alone on an idle cluster (step 2 of the module docstring)."""
    isl = np.asarray(trace.isl, dtype=np.int64)
    osl = np.maximum(np.asarray(trace.osl, dtype=np.int64), 1)
    # An aggregated engine chunks the prompt by its own (the decode pool's) batch budget.
    limits = spec.decode_limits if spec.aggregated else spec.prefill_limits
    mbt = limits.max_num_batched_tokens
    unique_isl, inverse = np.unique(isl, return_inverse=True)
    prefill_s = np.array([chunked_prefill_s(float(t), mbt, fwd.prefill_wall_s) for t in unique_isl])[inverse]
    speeds = _engine_speeds(trace, spec)
    if speeds is not None:
        prefill_s = prefill_s / speeds[0]
    if spec.aggregated:
        # The iteration that ends the prompt yields the first token: no KV transfer, no decode iteration.
        ttft_ok = prefill_s <= ttft_ms / 1000.0
    else:
        # With the first token from the decode engine, TTFT also holds one decode iteration at batch 1 over the
        # prompt.
        first_decode_s = (
            np.array([fwd.decode_wall_s(1, float(t)) for t in unique_isl])[inverse]
            if spec.first_token_from_decode
            else np.zeros(len(isl))
        )
        if speeds is not None:
            first_decode_s = first_decode_s / speeds[1]
        ttft_ok = prefill_s + spec.kv_transfer_s_per_token * isl + first_decode_s <= ttft_ms / 1000.0
    decode_s = np.zeros(len(isl))
    multi = np.flatnonzero(osl > 1)
    shapes, shape_of = np.unique(np.stack([isl[multi], osl[multi]]), axis=1, return_inverse=True)
    if len(multi):
        alone = np.array([fwd.decode_wall_s(1, float(i) + (float(o) - 1.0) / 2.0) for i, o in shapes.T])
        decode_s[multi] = alone[np.ravel(shape_of)]
    if speeds is not None:
        decode_s = decode_s / speeds[1]
    return ttft_ok & (decode_s <= itl_ms / 1000.0)


def _engine_speeds(trace: RequestTrace, spec: SimSpec) -> tuple[np.ndarray, np.ndarray] | None:
    """Per request, the engines' prefill and decode speed (`SimSpec.engine_speed`, `speed_change`) at its arrival;
    None when the engines run as profiled throughout."""
    change = spec.speed_change
    if spec.engine_speed.is_profile and change is None:
        return None
    arrival_s = np.asarray(trace.arrival_s, dtype=float)
    after = arrival_s >= change.at_s if change is not None else np.zeros(len(arrival_s), dtype=bool)
    later = change.speed if change is not None else spec.engine_speed
    return (
        np.where(after, later.prefill, spec.engine_speed.prefill),
        np.where(after, later.decode, spec.engine_speed.decode),
    )


def smallest_meeting(meets: Callable[[int], bool], *, guess: int, floor: int, cap: int) -> int | None:
    """The smallest n in [floor, cap] with `meets(n)`, assuming `meets` is monotone; None if not even `cap`.

    Starts at `guess`, gallops down (while it meets) or up (while it fails) in steps 1, 2, 4, ... and bisects the
    bracket. The answer n has `meets(n - 1)` evaluated and False unless n == floor. `meets` is called at most once
    per value.
    """
    cache: dict[int, bool] = {}

    def check(n: int) -> bool:
        if n not in cache:
            cache[n] = meets(n)
        return cache[n]

    guess = min(max(guess, floor), cap)
    step = 1
    if check(guess):
        high, low = guess, guess - 1
        while low >= floor and check(low):
            high, step = low, step * 2
            low = high - step
        low = max(low, floor - 1)  # floor - 1 stands for "fails" without a simulation
    else:
        low = guess
        high = min(cap, guess + step)
        while not check(high):
            if high == cap:
                return None
            low, step = high, step * 2
            high = min(cap, low + step)
    while high - low > 1:
        middle = (low + high) // 2
        if check(middle):
            high = middle
        else:
            low = middle
    return high  # low == high - 1 was simulated and failed, or is floor - 1


def _prefill_ttft_s(
    sub: RequestTrace, fwd: ForwardPassModel, spec: SimSpec, num_prefill: int, previous: int, switch_s: float
) -> np.ndarray:
    """Time (s) from arrival to the end of prefill plus KV transfer, per request of `sub`, with no decode pool:
    `previous` prefill workers until `switch_s`, then `num_prefill` (instantly; removed workers drain their
    queues). The decode part of TTFT (when the first token comes from decode) is added by the decode run."""
    alone = dataclasses.replace(sub, osl=np.ones(sub.num_requests))
    prefill_spec = dataclasses.replace(spec, startup_s=0.0, first_token_from_decode=False)
    sim = ClusterSimulator(alone, fwd, prefill_spec, num_prefill=previous, num_decode=0)
    sim.run_until(switch_s)
    sim.set_targets(num_prefill, None)
    sim.run_to_completion()
    return sim.result().ttft_s


def _decode_itl_s(
    sub: RequestTrace,
    first_token_s: np.ndarray,
    fwd: ForwardPassModel,
    spec: SimSpec,
    num_decode: int,
    previous: int,
    switch_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per request of `sub` reaching the decode pool at `first_token_s` (its prefill end): the ITL (s; NaN: none)
    and the decode part of its TTFT (s; 0 unless the first token comes from decode), with `previous` decode
    workers until `switch_s`, then `num_decode`."""
    itl_s = np.full(sub.num_requests, np.nan)
    decode_ttft_s = np.zeros(sub.num_requests)
    reaches_decode = np.asarray(sub.osl) > 1 if not spec.first_token_from_decode else np.ones(sub.num_requests, bool)
    keep = np.flatnonzero(np.isfinite(first_token_s) & reaches_decode)
    if len(keep) == 0:
        return itl_s, decode_ttft_s
    keep = keep[np.argsort(first_token_s[keep], kind="stable")]
    fed = RequestTrace(
        source=sub.source,
        start_epoch_s=sub.start_epoch_s,
        arrival_s=np.asarray(first_token_s[keep], dtype=float),
        isl=np.asarray(sub.isl)[keep],
        osl=np.asarray(sub.osl)[keep],
    )
    decode_spec = dataclasses.replace(spec, startup_s=0.0, kv_transfer_s_per_token=0.0)
    sim = ClusterSimulator(fed, _InstantPrefill(fwd), decode_spec, num_prefill=1, num_decode=previous)
    sim.run_until(switch_s)
    sim.set_targets(None, num_decode)
    sim.run_to_completion()
    result = sim.result()
    itl_s[keep] = result.itl_s
    if spec.first_token_from_decode:
        decode_ttft_s[keep] = result.ttft_s  # from reaching decode (its arrival here) to its first decode token
    return itl_s, decode_ttft_s


class _WindowSearch:
    """One window's simulations, each size simulated at most once (see steps 3 and 4 of the module docstring)."""

    def __init__(
        self,
        sub: RequestTrace,
        scored: slice,
        fwd: ForwardPassModel,
        spec: SimSpec,
        *,
        ttft_s: float,
        itl_s: float,
        previous: tuple[int, int] | None,
        switch_s: float,
    ) -> None:
        self.sub, self.scored, self.fwd, self.spec = sub, scored, fwd, spec
        self.ttft_limit_s, self.itl_limit_s = ttft_s, itl_s
        self.previous, self.switch_s = previous, switch_s
        self.multi_token = np.asarray(sub.osl[scored]) > 1
        self.prefill_runs: dict[int, np.ndarray] = {}
        self.decode_runs: dict[tuple[int, int], int] = {}
        self.agg_runs: dict[int, tuple[int, int]] = {}  # aggregated engines -> (TTFT met, both met)

    @property
    def num_simulations(self) -> int:
        return len(self.prefill_runs) + len(self.decode_runs) + len(self.agg_runs)

    def agg_met(self, num_engines: int) -> tuple[int, int]:
        """Aggregated mode: requests of the window within the TTFT target, and within both targets, with
        `num_engines` aggregated engines (the previous window's count until the window's start)."""
        if num_engines not in self.agg_runs:
            before = num_engines if self.previous is None else self.previous[1]
            spec = dataclasses.replace(self.spec, startup_s=0.0)
            sim = ClusterSimulator(self.sub, self.fwd, spec, num_prefill=0, num_decode=before)
            sim.run_until(self.switch_s)
            sim.set_targets(None, num_engines)
            sim.run_to_completion()
            result = sim.result()
            ttft, itl = result.ttft_s[self.scored], result.itl_s[self.scored]
            ttft_ok = np.isfinite(ttft) & (ttft <= self.ttft_limit_s)
            finished = np.isfinite(result.finish_s[self.scored])
            itl_ok = finished & (~self.multi_token | (np.isfinite(itl) & (itl <= self.itl_limit_s)))
            self.agg_runs[num_engines] = (int(ttft_ok.sum()), int((ttft_ok & itl_ok).sum()))
        return self.agg_runs[num_engines]

    def _ttft_s(self, num_prefill: int) -> np.ndarray:
        if num_prefill not in self.prefill_runs:
            before = num_prefill if self.previous is None else self.previous[0]
            self.prefill_runs[num_prefill] = _prefill_ttft_s(
                self.sub, self.fwd, self.spec, num_prefill, before, self.switch_s
            )
        return self.prefill_runs[num_prefill]

    def ttft_met(self, num_prefill: int) -> np.ndarray:
        """Per request of the window: within the TTFT target with `num_prefill` prefill workers."""
        values = self._ttft_s(num_prefill)[self.scored]
        return np.isfinite(values) & (values <= self.ttft_limit_s)

    def both_met(self, num_prefill: int, num_decode: int) -> int:
        """Requests of the window within both targets with that many prefill and decode workers."""
        key = (num_prefill, num_decode)
        if key not in self.decode_runs:
            first_token_s = self.sub.arrival_s + self._ttft_s(num_prefill)
            before = num_decode if self.previous is None else self.previous[1]
            itl, decode_ttft = _decode_itl_s(
                self.sub, first_token_s, self.fwd, self.spec, num_decode, before, self.switch_s
            )
            itl, decode_ttft = itl[self.scored], decode_ttft[self.scored]
            itl_ok = ~self.multi_token | (np.isfinite(itl) & (itl <= self.itl_limit_s))
            ttft = self._ttft_s(num_prefill)[self.scored] + decode_ttft
            ttft_ok = np.isfinite(ttft) & (ttft <= self.ttft_limit_s)
            self.decode_runs[key] = int((ttft_ok & itl_ok).sum())
        return self.decode_runs[key]


def oracle_windows(
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    settings: OracleSettings = OracleSettings(),  # frozen value
) -> list[OracleWindow]:
    """The oracle's size for every window of the trace, from the window at offset 0 (see the module docstring).

    Raises:
        ValueError: `window_s` or `settings.context_s` out of range, or a target attainment outside (0, 1].
    """
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"oracle window must be a finite number of seconds > 0, got {window_s!r}")
    if not (math.isfinite(settings.context_s) and settings.context_s >= 0):
        raise ValueError(f"oracle context_s must be >= 0, got {settings.context_s!r}")
    if not 0 < settings.target_attainment <= 1:
        raise ValueError(f"oracle target_attainment must be in (0, 1], got {settings.target_attainment!r}")
    attainable = attainable_mask(trace, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms)
    num_windows = int(trace.duration_s // window_s) + 1 if trace.num_requests else 0
    gpus = (spec.prefill_limits.num_gpu, spec.decode_limits.num_gpu)
    windows: list[OracleWindow] = []
    min_prefill = 0 if spec.aggregated else settings.min_prefill  # aggregated mode has no prefill pool
    guess = (min_prefill, settings.min_decode)
    previous: tuple[int, int] | None = None  # the size the oracle holds before the window (none before the first)
    for index in range(num_windows):
        start_s, end_s = index * window_s, (index + 1) * window_s
        own = trace.window(start_s, end_s)
        num_attainable = int(attainable[own].sum())
        required = math.ceil(settings.target_attainment * num_attainable - 1e-9)
        window = OracleWindow(
            index=index,
            start_s=start_s,
            num_requests=own.stop - own.start,
            num_attainable=num_attainable,
            num_required=required,
            num_prefill=min_prefill,
            num_decode=settings.min_decode,
            num_ttft_met=0,
            num_met=0,
            feasible=True,
            num_simulations=0,
        )
        if required > 0:
            span = trace.window(start_s - settings.context_s, end_s + settings.context_s)
            sub = RequestTrace(
                source=trace.source,
                start_epoch_s=trace.start_epoch_s,
                arrival_s=np.asarray(trace.arrival_s[span], dtype=float),
                isl=np.asarray(trace.isl[span]),
                osl=np.asarray(trace.osl[span]),
            )
            scored = slice(own.start - span.start, own.stop - span.start)
            search = _WindowSearch(
                sub,
                scored,
                fwd,
                spec,
                ttft_s=ttft_ms / 1000.0,
                itl_s=itl_ms / 1000.0,
                previous=previous,
                switch_s=start_s,
            )
            if spec.aggregated:
                window = _size_agg_window(window, search, settings, guess[1])
            else:
                window = _size_window(window, search, settings, guess, gpus)
            guess = (window.num_prefill, window.num_decode)
        previous = (window.num_prefill, window.num_decode)
        windows.append(window)
    return windows


def oracle_first_window(
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    settings: OracleSettings = OracleSettings(),  # frozen value
) -> OracleWindow | None:
    """The oracle's answer for the first window only (None for a trace without requests), without searching the
    rest of the trace: what a policy starting "at the oracle's size" needs when the oracle itself is not run.

    Identical to `oracle_windows(trace, ...)[0]`: the first window is searched with no previous window and sees
    only the requests of `[0, window_s + context_s)` (its own and its tail; nothing comes before it), so the
    trace's head up to there gives the same search.
    """
    if trace.num_requests == 0:
        return None
    first = trace.head(window_s + settings.context_s)
    windows = oracle_windows(first, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms, window_s=window_s, settings=settings)
    return windows[0] if windows else None


def _best_effort(met: Callable[[int], int], *, floor: int, cap: int) -> int:
    """For a window no size up to `cap` brings to the target: the fewest workers, among floor, 2 * floor, 4 * floor,
    ..., cap, that reach the most requests met (more workers than that buy nothing)."""
    sizes, n = [], max(floor, 1)
    while n < cap:
        sizes.append(n)
        n *= 2
    sizes.append(cap)
    scores = {size: met(size) for size in sizes}
    best = max(scores.values())
    return min(size for size, score in scores.items() if score == best)


def size_both_pools(
    prefill_met: Callable[[int], int],
    both_met: Callable[[int, int], int],
    *,
    required: int,
    guess: tuple[int, int],
    settings: OracleSettings,
    gpus: tuple[int, int],
    one_prefill: bool = False,
) -> tuple[int, int, bool]:
    """Step 4's search for one window, whatever serves it: the fewest prefill engines whose requests meet TTFT
    (`prefill_met(n)` >= `required`), then for that size and one more the fewest decode engines meeting both targets
    (`both_met(p, n)`), keeping the pair of fewer GPUs. Returns (prefill, decode, feasible); an infeasible window
    gets the best-scoring sizes instead. Both bench engines' oracles size their windows with it. `one_prefill`
    skips the second pair (Dynamo's engine's bracket approximation: fewer replays)."""
    cap = settings.max_replicas
    feasible = True
    num_prefill = smallest_meeting(
        lambda n: prefill_met(n) >= required, guess=guess[0], floor=settings.min_prefill, cap=cap
    )
    if num_prefill is None:
        feasible = False
        num_prefill = _best_effort(prefill_met, floor=settings.min_prefill, cap=cap)
    candidates: list[tuple[int, int]] = []
    both_pairs = feasible and num_prefill < cap and not one_prefill
    for prefill in (num_prefill, num_prefill + 1) if both_pairs else (num_prefill,):
        decode = smallest_meeting(
            lambda n, p=prefill: both_met(p, n) >= required,
            guess=candidates[0][1] if candidates else guess[1],
            floor=settings.min_decode,
            cap=cap,
        )
        if decode is not None:
            candidates.append((prefill, decode))
    if candidates:
        num_prefill, num_decode = min(candidates, key=lambda c: (c[0] * gpus[0] + c[1] * gpus[1], c[0]))
    else:
        feasible = False
        num_decode = _best_effort(lambda n: both_met(num_prefill, n), floor=settings.min_decode, cap=cap)
    return num_prefill, num_decode, feasible


def _size_window(
    window: OracleWindow,
    search: _WindowSearch,
    settings: OracleSettings,
    guess: tuple[int, int],
    gpus: tuple[int, int],
) -> OracleWindow:
    """Step 4 of the module docstring for one window."""
    num_prefill, num_decode, feasible = size_both_pools(
        lambda n: int(search.ttft_met(n).sum()),
        search.both_met,
        required=window.num_required,
        guess=guess,
        settings=settings,
        gpus=gpus,
    )
    return dataclasses.replace(
        window,
        num_prefill=num_prefill,
        num_decode=num_decode,
        num_ttft_met=int(search.ttft_met(num_prefill).sum()),
        num_met=search.both_met(num_prefill, num_decode),
        feasible=feasible,
        num_simulations=search.num_simulations,
        menu=tuple((prefill, decode, met) for (prefill, decode), met in search.decode_runs.items()),
    )


def _size_agg_window(window: OracleWindow, search: _WindowSearch, settings: OracleSettings, guess: int) -> OracleWindow:
    """Aggregated mode for one window (module docstring): the fewest aggregated engines meeting the target."""
    required, cap = window.num_required, settings.max_replicas
    feasible = True
    num_engines = smallest_meeting(
        lambda n: search.agg_met(n)[1] >= required, guess=guess, floor=settings.min_decode, cap=cap
    )
    if num_engines is None:
        feasible = False
        num_engines = _best_effort(lambda n: search.agg_met(n)[1], floor=settings.min_decode, cap=cap)
    num_ttft_met, num_met = search.agg_met(num_engines)
    return dataclasses.replace(
        window,
        num_prefill=0,
        num_decode=num_engines,
        num_ttft_met=num_ttft_met,
        num_met=num_met,
        feasible=feasible,
        num_simulations=search.num_simulations,
        menu=tuple((0, engines, met) for engines, (_, met) in search.agg_runs.items()),
    )
