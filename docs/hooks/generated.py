"""MkDocs hook: the pages that are generated at build time, from the code and from recorded runs.

Two markers in the Markdown sources are replaced while the site builds (nothing is written to `docs/`):

- `<!-- config-reference -->` (configuration.md): one table per pydantic model of `REFERENCE_MODELS` and of the
  models nested in their fields: name, aliases (or environment variables), type, default, range, description. A field
  without a description gets an empty cell.
- `<!-- bench-records -->` (benchmarks.md): one table per `docs/results/*.json` record that `planner bench --record`
  wrote, newest first, each under its date, command and commit.
- `<!-- router-records -->` (routing.md): the records of `docs/results/routers/`, named `<scenario>--<router>.json`
  (`planner bench --router NAME --record ...`): per scenario one table of every policy's SLA attainment and
  GPU-hours under each router, then each record's date, command, commit and, for router `slo`, what it could not
  place and its predictor's error.
- `<!-- startup-records -->` (benchmarks.md): the records of `docs/results/startup/` (the matrix at other start-up
  times): first one line per record with the start-up goal, the knob's crossing of 99 % and the foresight
  reference (`planner_core.lab.sim.frontier.describe_startup_goal`), then each record's table as above.
- `<!-- profile-roundtrip -->` (perf-models.md): the record `planner profile --round-trip` wrote to
  `docs/results/profile/roundtrip.json`: per role the median and worst error of the measured profile against its
  source and against the mocker's own timing, the points, and `planner capacity` on both profiles.
- `<!-- bench-engines -->` (benchmarks.md): the records of `docs/results/dynamo-engine/` (the same benches served by
  Dynamo's replay, `--engine dynamo`) beside the default engine's record of the same name, one table per name with
  both runs' dates and commits, then each Dynamo-engine record in full.
- `<!-- live-records -->` (operations.md): the records `planner live --record` wrote to `docs/results/live/`,
  newest first: each run's command and commit, then the runs side by side in `planner live`'s own table.
- `<!-- chaos-records -->` (operations.md): the JSON reports of `planner chaos --report` kept in
  `docs/results/chaos/`, newest first: one column per run with its date, command, commit, kills by fault, rounds,
  what was duplicated, lost, extra or changed, the audit chain and the ingest leg's check.

- `<!-- cli-ranges -->` (operations.md): the range of every numeric command-line option
  (`planner_cli.ranges.OPTION_RANGES`), with the commands that take it.

The renderers are plain functions of their inputs (`config_reference`, `render_bench_records`,
`render_router_records`), so tests can call them without MkDocs.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# The one list of models the configuration reference documents ("module:Class"); nested models are found by walking.
REFERENCE_MODELS: tuple[str, ...] = (
    "planner_core.config:PlannerConfig",
    "planner_core.config:ServiceConfig",
    "planner_core.runtime.settings:RuntimeSettings",
)

BENCH_RECORD_FORMAT = "planner-bench-record/v1"
CONFIG_MARKER = "<!-- config-reference -->"
CLI_RANGES_MARKER = "<!-- cli-ranges -->"
BENCH_MARKER = "<!-- bench-records -->"
ROUTER_MARKER = "<!-- router-records -->"
STARTUP_MARKER = "<!-- startup-records -->"
ENGINES_MARKER = "<!-- bench-engines -->"
PROFILE_MARKER = "<!-- profile-roundtrip -->"
CHAOS_MARKER = "<!-- chaos-records -->"
LIVE_MARKER = "<!-- live-records -->"
# Records of `planner bench --engine dynamo` (Dynamo 1.6.1's replay), named as their default-engine counterparts.
DYNAMO_ENGINE_DIR = "dynamo-engine"


# --- MkDocs entry point --------------------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001 (MkDocs' signature)
    """Replace the markers of generated content in a page's Markdown."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference(load_models(REFERENCE_MODELS)))
    if CLI_RANGES_MARKER in markdown:
        markdown = markdown.replace(CLI_RANGES_MARKER, cli_ranges())
    if BENCH_MARKER in markdown:
        markdown = markdown.replace(BENCH_MARKER, render_bench_records(Path(config["docs_dir"]) / "results"))
    if ROUTER_MARKER in markdown:
        routers_dir = Path(config["docs_dir"]) / "results" / "routers"
        markdown = markdown.replace(ROUTER_MARKER, render_router_records(routers_dir))
    if STARTUP_MARKER in markdown:  # the start-up matrix (`--startup-s`): its own folder, the same tables
        startup_dir = Path(config["docs_dir"]) / "results" / "startup"
        markdown = markdown.replace(STARTUP_MARKER, render_startup_records(startup_dir))
    if ENGINES_MARKER in markdown:
        results = Path(config["docs_dir"]) / "results"
        markdown = markdown.replace(ENGINES_MARKER, render_engine_comparison(results, results / DYNAMO_ENGINE_DIR))
    if PROFILE_MARKER in markdown:
        record = Path(config["docs_dir"]) / "results" / "profile" / "roundtrip.json"
        markdown = markdown.replace(PROFILE_MARKER, render_profile_roundtrip(record))
    if CHAOS_MARKER in markdown:
        markdown = markdown.replace(CHAOS_MARKER, render_chaos_records(Path(config["docs_dir"]) / "results" / "chaos"))
    if LIVE_MARKER in markdown:
        markdown = markdown.replace(LIVE_MARKER, render_live_records(Path(config["docs_dir"]) / "results" / "live"))
    return markdown


# --- configuration reference ---------------------------------------------------------------------------------------


def load_models(names: Iterable[str]) -> list[type[BaseModel]]:
    models = []
    for name in names:
        module, _, attr = name.partition(":")
        models.append(getattr(importlib.import_module(module), attr))
    return models


def walk_models(roots: Iterable[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    """The roots and every model nested in their fields' types, each once, depth first."""
    seen: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
        if model in seen:
            return
        seen.add(model)
        yield model
        for info in model.model_fields.values():
            for nested in _models_in(info.annotation):
                yield from visit(nested)

    for root in roots:
        yield from visit(root)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def config_reference(roots: Iterable[type[BaseModel]]) -> str:
    """Markdown: a section per model with a table of its fields."""
    sections = []
    for model in walk_models(roots):
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        env_prefix = model.model_config.get("env_prefix")  # pydantic-settings models: fields come from the environment
        names_header = "Environment variables" if env_prefix is not None else "Aliases"
        lines = [
            f"### `{model.__name__}`",
            "",
            f"`{model.__module__}.{model.__name__}`: {doc}",
            "",
            f"| Field | {names_header} | Type | Default | Range | Description |",
            "|---|---|---|---|---|---|",
        ]
        for name, info in model.model_fields.items():
            names = _env_names(name, info, env_prefix) if env_prefix is not None else _aliases(name, info)
            cells = [
                f"`{name}`",
                ", ".join(f"`{n}`" for n in names),
                _type_name(info.annotation),
                _default(info),
                field_range(info),
                info.description or "",
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def field_range(info: FieldInfo) -> str:
    """A numeric field's bounds as `[lo, hi]` (`(` or `)` where open), from its `ge`/`gt`/`le`/`lt`; empty if none."""
    bounds = {type(item).__name__: item for item in info.metadata}
    if not bounds.keys() & {"Ge", "Gt", "Le", "Lt"}:
        return ""
    lo = f"[{bounds['Ge'].ge:g}" if "Ge" in bounds else f"({bounds['Gt'].gt:g}" if "Gt" in bounds else "(-inf"
    hi = f"{bounds['Le'].le:g}]" if "Le" in bounds else f"{bounds['Lt'].lt:g})" if "Lt" in bounds else "inf)"
    return f"`{lo}, {hi}`"


def cli_ranges() -> str:
    """Markdown: one row per numeric command-line option, its range and the commands that take it."""
    from planner_cli.main import build_parser
    from planner_cli.parser import walk_parsers
    from planner_cli.ranges import Bounded

    commands: dict[str, tuple[str, list[str]]] = {}
    for parser in walk_parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action.type, Bounded):
                name = action.option_strings[-1] if action.option_strings else action.dest
                bounds, progs = commands.setdefault(name, (str(action.type.bounds), []))
                progs.append(f"`{parser.prog}`")
    lines = ["| Option | Range | Commands |", "|---|---|---|"]
    lines += [f"| `{name}` | `{bounds}` | {', '.join(progs)} |" for name, (bounds, progs) in sorted(commands.items())]
    return "\n".join(lines) + "\n"


def _alias_choices(info: FieldInfo) -> list[str]:
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias]
    return [info.alias] if info.alias else []


def _aliases(name: str, info: FieldInfo) -> list[str]:
    return [a for a in _alias_choices(info) if a != name]


def _env_names(name: str, info: FieldInfo, prefix: str) -> list[str]:
    # With a validation alias pydantic-settings reads exactly the alias names; the lower-case field name among them
    # is only there for keyword construction.
    choices = [a for a in _alias_choices(info) if a != name]
    return choices or [f"{prefix}{name}".upper()]


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = [("..." if a is Ellipsis else _type_name(a)) for a in typing.get_args(annotation)]
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(args)}]"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = " | ".join(str(member.value) for member in annotation)
        return f"{annotation.__name__} ({values})"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return "(defaults below)"
    return f"`{value!s}`" if not isinstance(value, str) else f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- benchmark records ---------------------------------------------------------------------------------------------


def _load_records(results_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, record) of every `*.json` record directly in `results_dir` (sorted by name)."""
    records = []
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != BENCH_RECORD_FORMAT:
            raise ValueError(f"{path}: format {record.get('format')!r}, expected {BENCH_RECORD_FORMAT!r}")
        records.append((path.name, record))
    return records


def render_bench_records(results_dir: Path) -> str:
    """Markdown: every record in `results_dir`, newest first, or a plain sentence when there is none."""
    records = _load_records(results_dir)
    if not records:
        return (
            "No benchmark run has been recorded yet: `docs/results/` holds no record. "
            "Run `planner bench ... --record docs/results/<name>.json` and rebuild the site.\n"
        )
    records.sort(key=lambda item: str(item[1].get("date", "")), reverse=True)
    return "\n\n".join(render_bench_record(name, record) for name, record in records) + "\n"


def render_startup_records(results_dir: Path) -> str:
    """Markdown: the start-up goal of every record in `results_dir`, by name, then `render_bench_records`."""
    from planner_core.lab.sim.frontier import GOAL_TEXT, describe_startup_goal, frontier_points

    records = sorted(_load_records(results_dir), key=lambda item: item[0])
    lines = []
    for name, record in records:
        summary = describe_startup_goal(frontier_points(record.get("rows") or []))
        lines.append(f"- **{name.removesuffix('.json')}** ({record.get('date') or 'undated'}, commit "
                     f"`{record.get('commit') or 'not recorded'}`): " + "; ".join(summary))  # fmt: skip
    goals = f"The start-up goal: {GOAL_TEXT}.\n\n" + "\n".join(lines) + "\n\n" if lines else ""
    return goals + render_bench_records(results_dir)


def render_engine_comparison(default_dir: Path, dynamo_dir: Path) -> str:
    """Markdown: per record name in `dynamo_dir`, its rows beside the rows of the same name in `default_dir` (SLA
    attainment, GPU-hours and × oracle on each engine), then the Dynamo-engine records in full."""
    theirs = {name.removesuffix(".json"): record for name, record in _load_records(dynamo_dir)}
    if not theirs:
        return "No run on Dynamo's engine has been recorded yet (`docs/results/dynamo-engine/` holds no record).\n"
    ours = {name.removesuffix(".json"): record for name, record in _load_records(default_dir)}
    sections = []
    for name in sorted(theirs):
        other = theirs[name]
        mine = ours.get(name)
        lines = [f"### {name}: both engines", ""]
        for label, record in (("our simulator", mine), ("Dynamo's replay", other)):
            if record is None:
                lines.append(f"- {label}: no record of this name")
            else:
                commit = f"`{record['commit']}`" if record.get("commit") else "not recorded"
                date = record.get("date") or "unknown"
                lines.append(f"- {label}: {date}, commit {commit}, `{record.get('command')}`")
        header = ["policy", "SLA (sim)", "GPU-h (sim)", "× oracle (sim)", "SLA (Dynamo)", "GPU-h (Dynamo)",
                  "× oracle (Dynamo)"]  # fmt: skip
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows_mine = {r.get("policy"): r for r in (mine or {}).get("rows") or []}
        rows_other = {r.get("policy"): r for r in other.get("rows") or []}
        oracle_mine, oracle_other = rows_mine.get("oracle"), rows_other.get("oracle")
        for policy in [*rows_mine, *(p for p in rows_other if p not in rows_mine)]:
            cells = [f"`{policy}`"]
            for row, oracle in ((rows_mine.get(policy), oracle_mine), (rows_other.get(policy), oracle_other)):
                if row is None:
                    cells += ["", "", ""]
                else:
                    cells += [_pct(row.get("sla_attainment")), _num(row.get("gpu_hours"), 2),
                              _vs_oracle(row, oracle) if oracle is not None else ""]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        attainable = [
            _pct(next(iter({r.get("attainable") for r in rows.values()}), None)) for rows in (rows_mine, rows_other)
        ]
        lines += ["", f"Attainable: {attainable[0] or '-'} (sim), {attainable[1] or '-'} (Dynamo)."]
        sections.append("\n".join(lines))
    details = [render_bench_record(f"{name} (Dynamo's replay)", theirs[name]) for name in sorted(theirs)]
    return "\n\n".join(sections + details) + "\n"


def _engine_speed_text(speed: dict[str, Any]) -> str:
    """A record's `engine_speed` (`planner bench --engine-speed`, `--engine-speed-change`) in words."""
    text = f"prefill {speed.get('prefill', 1):g}× / decode {speed.get('decode', 1):g}× the profile's speed"
    change = speed.get("change")
    if change:
        later = change.get("speed") or {}
        text += (
            f", from {change.get('at_s', 0):g} s of the run prefill {later.get('prefill', 1):g}× / "
            f"decode {later.get('decode', 1):g}×"
        )
    return text + " (the planners read the profile)"


def render_bench_record(name: str, record: dict[str, Any]) -> str:
    rows = record.get("rows") or []
    oracle = next((r for r in rows if r.get("policy") == "oracle"), None)
    attainable = {r.get("attainable") for r in rows if r.get("attainable") is not None}
    lines = [
        f"### {name.removesuffix('.json')}",
        "",
        f"- date: {record.get('date') or 'unknown'}",
        f"- command: `{record.get('command') or 'unknown'}`",
        f"- commit: `{record['commit']}`" if record.get("commit") else "- commit: not recorded",
    ]
    speed = record.get("engine_speed")  # absent (older records too): the engines ran as profiled
    if speed:
        lines.append(f"- engines: {_engine_speed_text(speed)}")
    if len(attainable) == 1:
        ceiling = _pct(attainable.pop())
        lines.append(f"- attainable (requests that meet both targets alone on an idle cluster): {ceiling}")
    header = ["policy", "SLA attainment (both)", "TTFT met", "ITL met", "GPU-hours"]
    if oracle is not None:
        header.append("× oracle")
    header += ["scaling events", "TTFT p90 ms", "ITL p90 ms"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            f"`{row.get('policy')}`",
            _pct(row.get("sla_attainment")),
            _pct(row.get("ttft_attainment")),
            _pct(row.get("itl_attainment")),
            _num(row.get("gpu_hours"), 2),
        ]
        if oracle is not None:
            cells.append(_vs_oracle(row, oracle))
        cells += [
            str(row.get("scaling_events", "")),
            _num(row.get("ttft_ms_p90"), 0),
            _num(row.get("itl_ms_p90"), 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _vs_oracle(row: dict[str, Any], oracle: dict[str, Any]) -> str:
    ratio = row.get("gpu_hours_vs_oracle")
    if ratio is None and _finite(row.get("gpu_hours")) and _finite(oracle.get("gpu_hours")) and oracle["gpu_hours"]:
        ratio = row["gpu_hours"] / oracle["gpu_hours"]
    return f"{ratio:.2f}x" if _finite(ratio) else ""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if _finite(value) else ""


def _num(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if _finite(value) else ""


# --- router records ------------------------------------------------------------------------------------------------


def render_router_records(routers_dir: Path) -> str:
    """Markdown: per scenario (the record name before `--`), a table of each policy's SLA attainment and GPU-hours
    under each router (columns in the order least_loaded, round_robin, slo, then any other), then each record's
    provenance and, where the router reported them, unplaced requests and prediction errors."""
    records = _load_records(routers_dir)
    if not records:
        return (
            "No router comparison has been recorded yet: `docs/results/routers/` holds no record. Run "
            "`planner bench ... --router NAME --record docs/results/routers/<scenario>--<router>.json`.\n"
        )
    scenarios: dict[str, dict[str, dict[str, Any]]] = {}
    for name, record in records:
        scenario, _, router = name.removesuffix(".json").partition("--")
        scenarios.setdefault(scenario, {})[router or "?"] = record
    known = ["least_loaded", "round_robin", "slo"]
    sections = []
    for scenario, by_router in scenarios.items():
        routers = [r for r in known if r in by_router] + sorted(r for r in by_router if r not in known)
        policies: list[str] = []
        for router in routers:
            policies += [
                p for p in (row.get("policy") for row in by_router[router].get("rows") or []) if p not in policies
            ]
        header = ["policy", *(f"{router}: SLA / GPU-h" for router in routers)]
        lines = [
            f"### {scenario}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for policy in policies:
            cells = [f"`{policy}`"]
            for router in routers:
                row = next(
                    (r for r in by_router[router].get("rows") or [] if r.get("policy") == policy),
                    None,
                )
                cells.append(
                    "" if row is None else f"{_pct(row.get('sla_attainment'))} / {_num(row.get('gpu_hours'), 2)}"
                )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for router in routers:
            record = by_router[router]
            lines.append(
                f"- `{router}`: {record.get('date') or 'unknown date'}, commit `{record.get('commit') or 'unknown'}`, "
                f"`{record.get('command') or 'unknown'}`"
            )
        for router in routers:
            slo_rows = [r for r in by_router[router].get("rows") or [] if r.get("unplaced") is not None]
            if not slo_rows:
                continue
            lines += [
                "",
                f"Router `{router}`: requests with no available endpoint (once per stage), rejected, prefilled on a "
                "decode engine, placed past their wait limit; predictor error abs(predicted - measured) / measured, "
                "median / p90:",
                "",
                "| policy | unplaced | rejected | prefilled on decode | overdue | TTFT error | TPOT error |",
                "|---|---|---|---|---|---|---|",
            ]
            for row in slo_rows:
                cells = [
                    f"`{row.get('policy')}`",
                    str(row.get("unplaced")),
                    str(row.get("rejected")),
                    str(row.get("local_prefills")),
                    str(row.get("overdue")),
                    f"{_pct(row.get('ttft_pred_err_p50'))} / {_pct(row.get('ttft_pred_err_p90'))}",
                    f"{_pct(row.get('tpot_pred_err_p50'))} / {_pct(row.get('tpot_pred_err_p90'))}",
                ]
                lines.append("| " + " | ".join(cells) + " |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


# --- profile round trip (`planner profile --round-trip`) -------------------------------------------------------------


def render_profile_roundtrip(path: Path) -> str:
    """The round-trip record as Markdown: error table per reference and role, capacity, then every point."""
    if not path.is_file():
        return f"*No round-trip record at `{path.name}` yet: run `make profile-roundtrip`.*"
    record = json.loads(path.read_text())
    names = {"source": "the source profile (H200, slowed)", "mocker_model": "the mocker's own timing table"}
    lines = [
        f"Recorded {record['date']} at commit `{record['commit']}` by `{record['command']}` "
        f"({record['engine']}; slowdown x{record['slowdown']:g}; measured in {record['measure_s']:g} s).",
        "",
        "| measured vs | role | points | median \\|error\\| | worst error |",
        "|---|---|---:|---:|---:|",
    ]
    for against, by_role in record["roles"].items():
        for role, figures in by_role.items():
            lines.append(
                f"| {names.get(against, against)} | {role} | {figures['num_points']} | "
                f"{_pct(figures['median_abs_error'])} | {100 * figures['worst_error']:+.1f} % |"
            )
    check = record["capacity_check"]
    lines += [
        "",
        f"`planner capacity` at ISL {check['isl']}, OSL {check['osl']}, TTFT {check['ttft_ms']:g} ms, "
        f"ITL {check['itl_ms']:g} ms (the measured profile descaled by the slowdown):",
        "",
        "| profile | prefill tokens/s/GPU | decode tokens/s/GPU | decode ITL (ms) | requests/s/GPU |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, figures in record["capacity"].items():
        lines.append(
            f"| {name} | {_num(figures['prefill_tokens_per_s_per_gpu'], 0)} | "
            f"{_num(figures['decode_tokens_per_s_per_gpu'], 0)} | {_num(figures['decode_itl_ms'], 2)} | "
            f"{_num(figures['requests_per_s_per_gpu'], 2)} |"
        )
    error = record.get("capacity_relative_error")
    lines += [
        "",
        f"Measured vs source: {'n/a' if error is None else f'{100 * error:+.1f} %'} "
        f"({'within' if record['capacity_within_tolerance'] else 'not within'} 10 %); measured vs the mocker's own "
        f"timing at the same points: {_pct_signed(record.get('capacity_relative_error_vs_mocker_model'))}.",
        "",
        "| role | batch | ISL / context | measured (ms, slowed engine) | source (ms) | error | mocker timing (ms) "
        "| error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for src, mock in zip(record["points"]["source"], record["points"]["mocker_model"], strict=True):
        batch = "1" if src["role"] == "prefill" else f"{src['x']:g}"
        lines.append(
            f"| {src['role']} | {batch} | {src['y']:g} | {src['measured_ms']:.2f} | {src['reference_ms']:.2f} | "
            f"{100 * src['relative_error']:+.1f} % | {mock['reference_ms']:.2f} | "
            f"{100 * mock['relative_error']:+.1f} % |"
        )
    return "\n".join(lines)


def _pct_signed(value: Any) -> str:
    return "n/a" if not _finite(value) else f"{100 * value:+.1f} %"


# --- fault suite reports ------------------------------------------------------------------------------------------

# (label, how to read it from a report); a report from an older version lacks some keys: its cell says "-"
_CHAOS_ROWS: tuple[tuple[str, Any], ...] = (
    ("date (UTC)", lambda r: str(r["started_at"]).replace("+00:00", "")),
    ("wall time", lambda r: f"{r['duration_s'] / 60:.0f} min"),
    ("commit", lambda r: f"`{str(r['commit'])[:10]}`"),
    ("kills in all", lambda r: r["num_kills"]),
    ("demo-random / demo-after-tick / postgres / prefect", lambda r: " / ".join(
        str(r["kills_by_fault"].get(k, 0)) for k in ("demo-random", "demo-after-tick", "postgres", "prefect"))),
    ("ingest / postgres-under-ingest", lambda r: " / ".join(
        str(r["kills_by_fault"][k]) for k in ("ingest", "postgres-under-ingest"))),
    ("demo attempts; hung demos killed", lambda r: f"{r['num_demo_attempts']}; {r['hung_demos_killed']}"),
    ("rounds (baseline: ticks, decisions)", lambda r: f"{r['num_rounds']} ({r['baseline_ticks']}, "
                                                      f"{r['baseline_decisions']})"),
    ("rounds identical to the baseline", lambda r: f"{r['rounds_identical']} of {r['num_rounds']}"),
    ("duplicated ticks / decisions", lambda r: f"{r['duplicate_ticks']} / {r['duplicate_decisions']}"),
    ("lost ticks / decisions", lambda r: f"{r['lost_ticks']} / {r['lost_decisions']}"),
    ("extra ticks / decisions", lambda r: f"{r['extra_ticks']} / {r['extra_decisions']}"),
    ("changed ticks / decisions", lambda r: f"{r['changed_ticks']} / {r['changed_decisions']}"),
    ("audit chain", lambda r: ("intact" if r["audit_chain"]["ok"] else f"broken: {r['audit_chain']['broken']}")
                              + f", {r['audit_chain']['num_rows']} rows"),
    ("FPM messages sent / stored", lambda r: f"{r['ingest']['num_sent']} / {r['ingest']['num_stored']}"),
    ("samples duplicated / changed / extra", lambda r: " / ".join(
        str(r["ingest"][k]) for k in ("duplicated", "changed", "extra"))),
    ("messages lost: while no ingest listened / otherwise", lambda r: f"{r['ingest']['lost_explained']} / "
                                                                      f"{r['ingest']['lost_unexplained']}"),
)  # fmt: skip


def _chaos_cell(read: Any, report: dict[str, Any]) -> str:
    try:
        value = read(report)
    except (KeyError, TypeError):  # an older report's missing key, or no ingest leg (None)
        return "-"
    return str(value)


def render_chaos_records(chaos_dir: Path) -> str:
    """Markdown: one table, a column per `planner chaos` report in `chaos_dir` (newest first)."""
    reports = []
    for path in sorted(chaos_dir.glob("*.json")) if chaos_dir.is_dir() else []:
        report = json.loads(path.read_text(encoding="utf-8"))
        if "kills_by_fault" not in report or "started_at" not in report:
            raise ValueError(f"{path}: not a `planner chaos --report` file (no kills_by_fault or started_at)")
        reports.append((path.stem, report))
    if not reports:
        return "No fault-suite run has been recorded yet: `docs/results/chaos/` holds no report.\n"
    reports.sort(key=lambda item: str(item[1]["started_at"]), reverse=True)
    lines = ["| | " + " | ".join(f"`{name}`" for name, _ in reports) + " |", "|---" * (len(reports) + 1) + "|"]
    for label, read in _CHAOS_ROWS:
        lines.append(f"| {label} | " + " | ".join(_chaos_cell(read, report) for _, report in reports) + " |")
    lines.append("")
    lines += [f"- `{name}`: `{report['command']}`" for name, report in reports]
    return "\n".join(lines) + "\n"


# --- live runs ------------------------------------------------------------------------------------------------------


def render_live_records(live_dir: Path) -> str:
    """Markdown: per `planner live --record` file in `live_dir` (newest first) its date, each run's command and
    commit, and the runs' table as `planner live` prints it."""
    from planner_core.lab.live import live_table

    records = []
    for path in sorted(live_dir.glob("*.json")) if live_dir.is_dir() else []:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != "planner-live-record/v1":
            raise ValueError(f"{path}: not a `planner live --record` file (format {record.get('format')!r})")
        records.append((path.stem, record))
    if not records:
        return "No live run has been recorded yet: `docs/results/live/` holds no record.\n"
    records.sort(key=lambda item: str(item[1]["date"]), reverse=True)
    parts = []
    for name, record in records:
        runs = record["runs"]
        lines = [f"**`{name}`** (recorded {record['date']}):", ""]
        for run in runs:
            lines.append(f"- `{run['run']}`: `{run.get('command') or '-'}` at commit `{run.get('commit') or '-'}`")
        lines += ["", live_table(runs, ttft_ms=record["ttft_ms"], itl_ms=record["itl_ms"]), ""]
        parts.append("\n".join(lines))
    return "\n".join(parts)
