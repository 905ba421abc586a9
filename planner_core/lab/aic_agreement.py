"""How well aiconfigurator's estimates agree with measurements: the figures behind the perf-table link.

Run: `python -m planner_core.lab.aic_agreement [--table FILE] [--profile DIR] [--silicon CSV] [--sample-agg N]
[--sample-disagg N] [--seed S] [--aic-python PATH] [--skip-silicon] [--json]`.

(a) table vs profile: the committed perf table (aiconfigurator, no GPU) against Dynamo's H200 profile of the
    same model (measured on GPUs with a load generator). Prefill: table `prefill_wall_s(ISL)` against the
    profile's TTFT at each profiled ISL. Decode: at each profiled (KV usage, context) point, converted to a
    forward pass as Dynamo 1.6 bootstraps its regressions from a profile (`kv = round(usage x max_kv)`,
    `batch = round(kv / context)`), table `decode_wall_s(batch, kv)` against the profile's ITL. The profile's
    TTFT is what a client sees (frontend, tokenisation, queueing included); the table is one engine iteration,
    so the prefill figures are also given for the least-squares line profile = a + b x table (a: a fixed
    per-request cost outside the iteration, b: a scale factor).
(b) aiconfigurator vs silicon: `cli_estimate` TTFT and TPOT against AIConfigurator's own measured end-to-end
    rows (`silicon_sample.csv`) for a seeded sample of the rows whose configuration is complete (agg: batch and
    parallelism; disagg: both pools' batch, workers and parallelism), plus every row of the H200 profile's model.
    Rows are estimated with aiconfigurator's current database for that system and backend (it does not serve
    the engine versions the rows were measured with); checkpoints it does not ship a config for are asked
    through an architecturally identical one (`MODEL_ALIASES`), with the row's quantisation.

(c) table vs silicon: the table's decode step at (concurrency, ISL + OSL/2) against the measured aggregated TPOT
    of the rows with the table's model, system, backend and TP (a lower bound: TPOT includes prefill chunks).

Relative error = estimate / measured - 1; the figures are the median and the worst |error| (signed).
Not part of the planner's decisions: a report tool (it reads files and runs aiconfigurator).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner_core.data import AIC_SILICON_SAMPLE, H200_PERF_TABLE, H200_PROFILE_DIR
from planner_core.perf.profile import load_profile
from planner_core.perf.table import TablePerfModel, load_perf_table

DEFAULT_TABLE = H200_PERF_TABLE
DEFAULT_PROFILE = H200_PROFILE_DIR
DEFAULT_SILICON = AIC_SILICON_SAMPLE
PROFILE_MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"

# Checkpoints aiconfigurator 0.12 has no offline config for -> the shipped config of the same architecture.
# The row's gemm/moe quant modes carry the quantisation (FP8, NVFP4) the alias does not.
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
}

_PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
_AGG_FIELDS = ("batch_size", *_PARALLEL)
_DISAGG_REQUIRED = ("batch_size", "num_workers")
_DISAGG_FIELDS = tuple(f"{pool}_{name}" for pool in ("prefill", "decode") for name in (*_PARALLEL, *_DISAGG_REQUIRED))


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorSummary:
    """Relative errors (estimate / reference - 1) of one comparison."""

    label: str
    num_points: int
    median_abs: float
    worst: float  # the signed error of largest magnitude
    median_signed: float

    @classmethod
    def of(cls, label: str, errors: Sequence[float]) -> ErrorSummary:
        if not errors:
            return cls(label=label, num_points=0, median_abs=math.nan, worst=math.nan, median_signed=math.nan)
        return cls(
            label=label,
            num_points=len(errors),
            median_abs=statistics.median(abs(error) for error in errors),
            worst=max(errors, key=abs),
            median_signed=statistics.median(errors),
        )

    def line(self) -> str:
        if self.num_points == 0:
            return f"  {self.label}: no points"
        return (
            f"  {self.label}: n={self.num_points}, median |err| {100 * self.median_abs:.1f} %, "
            f"worst {100 * self.worst:+.1f} %, median signed {100 * self.median_signed:+.1f} %"
        )


def _relative(estimate: float, reference: float) -> float:
    return estimate / reference - 1.0


# ---------------------------------------------------------------------------------------------------------
# (a) table vs profile
# ---------------------------------------------------------------------------------------------------------


def table_vs_profile(table_path: Path, profile_dir: Path) -> dict[str, Any]:
    """Agreement of a perf table with a Dynamo profile (prefill TTFT over ISL, decode ITL at profiled points)."""
    model = TablePerfModel(load_perf_table(table_path))
    profile = load_profile(profile_dir)
    prefill_rows = []
    for isl, ttft_ms in zip(profile.prefill.isl, profile.prefill.ttft_ms, strict=True):
        table_ms = model.prefill_wall_s(float(isl)) * 1000.0
        prefill_rows.append({"isl": float(isl), "profile_ms": float(ttft_ms), "table_ms": table_ms})
    # Least-squares line profile = intercept + slope x table: how much of the gap is a fixed per-request cost
    # outside the engine iteration, how much a scale factor.
    slope, intercept_ms = statistics.linear_regression(
        [row["table_ms"] for row in prefill_rows], [row["profile_ms"] for row in prefill_rows]
    )
    decode_rows = []
    decode = profile.decode
    for usage, context, itl_ms in zip(decode.kv_usage, decode.context_length, decode.itl_ms, strict=True):
        kv_tokens = round(float(usage) * decode.max_kv_tokens)
        batch = max(1, round(kv_tokens / float(context)))
        table_ms = model.decode_wall_s(batch, kv_tokens) * 1000.0
        decode_rows.append(
            {"batch": batch, "context": float(context), "profile_ms": float(itl_ms), "table_ms": table_ms}
        )
    summaries = [
        ErrorSummary.of("prefill TTFT", [_relative(r["table_ms"], r["profile_ms"]) for r in prefill_rows]),
        ErrorSummary.of(
            f"prefill TTFT as {intercept_ms:.1f} ms + {slope:.3f} x table (least squares)",
            [_relative(intercept_ms + slope * r["table_ms"], r["profile_ms"]) for r in prefill_rows],
        ),
        ErrorSummary.of("decode ITL", [_relative(r["table_ms"], r["profile_ms"]) for r in decode_rows]),
    ]
    return {
        "table": str(table_path),
        "profile": str(profile_dir),
        "prefill_fit": {"intercept_ms": intercept_ms, "slope": slope},
        "summaries": summaries,
        "prefill": prefill_rows,
        "decode": decode_rows,
    }


def table_vs_silicon(table_path: Path, silicon_path: Path) -> dict[str, Any]:
    """(c) The table's decode step against measured aggregated TPOT of the same model, system, backend and TP.

    Each row ran `batch_size` concurrent requests; the table is asked for one decode step of that many
    sequences at the mean context ISL + OSL/2. Measured TPOT also carries the prefill chunks mixed into decode
    steps, so the decode step alone should come out somewhat lower.
    """
    table = load_perf_table(table_path)
    model = TablePerfModel(table)
    header = table.header
    with silicon_path.open(newline="", encoding="utf-8") as handle:
        rows = [
            row
            for row in csv.DictReader(handle)
            if (row["model_path"], row["system"], row["backend"], row["mode"])
            == (header.model, header.system, header.backend, "agg")
            and _whole(row["tp_size"]) == header.tp
            and _whole(row["batch_size"]) is not None
        ]
    points = []
    for row in rows:
        batch = float(row["batch_size"])
        context = int(row["isl"]) + int(row["osl"]) / 2.0
        table_ms = model.decode_wall_s(batch, batch * context) * 1000.0
        points.append({"id": row["id"], "measured_tpot_ms": float(row["silicon_tpot_ms"]), "table_ms": table_ms})
    label = f"{header.model} {header.system} {header.backend} TP{header.tp} agg TPOT vs table decode step"
    return {
        "summaries": [ErrorSummary.of(label, [_relative(p["table_ms"], p["measured_tpot_ms"]) for p in points])],
        "points": points,
    }


# ---------------------------------------------------------------------------------------------------------
# (b) aiconfigurator vs silicon rows
# ---------------------------------------------------------------------------------------------------------


def _whole(text: str | None) -> int | None:
    """A positive whole number from a CSV cell ('4.0'), or None for empty/0 (not set in that row)."""
    if not text:
        return None
    value = float(text)
    return int(value) if value > 0 else None


def estimate_call(row: dict[str, str]) -> dict[str, Any] | None:
    """`cli_estimate` keywords for a silicon row, or None when the row lacks its batch/worker configuration."""
    mode = row["mode"]
    call: dict[str, Any] = {
        "model_path": MODEL_ALIASES.get(row["model_path"], row["model_path"]),
        "system_name": row["system"],
        "backend_name": row["backend"],
        "mode": mode,
        "isl": int(row["isl"]),
        "osl": int(row["osl"]),
    }
    for quant in ("gemm_quant_mode", "moe_quant_mode"):
        if row.get(quant):
            call[quant] = row[quant]
    fields = _AGG_FIELDS if mode == "agg" else _DISAGG_FIELDS
    for name in fields:
        value = _whole(row.get(name))
        if value is not None:
            call[name] = value
    required = (
        ("batch_size",) if mode == "agg" else tuple(f"{p}_{n}" for p in ("prefill", "decode") for n in _DISAGG_REQUIRED)
    )
    if mode not in ("agg", "disagg") or any(name not in call for name in required):
        return None
    return call


def pick_rows(
    rows: Sequence[dict[str, str]], *, num_agg: int, num_disagg: int, seed: int
) -> list[tuple[str, dict[str, str]]]:
    """A seeded sample of estimable rows per mode, then every row of the H200 profile's model: `(group, row)`."""
    rng = random.Random(seed)
    picked: list[tuple[str, dict[str, str]]] = []
    for mode, count in (("agg", num_agg), ("disagg", num_disagg)):
        candidates = [row for row in rows if row["mode"] == mode and estimate_call(row) is not None]
        picked += [(f"sample {mode}", row) for row in rng.sample(candidates, min(count, len(candidates)))]
    picked += [(PROFILE_MODEL, row) for row in rows if row["model_path"] == PROFILE_MODEL]
    return picked


def silicon_agreement(
    silicon_path: Path, *, num_agg: int, num_disagg: int, seed: int, aic_python: str | None
) -> dict[str, Any]:
    """Run aiconfigurator on the picked rows and summarise TTFT/TPOT errors per group."""
    from planner_core.lab.aic import resolve_aic_python, run_estimates

    with silicon_path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    picked = pick_rows(rows, num_agg=num_agg, num_disagg=num_disagg, seed=seed)
    calls = [estimate_call(row) or {} for _, row in picked]
    done = Counter[str]()

    def progress(_estimate: Any) -> None:
        done["n"] += 1
        if done["n"] % 25 == 0 or done["n"] == len(calls):
            print(f"  aiconfigurator: {done['n']}/{len(calls)} rows", file=sys.stderr, flush=True)

    version, estimates = run_estimates(calls, aic_python=resolve_aic_python(aic_python), on_estimate=progress)
    groups: dict[str, dict[str, list[float]]] = {}
    failures: dict[str, Counter[str]] = {}
    for (group, row), estimate in zip(picked, estimates, strict=True):
        errors = groups.setdefault(group, {"ttft": [], "tpot": []})
        if estimate.error is not None or not estimate.ttft_ms or not estimate.tpot_ms:
            reason = (estimate.error or "no TTFT/TPOT").split(":")[0]
            failures.setdefault(group, Counter())[reason] += 1
            continue
        errors["ttft"].append(_relative(estimate.ttft_ms, float(row["silicon_ttft_ms"])))
        errors["tpot"].append(_relative(estimate.tpot_ms, float(row["silicon_tpot_ms"])))
    summaries = []
    for group, errors in groups.items():
        summaries.append(ErrorSummary.of(f"{group} TTFT", errors["ttft"]))
        summaries.append(ErrorSummary.of(f"{group} TPOT", errors["tpot"]))
    return {
        "silicon": str(silicon_path),
        "aiconfigurator_version": version,
        "num_rows": len(picked),
        "seed": seed,
        "summaries": summaries,
        "failures": {group: dict(counter) for group, counter in failures.items()},
    }


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m planner_core.lab.aic_agreement", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--table", type=Path, default=DEFAULT_TABLE, help="perf table (default: the committed H200 one)"
    )
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="Dynamo profile folder to compare with")
    parser.add_argument("--silicon", type=Path, default=DEFAULT_SILICON, help="AIConfigurator silicon_sample.csv")
    parser.add_argument("--sample-agg", type=int, default=150, help="aggregated rows to sample (default 150)")
    parser.add_argument("--sample-disagg", type=int, default=60, help="disaggregated rows to sample (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--aic-python", default=None, help="interpreter with aiconfigurator (default: this one)")
    parser.add_argument("--skip-silicon", action="store_true", help="only (a): no aiconfigurator needed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def _json_default(value: Any) -> Any:
    if isinstance(value, ErrorSummary):
        return {name: getattr(value, name) for name in ErrorSummary.__slots__}
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report: dict[str, Any] = {"table_vs_profile": table_vs_profile(args.table, args.profile)}
        report["table_vs_silicon"] = table_vs_silicon(args.table, args.silicon)
        if not args.skip_silicon:
            report["aic_vs_silicon"] = silicon_agreement(
                args.silicon,
                num_agg=args.sample_agg,
                num_disagg=args.sample_disagg,
                seed=args.seed,
                aic_python=args.aic_python,
            )
    except (ValueError, OSError) as exc:
        print(f"aic_agreement: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
        return 0
    part_a = report["table_vs_profile"]
    print(f"(a) perf table {part_a['table']}\n    vs Dynamo profile {part_a['profile']}")
    for summary in part_a["summaries"]:
        print(summary.line())
    print(f"(c) perf table vs measured TPOT in {args.silicon}")
    for summary in report["table_vs_silicon"]["summaries"]:
        print(summary.line())
    if "aic_vs_silicon" in report:
        part_b = report["aic_vs_silicon"]
        print(
            f"(b) aiconfigurator {part_b['aiconfigurator_version']} vs {part_b['silicon']} "
            f"({part_b['num_rows']} rows, seed {part_b['seed']})"
        )
        for summary in part_b["summaries"]:
            print(summary.line())
        for group, reasons in part_b["failures"].items():
            listed = ", ".join(f"{reason} x{count}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]))
            print(f"  {group}: not estimated: {listed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
