"""User plugins as real installed distributions: discovery through `importlib.metadata` entry points.

Each test "installs" a distribution the way pip leaves it on disk (a `*.dist-info` directory with `METADATA` and
`entry_points.txt`, plus the module) into a temporary directory put on `sys.path`, then goes through
`load_entry_point_plugins` -> `resolve_plugins` -> `run_pipeline`. The business-hours example is installed from
its one source, `examples/plugins/business_hours/`, which the docs' plugins page shows verbatim.
"""

from __future__ import annotations

import datetime as dt
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import (
    Component,
    ExecuteAction,
    Loop,
    OverrideType,
    PlannerState,
    ReasonCode,
    ReplicaOverride,
    TickInputs,
    WorkerCounts,
)
from planner_core.pipeline import (
    ENTRY_POINT_GROUP,
    FunctionPlugin,
    Phase,
    PluginConfigError,
    PluginResult,
    PluginSpec,
    load_entry_point_plugins,
    resolve_plugins,
    run_pipeline,
)
from tests.conftest import REPO_ROOT

EXAMPLE_DIR = REPO_ROOT / "examples" / "plugins" / "business_hours"
EXAMPLE_MODULE = EXAMPLE_DIR / "llm_planner_business_hours.py"


def install_distribution(site: Path, name: str, modules: dict[str, str], entry_points: dict[str, str]) -> None:
    """Write a distribution as an installer leaves it: `<name>-0.1.0.dist-info/` with METADATA and entry points."""
    dist_info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n", encoding="utf-8")
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{key} = {value}" for key, value in entry_points.items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for filename, text in modules.items():
        (site / filename).write_text(text, encoding="utf-8")


def install_example(site: Path) -> None:
    """Install `examples/plugins/business_hours` with the entry points its pyproject.toml declares."""
    project = tomllib.loads((EXAMPLE_DIR / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    install_distribution(
        site,
        project["name"],
        {EXAMPLE_MODULE.name: EXAMPLE_MODULE.read_text(encoding="utf-8")},
        project["entry-points"][ENTRY_POINT_GROUP],
    )


def config_with(plugins: dict[str, Any]) -> PlannerConfig:
    return parse_config({"max_gpu_budget": -1, "plugins": plugins}).policy


def epoch(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


# --- the documented example --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoursCase:
    id: str
    at: str  # UTC
    want_decode: int
    want_business_reason: ReasonCode


HOURS_CASES = [
    # open (Monday 10:00, 9-17 UTC): the scaler's SET 2 is raised to the floor, max(4, 2) = 4
    HoursCase("monday-open", "2026-11-02T10:00:00", 4, ReasonCode.PLUGIN_OVERRIDES),
    # 17:00 is closed (end hour exclusive): SET 2 applies
    HoursCase("monday-closing-time", "2026-11-02T17:00:00", 2, ReasonCode.PLUGIN_NO_OPINION),
    HoursCase("monday-night", "2026-11-02T20:00:00", 2, ReasonCode.PLUGIN_NO_OPINION),
    HoursCase("saturday-open-hours", "2026-11-07T10:00:00", 2, ReasonCode.PLUGIN_NO_OPINION),
]


@pytest.mark.parametrize("case", HOURS_CASES, ids=lambda case: case.id)
def test_example_plugin_installed_discovered_and_run(site: Path, case: HoursCase) -> None:
    """The business-hours floor, discovered through its entry point, bounds a scaler's scale-down in office hours."""
    install_example(site)
    config = config_with(
        {
            "enabled": ["business_hours_floor"],
            "settings": {"business_hours_floor": {"decode_floor": 4, "start_hour": 9, "end_hour": 17}},
        }
    )
    loaded, errors = load_entry_point_plugins(config)
    assert errors == ()
    assert [p.spec.plugin_id for p in loaded] == ["business_hours_floor"]
    assert type(loaded[0]).__module__ == "llm_planner_business_hours"

    def scale_down(_: object) -> PluginResult:
        return PluginResult(overrides=(ReplicaOverride(component=Component.DECODE, kind=OverrideType.SET, replicas=2),))

    scaler = FunctionPlugin(PluginSpec(plugin_id="scaler", phase=Phase.PROPOSE, priority=20), scale_down)
    plugins = resolve_plugins([scaler, *loaded], config)
    workers = WorkerCounts(ready_prefill=1, ready_decode=6, expected_prefill=1, expected_decode=6)
    inputs = TickInputs(now_s=epoch(case.at), loop=Loop.LOAD, workers=workers)
    outcome = run_pipeline(plugins, inputs, PlannerState(), config)
    assert outcome.action is ExecuteAction.APPLY
    assert outcome.decision.num_decode == case.want_decode
    assert outcome.run_of("business_hours_floor").reason is case.want_business_reason  # type: ignore[union-attr]
    if case.want_business_reason is ReasonCode.PLUGIN_OVERRIDES:
        [floor] = [s for s in outcome.steps if s.reason is ReasonCode.OVERRIDE_AT_LEAST]
        assert (floor.step, floor.component, floor.value) == ("propose:business_hours_floor", Component.DECODE, 4.0)
        assert floor.detail == "business hours 9:00-17:00 UTC"


def test_docs_show_the_example_verbatim() -> None:
    """The plugins page (docs/plugins.md) is the example package itself, so the documented plugin is the tested one."""
    readme = (REPO_ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    assert "```python\n" + EXAMPLE_MODULE.read_text(encoding="utf-8") + "```" in readme
    assert "```toml\n" + (EXAMPLE_DIR / "pyproject.toml").read_text(encoding="utf-8") + "```" in readme


def test_example_settings_are_validated(site: Path) -> None:
    """A misspelt setting makes the factory fail: reported with the entry point and skipped."""
    install_example(site)
    config = config_with(
        {"enabled": ["business_hours_floor"], "settings": {"business_hours_floor": {"decode_flor": 4}}}
    )
    loaded, errors = load_entry_point_plugins(config)
    assert loaded == ()
    assert [str(e) for e in errors] == [
        "plugin entry point 'business_hours_floor' (llm_planner_business_hours:make_plugin): ValueError: unknown "
        "setting 'decode_flor'; known: decode_floor, end_hour, prefill_floor, start_hour, timezone, weekends"
    ]


# --- loading: what is enabled, what is broken ----------------------------------------------------------------------

BROKEN_MODULE = """
from planner_core.pipeline import FunctionPlugin, Phase, PluginSpec


def _plugin(plugin_id, priority=100):
    return FunctionPlugin(PluginSpec(plugin_id=plugin_id, phase=Phase.CONSTRAIN, priority=priority), lambda ctx: None)


def raises(settings):
    raise RuntimeError("cannot reach the capacity service")


def returns_text(settings):
    return "not a plugin"


def two_plugins(settings):
    return [_plugin("cap_a", settings["priority"]), _plugin("cap_b")]


def duplicate(settings):
    return _plugin("cap_a")
"""


def test_broken_entry_points_are_reported_and_skipped(site: Path) -> None:
    """Import errors, raising factories, non-plugins and taken ids are reported per entry point; the rest load."""
    install_distribution(
        site,
        "broken-plugins",
        {"broken_plugins_mod.py": BROKEN_MODULE},
        {
            "import_fails": "no_such_module_for_planner_tests:make",
            "factory_raises": "broken_plugins_mod:raises",
            "not_a_plugin": "broken_plugins_mod:returns_text",
            "good": "broken_plugins_mod:two_plugins",
            "duplicate": "broken_plugins_mod:duplicate",
        },
    )
    config = config_with(
        {
            "enabled": ["import_fails", "good", "factory_raises", "not_a_plugin", "duplicate"],
            "settings": {"good": {"priority": 7}},
        }
    )
    loaded, errors = load_entry_point_plugins(config)
    assert [(p.spec.plugin_id, p.spec.priority) for p in loaded] == [("cap_a", 7), ("cap_b", 100)]
    assert [(e.entry_point, e.message) for e in errors] == [
        ("import_fails", "ModuleNotFoundError: No module named 'no_such_module_for_planner_tests'"),
        ("factory_raises", "RuntimeError: cannot reach the capacity service"),
        ("not_a_plugin", "str has no usable spec (AttributeError: 'str' object has no attribute 'spec')"),
        ("duplicate", "plugin id 'cap_a' is already taken"),
    ]
    step = errors[0].as_step()
    assert (step.step, step.reason) == ("plugin_load:import_fails", ReasonCode.PLUGIN_LOAD_FAILED)


def test_unknown_enabled_name_is_a_one_line_error(site: Path) -> None:
    install_example(site)
    with pytest.raises(PluginConfigError) as raised:
        load_entry_point_plugins(config_with({"enabled": ["busines_hours_floor"]}), source="planner.yaml")
    assert str(raised.value) == (
        "planner.yaml: field 'plugins.enabled' = 'busines_hours_floor': no installed plugin of that name "
        "(entry points in group 'llm_planner.plugins': business_hours_floor)"
    )


def test_installed_but_not_enabled_plugins_are_not_loaded(site: Path) -> None:
    """Installing a package never changes decisions by itself: nothing is imported unless enabled."""
    install_example(site)
    assert load_entry_point_plugins(config_with({})) == ((), ())
    assert "llm_planner_business_hours" not in sys.modules
