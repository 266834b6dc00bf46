"""The field-rule engine of rlhfkit's configs: what values a field accepts, declared next to the field.

A field's metadata (:func:`meta`) holds its ``help`` (the ``--help`` text of the CLI, ending with the valid values
where its type does not say them); its rule rides on the metadata as an attribute, ``rule``, not as a key:
transformers' ``HfArgumentParser`` (and TRL's ``TrlParser``) hand every metadata *key* to argparse's
``add_argument``, which would refuse a ``rule`` keyword. A dataclass wraps the metadata in a read-only
``mappingproxy``; the proxy's ``copy()`` returns a :class:`FieldMeta` copy, rule included, which is how
:func:`field_rule` reads it back. So any HfArgumentParser parses rlhfkit's configs, and the rules still run
(:func:`on_off_flags` also gives every on/off field ``--no_NAME`` there). A config's ``__post_init__`` calls
:func:`check_fields`, so a bad value fails with a :class:`~rlhfkit.errors.ConfigError` naming the field, the
value, the valid range and a fix, whether it came from a flag, a YAML file or Python. :func:`inherited` declares a parent's field again in a subclass
with another default (or help text), keeping the parent's rule.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from rlhfkit.errors import ConfigError


class Rule(ABC):
    """The values a field accepts. `text` completes "must be ..." in errors and "Valid: ..." in --help."""

    example: Any = None  # a valid value for the fix in an error ("Pass e.g. --name EXAMPLE"); else the default
    in_help = True  # False where --help's type and default already say it all (text, paths, on/off flags)

    @property
    @abstractmethod
    def text(self) -> str: ...

    @abstractmethod
    def accepts(self, value: Any) -> bool: ...

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be ..."), or None when it is accepted."""
        return None if self.accepts(value) else f"must be {self.text}"


@dataclass(frozen=True)
class Number(Rule):
    """A finite real number (an int when `integer`) within the bounds given; `also`: values allowed outside them
    (max_steps=-1). NaN and inf never pass: no field means anything by them."""

    integer: bool = False
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    also: tuple[int, ...] = ()
    why: str = ""  # said after the range in errors, where the bound is not obvious
    example: Any = None

    def accepts(self, value: Any) -> bool:
        kind = numbers.Integral if self.integer else numbers.Real
        # True is an int to Python; 2.5 (from YAML, or "2.5" left as text by the flag parser) is no integer.
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
        if value in self.also:
            return True
        return (
            (isinstance(value, numbers.Integral) or math.isfinite(value))
            and (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    @property
    def text(self) -> str:
        # (bracket, comparison, bound) of each end that is bounded
        low = ("(", ">", self.gt) if self.gt is not None else ("[", ">=", self.ge) if self.ge is not None else None
        high = (")", "<", self.lt) if self.lt is not None else ("]", "<=", self.le) if self.le is not None else None
        if low and high:
            text = f"{'an integer' if self.integer else 'a number'} in {low[0]}{low[2]}, {high[2]}{high[0]}"
        else:
            text = "an integer" if self.integer else "a finite number"
            if low or high:
                _, comparison, bound = low or high
                text += f" {comparison} {bound}"
        text += "".join(f", or {value}" for value in self.also)
        return f"{text} ({self.why})" if self.why else text


def integer(**bounds: Any) -> Number:
    return Number(integer=True, **bounds)


def number(**bounds: Any) -> Number:
    return Number(**bounds)


@dataclass(frozen=True)
class OneOf(Rule):
    """One of `values`. `unsupported`: values that mean something elsewhere (transformers' optimizers, schedules,
    strategies) mapped to why rlhfkit refuses them, so the error says "not supported" rather than "misspelt"; a
    function, called only on the error path (it may import transformers)."""

    values: tuple[str, ...]
    example: Any = None
    unsupported: Callable[[], Mapping[str, str]] | None = None

    @property
    def text(self) -> str:
        return f"one of {', '.join(self.values)}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values

    def problem(self, value: Any) -> str | None:
        if self.accepts(value):
            return None
        why = self.unsupported().get(value) if self.unsupported is not None and isinstance(value, str) else None
        return f"not supported by rlhfkit ({why}); must be {self.text}" if why else f"must be {self.text}"


@dataclass(frozen=True)
class Text(Rule):
    """Non-empty text; `path`: a file-system path, which may also be an os.PathLike (pathlib.Path from Python)."""

    path: bool = False
    in_help = False

    @property
    def text(self) -> str:
        return "a path" if self.path else "non-empty text"

    def accepts(self, value: Any) -> bool:
        if self.path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        return isinstance(value, str) and value != ""


@dataclass(frozen=True)
class Kind(Rule):
    """Any value of type `kind` (bool for on/off flags; Mapping for older TRL's project_kwargs)."""

    kind: type
    description: str
    in_help = False

    @property
    def text(self) -> str:
        return self.description

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.kind)


@dataclass(frozen=True)
class ListOf(Rule):
    """A list whose every entry passes `entry`; an error names the first entry that does not."""

    entry: Rule
    example: Any = None

    @property
    def text(self) -> str:
        return f"a list, each entry {self.entry.text}"

    @property
    def in_help(self) -> bool:
        return self.entry.in_help

    def accepts(self, value: Any) -> bool:
        return self.problem(value) is None

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return f"must be {self.text}"
        bad = next((i for i, entry in enumerate(value) if not self.entry.accepts(entry)), None)
        return None if bad is None else f"entry {bad} ({value[bad]!r}) must be {self.entry.text}"


@dataclass(frozen=True)
class OrNone(Rule):
    """`rule`, or None: the field is unset (its help says what unset means)."""

    rule: Rule

    @property
    def text(self) -> str:
        return f"{self.rule.text}, or unset"

    @property
    def in_help(self) -> bool:
        return self.rule.in_help

    @property
    def example(self) -> Any:
        return self.rule.example

    def accepts(self, value: Any) -> bool:
        return value is None or self.rule.accepts(value)

    def problem(self, value: Any) -> str | None:
        return None if value is None else self.rule.problem(value)


@dataclass(frozen=True)
class Checked(Rule):
    """Accepted when `complaint(value)` is None; otherwise the complaint says what is wrong."""

    description: str
    complaint: Callable[[Any], str | None]
    example: Any = None

    @property
    def text(self) -> str:
        return self.description

    def accepts(self, value: Any) -> bool:
        return self.complaint(value) is None

    def problem(self, value: Any) -> str | None:
        return self.complaint(value)


TEXT = Text()
PATH = Text(path=True)
FLAG = Kind(bool, "true or false")


def _json_object_complaint(value: Any) -> str | None:
    """A mapping; JSON text from the command line has been parsed before the rules run (TrainConfig.__post_init__)."""
    if isinstance(value, Mapping):
        return None
    hint = """must be a JSON object, e.g. '{"key": value}'"""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError as e:
            return f"{hint} (it is not JSON: {e})"
    return hint


# A dict field, given as a JSON object on the command line as transformers reads its dict flags.
JSON_OBJECT = Checked("a JSON object", _json_object_complaint)


class FieldMeta(dict):
    """A field's metadata: ``{"help": ...}`` (with, for on/off fields, the ``aliases`` and ``action`` of
    :func:`on_off_flags`: all keys argparse takes) and the field's rule as the attribute ``rule``.

    ``dict(metadata)`` (transformers' HfArgumentParser) keeps the keys alone; ``metadata.copy()`` (TRL's copy of
    it, and :func:`field_rule` through the dataclass's read-only proxy) keeps the rule too."""

    def __init__(self, help: str, rule: Rule, **argparse_keys: Any):
        super().__init__(help=help, **argparse_keys)
        self.rule = rule

    def copy(self) -> FieldMeta:
        return FieldMeta(**self, rule=self.rule)


class OnOff(argparse.Action):
    """argparse action of an on/off field: ``--NAME`` (true), ``--NAME true|false`` (the value; HfArgumentParser
    converts it), ``--no_NAME`` (false)."""

    def __init__(self, option_strings, dest, nargs=None, const=None, **kwargs):
        super().__init__(option_strings, dest, nargs="?", const=True, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        negative = option_string is not None and option_string[2:].replace("-", "_") != self.dest  # --no_NAME
        setattr(namespace, self.dest, False if negative else values)


def on_off_flags(cls: type) -> type:
    """Class decorator, above ``@dataclass``: every on/off field gets ``--no_NAME`` in any HfArgumentParser (which
    adds it itself only for fields that default to true), and ``--NAME`` alone means true also where the default is
    unset (``--bf16``). It puts argparse's ``aliases`` and ``action`` into the field's metadata."""
    for f in fields(cls):
        if f.default is True or "action" in f.metadata or field_rule(f) not in (FLAG, OrNone(FLAG)):
            continue
        aliases = [f"--no_{f.name}", f"--no-{f.name.replace('_', '-')}"]
        f.metadata = MappingProxyType(FieldMeta(**f.metadata, rule=field_rule(f), aliases=aliases, action=OnOff))
    return cls


def meta(text: str, rule: Rule) -> FieldMeta:
    """Field metadata: the --help text, ending with the valid values where the type does not say them, and the rule."""
    return FieldMeta(f"{text} Valid: {rule.text}." if rule.in_help else text, rule)


def field_rule(f: Field) -> Rule:
    """The rule of field `f` (declared with :func:`meta`)."""
    metadata = f.metadata.copy()  # the proxy's copy() is FieldMeta.copy(): the rule comes along
    if not isinstance(metadata, FieldMeta):
        raise TypeError(f"field {f.name!r} has no rule: declare its metadata with rlhfkit.config.rules.meta()")
    return metadata.rule


def inherited(parent: type, name: str, default: Any = MISSING, help: str | None = None) -> Any:
    """Field `name` of the dataclass `parent`, declared again in a subclass: another `default` and/or `help` text,
    the parent's rule (and its help when `help` is None)."""
    own = parent.__dataclass_fields__[name]
    rule = field_rule(own)
    metadata = own.metadata if help is None else meta(help, rule)
    return field(default=own.default if default is MISSING else default, metadata=metadata)


def default_of(f: Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def rule_of(f: Field) -> Rule:
    """The field's rule, without its OrNone wrapper."""
    rule = field_rule(f)
    return rule.rule if isinstance(rule, OrNone) else rule


def check_field(f: Field, value: Any) -> None:
    """Raise a ConfigError if `value` breaks field `f`'s rule: field, value, valid range and a fix."""
    rule = field_rule(f)
    problem = rule.problem(value)
    if problem is None:
        return
    example = rule.example if rule.example is not None else default_of(f)
    fix = ""
    if example is not None:
        shown = " ".join(map(str, example)) if isinstance(example, (list, tuple)) else example
        fix = f" Pass e.g. --{f.name} {shown}{', or leave it out' if isinstance(rule, OrNone) else ''}."
    raise ConfigError(f"{f.name}={value!r}: {problem}.{fix}")


def decode_json_fields(config: Any) -> None:
    """JSON text in a JSON_OBJECT field (as the command line gives it) becomes the dict it encodes, in place; text that
    is not a JSON object stays, for the rule to refuse with its reason."""
    for f in fields(config):
        value = getattr(config, f.name)
        if rule_of(f) is JSON_OBJECT and isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None  # the rule says what is wrong
            if isinstance(parsed, dict):
                setattr(config, f.name, parsed)


def check_fields(config: Any) -> None:
    """Every field of the dataclass `config` against its rule (the first that fails raises)."""
    for f in fields(config):
        check_field(f, getattr(config, f.name))
