"""`planner doctor`: check what the running planner depends on, one line each (planner_core/runtime/doctor.py)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from planner_core.runtime.settings import RuntimeSettings

CHECKS = ("config", "perf-model", "database", "prefect", "prometheus", "kubernetes")


def _check_names(text: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    return names


def cmd_doctor(args: argparse.Namespace) -> int:
    from planner_core.data import DEFAULT_CONFIG
    from planner_core.runtime.doctor import CheckName, DoctorOptions, failed, run_checks

    settings = RuntimeSettings()
    options = DoctorOptions(
        config_path=args.config or settings.config or DEFAULT_CONFIG,
        prefect_api_url=args.prefect_api_url or os.environ.get("PREFECT_API_URL") or None,
        work_pool=args.work_pool,
        max_series_age_s=args.max_series_age_s,
        timeout_s=args.timeout_s,
        skip=frozenset(CheckName(name) for name in args.skip),
    )
    results = run_checks(options, settings)
    if args.json:
        print(json.dumps({"ok": not failed(results), "checks": [r.as_json() for r in results]}, indent=2))
    else:
        for result in results:
            print(result.line())
    return 1 if failed(results) else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the doctor command's parser."""
    doctor = sub.add_parser(
        "doctor",
        help="check the config, perf model, database, Prefect, Prometheus and the cluster rights; exit 1 on a failure",
    )
    doctor.add_argument(
        "--config", type=Path, default=None,
        help="PlannerConfig (default: PLANNER_CONFIG, else the recommended policy planner.yaml)",
    )  # fmt: skip
    doctor.add_argument(
        "--prefect-api-url", default=None, metavar="URL",
        help="the Prefect API to check (default: PREFECT_API_URL; unset: not checked)",
    )  # fmt: skip
    doctor.add_argument(
        "--work-pool", default=None, metavar="NAME",
        help="a Prefect work pool that must exist with a worker polling it (e.g. planner-fleet-kubernetes)",
    )  # fmt: skip
    doctor.add_argument(
        "--max-series-age-s", type=float, default=300.0,
        help="a Prometheus series last sampled longer ago than this is stale",
    )  # fmt: skip
    doctor.add_argument("--timeout-s", type=float, default=5.0, help="each request to Prefect and Prometheus")
    doctor.add_argument(
        "--skip", type=_check_names, default="", metavar="CHECKS",
        help=f"comma-separated checks not to run ({', '.join(CHECKS)}; default: none)",
    )  # fmt: skip
    doctor.add_argument("--json", action="store_true", help="print the results as JSON (for scripts)")
    doctor.set_defaults(func=cmd_doctor)
