"""From a command line (and an optional ``--config FILE.yaml``) to a checked config dataclass.

transformers' HfArgumentParser reads the flags; the values are then checked by the config's own rules in
``__post_init__``, so a value given as a flag, in a YAML file or from Python gets the same ConfigError. To that
end numbers that do not parse reach the rules as text ("2.5" for an integer field) instead of stopping argparse
with a message that has no valid range.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from types import MappingProxyType

from rlhfkit.config import config_field_names


class UsageError(ValueError):
    """The command line itself is wrong (unknown flag, missing value, unreadable --config file)."""


def explicit_flags(argv: Sequence[str]) -> set[str]:
    """Names of the flags written on the command line (``--name`` or ``--name=value``)."""
    return {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}


def parse_config(cls: type, argv: Sequence[str], prog: str):
    """Parse a config dataclass from flags and an optional ``--config FILE.yaml`` (flags win over the file).

    Returns the config and the names of the fields set explicitly (flags and file). Raises UsageError for a bad
    command line and ConfigError (from the config's __post_init__) for a bad value.
    """
    argv = list(argv)
    file_values = _read_config_file(argv, cls, prog)  # removes --config FILE from argv
    parser = _parser(cls, prog)
    parser.set_defaults(**file_values)
    argv = _attach_negative_numbers(argv, parser)
    try:
        (config,) = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as e:  # a ConfigError from __post_init__ passes through: it already names field and fix
        if "not used by the HfArgumentParser" not in str(e):
            raise
        known = {option for action in parser._actions for option in action.option_strings}
        unknown = [a for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]
        unknown = unknown or [a for a in argv if a.startswith("-") and a not in known]  # e.g. "-1e-3" in a list
        raise UsageError(f"unknown flags: {', '.join(unknown)}. See '{prog} --help' for valid flags.") from None
    return config, explicit_flags(argv) | set(file_values)


def _read_config_file(argv: list[str], cls: type, prog: str) -> dict:
    if "--config" not in argv:
        return {}
    import yaml

    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise UsageError("--config needs a path to a YAML file.")
    path = argv[i + 1]
    del argv[i : i + 2]
    if not os.path.isfile(path):
        raise UsageError(f"--config {path!r} does not exist.")
    with open(path) as f:
        values = yaml.safe_load(f) or {}
    if not isinstance(values, dict):
        raise UsageError(f"--config {path!r} must hold a mapping of field: value.")
    unknown = sorted(set(values) - set(config_field_names(cls)))
    if unknown:
        raise UsageError(
            f"--config {path!r} has unknown keys: {', '.join(unknown)}. See '{prog} --help' for valid names."
        )
    return values


def _parser(cls: type, prog: str):
    """An HfArgumentParser for `cls` that raises UsageError instead of exiting, and leaves judging values to the
    config's rules (the rule of each field is in its metadata, which argparse must not see)."""
    from transformers import HfArgumentParser

    class Parser(HfArgumentParser):
        def __init__(self, *args, **kwargs):
            self.numeric_options: set[str] = set()  # filled while the fields are added by HfArgumentParser.__init__
            super().__init__(*args, **kwargs)

        @staticmethod
        def _parse_dataclass_field(parser, field):
            # HfArgumentParser passes every metadata key to add_argument; hand it a copy without the rule.
            plain = copy.copy(field)
            plain.metadata = MappingProxyType({key: value for key, value in field.metadata.items() if key != "rule"})
            HfArgumentParser._parse_dataclass_field(parser, plain)
            action = parser._option_string_actions[f"--{field.name}"]
            if action.type in (int, float):
                action.type = _number_or_text(action.type)
                parser.numeric_options.update(action.option_strings)

        def error(self, message: str):
            raise UsageError(f"{message.rstrip('.')}. See '{self.prog} --help'.")

    return Parser(cls, prog=prog)


def _number_or_text(convert: type):
    """argparse `type` that keeps text it cannot convert, for the field's rule to refuse with its valid range."""

    def parse(text: str):
        try:
            return convert(text)
        except ValueError:
            return text

    parse.__name__ = convert.__name__  # argparse names the type in some messages
    return parse


def _attach_negative_numbers(argv: list[str], parser) -> list[str]:
    """``--kl_coef -1e-3`` -> ``--kl_coef=-1e-3`` for numeric flags: argparse takes "-1e-3", "-inf" and "-nan" for
    flags rather than values, and would say "expected one argument" instead of what is wrong with the value."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in parser.numeric_options and arg.startswith("-") and _is_number(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
