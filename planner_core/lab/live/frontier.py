"""The fixed-size frontier of a live campaign: which fixed size to run next so that the record says which is the
cheapest fixed size meeting the SLA and whether the SLA binds it (`scoring.binding_check`).

`planner live --fixed-search N` runs its `--fixed-size` list, then up to N more fixed sizes, each chosen from the
runs so far by `next_fixed_size`:

- while no fixed size has met the target, the best one (most requests within the SLA, then more engines) grows by
  one engine in the pool whose target it missed more (TTFT: prefill, ITL: decode; the one pool when aggregated);
- once one has, each pool's size one engine smaller than the cheapest meeting size is run, so the check can say
  whether it misses (binds) or also meets (then it is the new cheapest, and its own smaller sizes come next);
- it stops when the check is decided, at the GPU budget, or when the next size was already run.

The sizes are whole live runs (minutes each), so the search is a staircase of single steps, not a bisection: each
step's answer is a size a user would compare the planner with.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.lab.live.scoring import binding_check, size_name

__all__ = ["NextSize", "next_fixed_size"]


@dataclass(frozen=True, slots=True)
class NextSize:
    """The next fixed size to run (None: stop) and why, in one line for the campaign's log."""

    size: tuple[int, int] | None  # (prefill, decode); prefill 0 when aggregated
    why: str


def _fixed_runs(runs: list[dict]) -> dict[tuple[int, int], dict]:
    return {
        (int(run.get("fixed_prefill", 0)), int(run["fixed_size"])): run
        for run in runs
        if not run.get("adaptive", True) and "fixed_size" in run and run.get("attainment") is not None
    }


def _grown(size: tuple[int, int], run: dict, disaggregated: bool) -> tuple[tuple[int, int], str]:
    """`size` with one engine more in the pool whose target its run missed more."""
    if not disaggregated:
        return (0, size[1] + 1), "aggregated: one engine more"
    ttft, itl = run.get("ttft_attainment"), run.get("itl_attainment")
    if ttft is not None and itl is not None and itl < ttft:
        return (size[0], size[1] + 1), f"ITL missed more ({100 * itl:.2f} % within, TTFT {100 * ttft:.2f} %)"
    return (size[0] + 1, size[1]), (
        "TTFT missed more" if ttft is None or itl is None else f"TTFT missed more ({100 * ttft:.2f} % within)"
    )


def next_fixed_size(runs: list[dict], *, disaggregated: bool, max_engines: int) -> NextSize:
    """The next fixed size to run, from the figures of the runs so far (module docstring)."""
    fixed = _fixed_runs(runs)
    if not fixed:
        return NextSize(None, "no fixed-size run with figures to search from")
    check = binding_check(runs)
    if "cheapest_meeting" not in check:  # nothing met the target yet: grow the best size tried
        best = max(fixed, key=lambda size: (fixed[size]["attainment"], size[0] + size[1]))
        size, why = _grown(best, fixed[best], disaggregated)
        if sum(size) > max_engines:
            return NextSize(None, f"no fixed size met the target within the budget of {max_engines} engines")
        if size in fixed:
            return NextSize(None, f"{size_name(*size, disaggregated)} already ran")
        return NextSize(size, f"none met the target yet; {size_name(*best, disaggregated)} grown: {why}")
    for pool, verdict in check["pools"].items():
        if verdict["binding"] is None:  # that pool's smaller size has not run
            size = verdict["smaller_size"]
            return NextSize(size, f"{pool}: does one engine fewer than {check['cheapest_meeting']} miss?")
    return NextSize(None, f"decided: cheapest meeting {check['cheapest_meeting']}, binding valid = {check['valid']}")
