"""How every `planner` parser behaves: defaults shown in help, one-line usage errors, the package version.

`PlannerArgumentParser` is the class of the top-level parser, and argparse makes every subparser (and their
subparsers) of the same class, so each command gets the same help formatter and the same error line without its
module doing anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import NoReturn

DISTRIBUTION = "llm-planner"  # pyproject.toml's [project] name


class PlannerHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, minus the noise: no "(default: None)" or "(default: False)" on options
    that are unset or flags, and nothing added to help that already says what its default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == argparse.SUPPRESS or default == []  # 0 is a default
        if "default" in text.lower() or unset:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text  # a required positional has no default to show
        return f"{text} (default: %(default)s)"


class PlannerArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser with `PlannerHelpFormatter` and usage errors in one line (exit 2), like the
    `planner: error: ...` lines of failing commands."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", PlannerHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage first; the hint to --help keeps the error to the one line scripts grep.
        self.exit(2, f"planner: error: {message} (see `{self.prog} --help`)\n")


class VersionAction(argparse.Action):
    """`--version`: print `planner <version>` and exit 0; the version is read only when asked for."""

    # `help` shadows the builtin: it is argparse's name for the keyword
    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def package_version() -> str:
    """The installed distribution's version (`planner --version`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each direct subcommand of `parser` as (name, parser), in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def walk_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every parser below it, depth first (help checks, shell completion)."""
    yield parser
    for _name, child in subparsers(parser):
        yield from walk_parsers(child)
