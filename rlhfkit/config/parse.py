"""From a command line (and an optional ``--config FILE.yaml``) to a checked config dataclass.

transformers' HfArgumentParser reads the flags; the values are then checked by the config's own rules in
``__post_init__``, so a value given as a flag, in a YAML file or from Python gets the same ConfigError. To that
end numbers that do not parse reach the rules as text ("2.5" for an integer field) instead of stopping argparse
with a message that has no valid range.

TRL's flags that rlhfkit does not take (config/trl_flags.py) are dropped here, with their values, when they give TRL's
default, and otherwise refused before parsing with their reason, so they never read as unknown flags; the few accepted
and ignored ones are dropped at any value, with one note each. ``--num_processes N`` and ``--accelerate_config FILE`` (flags, or keys of the --config file) are the
launcher's, as in the ``trl`` command: :func:`launch_arguments` turns them into ``accelerate launch`` arguments
(rlhfkit.cli relaunches with them) and :func:`parse_config` leaves them out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlhfkit.config import trl_flags
from rlhfkit.config.train import config_field_names
from rlhfkit.errors import UsageError
from rlhfkit.logs import note


def explicit_flags(argv: Sequence[str], names: Sequence[str] = ()) -> set[str]:
    """Names of the flags written on the command line (``--name``, ``--name=value``, ``--na-me``, and ``--no_name``
    for a boolean field in `names`)."""
    written = {_flag_name(a) for a in argv if a.startswith("--")}
    return {n[3:] if n.startswith("no_") and n[3:] in names else n for n in written}


def _flag_name(arg: str) -> str:
    """``--push-to-hub=true`` -> ``push_to_hub`` (HfArgumentParser takes dashes for underscores)."""
    return arg[2:].split("=", 1)[0].replace("-", "_")


def parse_config(cls: type, argv: Sequence[str], prog: str):
    """Parse a config dataclass from flags and an optional ``--config FILE.yaml`` (flags win over the file): for a
    training config, its full arguments (PPOConfig -> PPOArguments), as the command line takes every group of flags.

    Returns the config and the names of the fields set explicitly (flags and file). Raises UsageError for a bad
    command line and ConfigError (from the config's __post_init__) for a bad value.
    """
    cls = getattr(cls, "full_arguments", cls)
    argv = list(argv)
    file_values = _read_config_file(argv, cls, prog)  # removes --config FILE from argv
    _, argv = _launch_flags(argv)  # the launcher's (rlhfkit.cli has used them)
    for key in LAUNCH_FLAGS:
        file_values.pop(key, None)
    argv = _refuse_trl_flags(argv, cls)
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
    return config, explicit_flags(argv, config_field_names(cls)) | set(file_values)


LAUNCH_FLAGS = ("num_processes", "accelerate_config")  # accelerate launch's, as the `trl` command takes them


def _launch_flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The launcher's flags in `argv` (``--num_processes 2``, ``--accelerate_config=FILE``) and `argv` without them."""
    found, rest, argv = {}, [], list(argv)
    i = 0
    while i < len(argv):
        name = _flag_name(argv[i]) if argv[i].startswith("--") else ""
        if name in LAUNCH_FLAGS:
            if "=" in argv[i]:
                found[name] = argv[i].split("=", 1)[1]
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found[name] = argv[i + 1]
                i += 1
            else:
                raise UsageError(f"--{name} needs a value.")
        else:
            rest.append(argv[i])
        i += 1
    return found, rest


def launch_arguments(command: str, argv: Sequence[str]) -> list[str] | None:
    """The ``accelerate launch`` arguments that run ``rlhfkit COMMAND ARGV`` as `trl COMMAND` would: from
    ``--num_processes N`` and ``--accelerate_config FILE`` (flags win over the --config file's keys), then
    ``-m rlhfkit COMMAND`` and `argv` without those flags. None when neither is given."""
    settings, rest = _launch_flags(argv)
    if "--config" in rest and rest.index("--config") + 1 < len(rest):
        path = rest[rest.index("--config") + 1]
        if os.path.isfile(path):
            values = _yaml_mapping_file(path)
            if isinstance(values, dict):
                settings = {key: str(values[key]) for key in LAUNCH_FLAGS if key in values} | settings
    if not settings:
        return None
    launch = []
    if "accelerate_config" in settings:
        path = settings["accelerate_config"]
        if not os.path.isfile(path):
            raise UsageError(
                f"--accelerate_config {path!r} is not a file: pass an accelerate config file, e.g. "
                "examples/accelerate_configs/multi_gpu.yaml."
            )
        launch += ["--config_file", path]
    if "num_processes" in settings:
        count = settings["num_processes"]
        if not count.isdigit() or int(count) < 1:
            raise UsageError(f"--num_processes {count!r}: must be an integer >= 1. Pass e.g. --num_processes 2.")
        launch += ["--num_processes", count]
    return [*launch, "-m", "rlhfkit", command, *rest]


def _refuse_trl_flags(argv: list[str], cls: type) -> list[str]:
    """Raise a UsageError naming each TRL/transformers flag in `argv` that rlhfkit does not take, with the reason;
    return `argv` without those at TRL's default and those rlhfkit accepts and ignores (each with its value)."""
    fields = set(config_field_names(cls))
    written = {_flag_name(arg) for arg in argv if arg.startswith("--")} - {"help"}  # argparse's own
    if all(name in fields or name.removeprefix("no_") in fields for name in written):
        # Only rlhfkit's own flags: TRL's list, which imports transformers' TrainingArguments (+11 MB), is not needed.
        return list(argv)
    command = cls.trl_command
    refused = trl_flags.not_taken(command, fields)
    kept, errors, ignored = [], [], []
    i = 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        name = _flag_name(arg) if arg.startswith("--") else ""
        negated = name not in refused and name.startswith("no_") and name[3:] in refused
        name = name[3:] if negated else name  # HfArgumentParser's --no_NAME of a boolean flag that defaults to true
        group = refused.get(name)
        if group is None:
            kept.append(arg)
            continue
        if negated:
            value = False
        elif "=" in arg:
            value = trl_flags.flag_value(command, name, arg.split("=", 1)[1])
        elif i < len(argv) and _is_value(command, name, argv[i]):
            value, i = trl_flags.flag_value(command, name, argv[i]), i + 1
        else:
            value = trl_flags.flag_value(command, name, None)  # a bare on/off flag: true
        if trl_flags.is_default(command, name, value):
            continue  # TRL's default asks for nothing rlhfkit does differently
        if group.status == trl_flags.IGNORED:
            ignored.append(name)
        else:
            errors.append(trl_flags.message(name, group, command=command))
    for name in dict.fromkeys(ignored) if not errors else ():
        note(trl_flags.ignored_note(f"--{name}", refused[name]))
    if errors:
        raise UsageError("\n".join(dict.fromkeys(errors)))
    return kept


def _is_value(command: str, name: str, arg: str) -> bool:
    """Whether `arg` is the value of TRL's flag `name` (optional for an on/off flag)."""
    if arg.startswith("--"):
        return False
    return not trl_flags.is_boolean(command, name) or arg.lower() in _BOOLEAN_WORDS


_BOOLEAN_WORDS = ("true", "false", "yes", "no", "t", "f", "y", "n", "1", "0")  # what HfArgumentParser reads as bools


def _yaml_mapping_file(path: str):
    """The YAML document in the file at `path` ({} when empty); a UsageError naming the file, the line and column
    where the parser stopped and its reason, for text that is not UTF-8 or not YAML (or a file that cannot be read)."""
    import yaml

    try:
        with open(path, "rb") as f:
            return yaml.safe_load(f.read().decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise UsageError(
            f"--config {path!r} is not UTF-8 text: byte {e.object[e.start : e.start + 1]!r} at line {line} (offset "
            f"{e.start}). Save the file as UTF-8."
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown place"
        problem = " ".join(p for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p) or str(e)
        raise UsageError(
            f"--config {path!r} is not valid YAML: at {where}, {problem}. Write one 'field: value' per line "
            "(lists as [a, b] or '- a' lines)."
        ) from None
    except OSError as e:
        raise UsageError(f"--config {path!r} cannot be read: {e.strerror or e}.") from None


def _read_config_file(argv: list[str], cls: type, prog: str) -> dict:
    if "--config" not in argv:
        return {}

    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise UsageError("--config needs a path to a YAML file.")
    path = argv[i + 1]
    del argv[i : i + 2]
    if not os.path.isfile(path):
        raise UsageError(f"--config {path!r} does not exist.")
    values = _yaml_mapping_file(path)
    if not isinstance(values, dict):
        raise UsageError(f"--config {path!r} must hold a mapping of field: value.")
    unknown = sorted(set(values) - set(config_field_names(cls)) - set(LAUNCH_FLAGS))
    command = cls.trl_command
    refused = trl_flags.not_taken(command, set(config_field_names(cls))) if unknown else {}
    for key in [key for key in unknown if key in refused]:
        value = values.pop(key)
        if isinstance(value, str):  # argparse reads a text default as the flag's text (TRL's parser: YAML as defaults)
            value = trl_flags.flag_value(command, key, value)
        if trl_flags.is_default(command, key, value):
            continue  # TRL's default asks for nothing rlhfkit does differently
        if refused[key].status == trl_flags.IGNORED:
            note(trl_flags.ignored_note(f"{key} (in --config {path})", refused[key]))
        else:
            reason = trl_flags.message(key, refused[key], command=command)
            raise UsageError(f"--config {path!r} has the key {key}: {reason}")
    unknown = [key for key in unknown if key not in refused]
    if unknown:
        raise UsageError(
            f"--config {path!r} has unknown keys: {', '.join(unknown)}. See '{prog} --help' for valid names."
        )
    return values


def _parser(cls: type, prog: str):
    """An HfArgumentParser for `cls` that raises UsageError instead of exiting, and leaves judging values to the
    config's rules. (The fields' metadata already gives any HfArgumentParser ``--no_NAME`` of every on/off field:
    rules.on_off_flags.)"""
    from transformers import HfArgumentParser

    class Parser(HfArgumentParser):
        def __init__(self, *args, **kwargs):
            self.numeric_options: set[str] = set()  # filled while the fields are added by HfArgumentParser.__init__
            super().__init__(*args, **kwargs)

        @staticmethod
        def _parse_dataclass_field(parser, field):
            HfArgumentParser._parse_dataclass_field(parser, field)
            action = parser._option_string_actions[f"--{field.name}"]
            if action.type in (int, float):
                action.type = _number_or_text(action.type)
                parser.numeric_options.update(action.option_strings)

        def error(self, message: str):
            raise UsageError(f"{message.rstrip('.')}. See '{self.prog} --help'.")

    epilog = (
        f"TRL's and transformers' flags that {prog} does not take exit with status 2 and the reason: see "
        f"{trl_flags.DOC}. --num_processes N and --accelerate_config FILE (also as keys of --config) start the run "
        "under accelerate launch, as the trl command does."
    )
    return Parser(cls, prog=prog, epilog=epilog)


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
