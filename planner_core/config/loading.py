"""Reading a configuration: YAML/JSON parsing with duplicate keys refused and size bounded, the split of the flat
mapping into `PlannerFile`, pydantic's errors turned into one-line `ConfigError`s, and the paths a config names.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from planner_core.config.errors import _RULE_ERROR, ConfigError, _show
from planner_core.config.policy import _ALIAS_TO_FIELD, PlannerConfig
from planner_core.config.service import PlannerFile, ServiceConfig

_SERVICE_FIELDS = frozenset(ServiceConfig.model_fields)
_KNOWN_TOP_LEVEL = sorted(set(PlannerConfig.model_fields) | _SERVICE_FIELDS | set(_ALIAS_TO_FIELD))
_TYPE_REQUIREMENTS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "missing": "is required",
}


def _dotted(loc: tuple[int | str, ...]) -> str:
    """`('scheduling', 'external_plugins', 0)` -> `scheduling.external_plugins[0]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(error: Mapping[str, Any]) -> tuple[str | None, str, str, str]:
    """Turn one pydantic error into (dotted field name, field as shown, value as shown, requirement)."""
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == _RULE_ERROR:
        return ctx["field"], f"'{ctx['field']}'", ctx["shown"], ctx["requirement"]

    loc = tuple(error["loc"])
    if loc and loc[0] in PlannerFile.model_fields:  # the file is flat: `policy.ttft_ms` is written `ttft_ms`
        loc = loc[1:]
    name = _dotted(loc) or None
    label = f"'{name}'" if name else "(top level)"
    if len(loc) == 1 and loc[0] in _ALIAS_TO_FIELD:
        name = _ALIAS_TO_FIELD[str(loc[0])]
        label = f"'{name}' (written '{loc[0]}')"
    shown = _show(error.get("input"))

    if kind == "greater_than":
        requirement = f"must be > {ctx['gt']:g}"
    elif kind == "greater_than_equal":
        requirement = f"must be >= {ctx['ge']:g}"
    elif kind == "less_than":
        requirement = f"must be < {ctx['lt']:g}"
    elif kind == "less_than_equal":
        requirement = f"must be <= {ctx['le']:g}"
    elif kind in ("enum", "literal_error"):
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        requirement = "allowed values are " + ", ".join(allowed)
    elif kind == "extra_forbidden":
        requirement = "unknown field"
        if len(loc) == 1:
            close = difflib.get_close_matches(str(loc[0]), _KNOWN_TOP_LEVEL, n=1)
            if close:
                requirement += f"; did you mean '{close[0]}'?"
    elif kind in _TYPE_REQUIREMENTS:
        requirement = _TYPE_REQUIREMENTS[kind]
    else:
        message = " ".join(str(error.get("msg", "invalid value")).split())
        requirement = message[:1].lower() + message[1:]
    return name, label, shown, requirement


def _from_validation_error(exc: ValidationError, source: str) -> ConfigError:
    """One-line `ConfigError` for the first pydantic error, counting the others."""
    errors = exc.errors()
    first = errors[0]
    more = len(errors) - 1 + int((first.get("ctx") or {}).get("more", 0))
    name, label, shown, requirement = _describe(first)
    message = f"{source}: field {label} = {shown}: {requirement}"
    if more:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(message, source=source, field=name)


def parse_config(data: Mapping[str, Any], source: str = "<config>") -> PlannerFile:
    """Validate an in-memory configuration mapping and split it into the policy and the service settings.

    Args:
        data: the configuration object (field names or Dynamo aliases as keys).
        source: label used at the start of error messages (normally the file name).

    Returns:
        The validated, frozen file: `.policy` (hashed, what `tick` reads) and `.service` (not hashed).

    Raises:
        ConfigError: `data` is not a mapping, has an unknown field, a bad value, or breaks a cross-field
            rule. The message is one line naming `source`, the field, the value and what is allowed.
    """
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{source}: top level is {kind}; expected a mapping of field names to values", source=source)
    bad_keys = [key for key in data if not isinstance(key, str)]
    if bad_keys:
        raise ConfigError(
            f"{source}: field name {_show(bad_keys[0])} is not a string; field names must be strings",
            source=source,
        )
    try:
        return PlannerFile.model_validate(
            {
                "policy": {key: value for key, value in data.items() if key not in _SERVICE_FIELDS},
                "service": {key: value for key, value in data.items() if key in _SERVICE_FIELDS},
            }
        )
    except ValidationError as exc:
        raise _from_validation_error(exc, source) from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML safe loader that refuses a mapping with the same key twice (a silent override otherwise)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let the base constructor report it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _reject_duplicate_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


# A configuration file is a few kilobytes; these bound what a hostile one can make the loader build. YAML aliases
# are shared, not copied, when loaded, but validation and hashing walk them as copies: `_check_shape` counts them so.
MAX_CONFIG_BYTES = 1_000_000
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_NODES = 100_000


def _check_shape(data: Any, source: str) -> None:
    """Refuse a parsed config nested deeper than `MAX_CONFIG_DEPTH` or holding more than `MAX_CONFIG_NODES` values
    (aliases counted each time they are used); stops counting at the first excess, so it is cheap either way."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    num_nodes = 0
    while stack:
        value, depth = stack.pop()
        num_nodes += 1
        if num_nodes > MAX_CONFIG_NODES:
            raise ConfigError(
                f"{source}: more than {MAX_CONFIG_NODES} values; a planner config is far smaller", source=source
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{source}: nested deeper than {MAX_CONFIG_DEPTH} levels", source=source)
        if isinstance(value, Mapping):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in value)


def _parse_text(text: str, suffix: str, source: str) -> Any:
    """Parse YAML or JSON text; syntax errors and excessive size or nesting become a one-line `ConfigError`."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{source}: {len(text)} characters; a config may hold at most {MAX_CONFIG_BYTES}", source=source
        )
    try:
        data = _parse_syntax(text, suffix, source)
    except RecursionError as exc:  # nesting deep enough to exhaust the parser's stack
        raise ConfigError(f"{source}: nested deeper than {MAX_CONFIG_DEPTH} levels", source=source) from exc
    _check_shape(data, source)
    return data


def _parse_syntax(text: str, suffix: str, source: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_reject_duplicate_json_keys)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", source=source
            ) from exc
        except ValueError as exc:  # duplicate key
            raise ConfigError(f"{source}: not valid JSON ({exc})", source=source) from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        detail = " ".join(f"{where}{problem}".split())
        raise ConfigError(f"{source}: not valid YAML ({detail})", source=source) from exc


_SUFFIXES = (".yaml", ".yml", ".json")


def resolve_config_relative(path_value: str | Path, config_path: Path | None) -> Path:
    """A path from the config as written; relative paths are taken from the config file's folder."""
    path = Path(path_value)
    if not path.is_absolute() and config_path is not None:
        path = config_path.parent / path
    return path


def resolve_profile_dir(config: PlannerConfig, config_path: Path | None) -> Path:
    """`profile_results_dir`, relative to the config file's folder."""
    return resolve_config_relative(config.profile_results_dir, config_path)


def load_config(path: str | Path) -> PlannerFile:
    """Read and validate a planner configuration file.

    The format is chosen by the suffix: `.yaml`/`.yml` (YAML, safe loader) or `.json`. Keys are Dynamo
    `PlannerConfig` field names or their aliases. Duplicate keys are refused.

    Args:
        path: the file to read.

    Returns:
        The validated, frozen file: `.policy` (hashed, what `tick` reads) and `.service` (not hashed).

    Raises:
        ConfigError: the suffix is not supported, the file cannot be read or parsed, the top level is not
            a mapping, or validation fails. The message is one line starting with the path.
    """
    path = Path(path)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        shown_suffix = repr(suffix) if suffix else "(no suffix)"
        raise ConfigError(
            f"{source}: unsupported file type {shown_suffix}; use .yaml, .yml or .json",
            source=source,
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{source}: file not found", source=source) from exc
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{source}: cannot read file ({' '.join(reason.split())})", source=source) from exc
    return parse_config(_parse_text(text, suffix, source), source)
