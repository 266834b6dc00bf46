"""Property: every numeric field of PPOConfig and GRPOConfig refuses values outside its declared rule, through the
parse path the CLI uses (flags -> HfArgumentParser -> __post_init__), with a message that names the field and the
value; values inside the rule are accepted. The fields come from dataclasses.fields(), so a new numeric field is
tested (and must declare a rule) without editing this file."""

import math
import types
import typing
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlhfkit.config import GRPOConfig, PPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.config.rules import ListOf, Number, OrNone, field_rule
from rlhfkit.errors import ConfigError, UsageError

PROGS = {PPOConfig: "rlhfkit ppo", GRPOConfig: "rlhfkit grpo"}
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _number_type(hint) -> type | None:
    """int or float for int, float, their Optional forms and lists of them; None for anything else (bool is a flag
    here, though an int to Python)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is list:
        hint = typing.get_args(hint)[0]
    return hint if hint in (int, float) else None


def numeric_fields(cls) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in fields(cls) if _number_type(hints[f.name]) is not None]


# A count of steps or a share of the run's steps (rules other than Number): tests/test_config_steps.py.
STEP_FIELDS = ("logging_steps", "save_steps", "eval_steps")
# TRL fields taken at their default only, whose other values exit 2 with the reason: tests/trainers/test_trainer_contract.py.
DEFAULT_ONLY = ()
CASES = [(cls, name) for cls in PROGS for name in numeric_fields(cls) if name not in STEP_FIELDS + DEFAULT_ONLY]
IDS = [f"{cls.__name__}.{name}" for cls, name in CASES]


def number_rule(cls, name) -> Number:
    rule = field_rule(next(f for f in fields(cls) if f.name == name))
    while isinstance(rule, (OrNone, ListOf)):
        rule = rule.rule if isinstance(rule, OrNone) else rule.entry
    return rule


def parse(cls, name, value, *extra):
    config, _ = parse_config(cls, [f"--{name}", str(value), *extra], PROGS[cls])
    return config


def outside(rule: Number):
    """Values the rule refuses: below or above its bounds, NaN and +-inf, non-integers for integer fields, text."""
    options = [st.sampled_from([math.nan, math.inf, -math.inf, "abc", "1,5"])]
    if rule.integer:
        options.append(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x not in rule.also))
        ints = st.integers
    else:
        ints = st.floats  # st.floats takes the same bounds; NaN and inf are drawn above
    if rule.gt is not None:
        options.append(ints(max_value=rule.gt))
    if rule.ge is not None:
        options.append(ints(max_value=rule.ge - 1) if rule.integer else st.floats(max_value=rule.ge, exclude_max=True))
    if rule.lt is not None:
        options.append(ints(min_value=rule.lt))
    if rule.le is not None:
        options.append(ints(min_value=rule.le + 1) if rule.integer else st.floats(min_value=rule.le, exclude_min=True))
    return st.one_of(options).filter(lambda v: v not in rule.also)


def inside(rule: Number):
    low, high = rule.gt if rule.gt is not None else rule.ge, rule.lt if rule.lt is not None else rule.le
    if rule.integer:
        low = None if low is None else low + 1 if rule.gt is not None else low
        high = None if high is None else high - 1 if rule.lt is not None else high
        return st.integers(min_value=low, max_value=high) | st.sampled_from(
            rule.also or [low if low is not None else 0]
        )
    return st.floats(
        min_value=low,
        max_value=high,
        exclude_min=rule.gt is not None,
        exclude_max=rule.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


# Flags that keep the rules tying fields together satisfied when one field takes the value v (None: none can).
COMPANIONS = {
    (PPOConfig, "num_mini_batches"): lambda v: ["--gradient_accumulation_steps", str(v)],
    (GRPOConfig, "num_generations"): lambda v: ["--per_device_train_batch_size", str(v)],
    (GRPOConfig, "per_device_train_batch_size"): lambda v: ["--num_generations", str(v)] if v >= 2 else None,
    # A generation of v completions holds whole groups of v and whole micro-batches of 1.
    (GRPOConfig, "generation_batch_size"): lambda v: (
        ["--per_device_train_batch_size", "1", "--num_generations", str(v)] if v >= 2 else None
    ),
    (GRPOConfig, "delta"): lambda v: ["--epsilon_high", repr((v - 1) / 2)],  # delta must exceed 1 + epsilon_high
}


# Values that __post_init__ turns into another spelling of the same setting.
NORMALISED = {"max_grad_norm": {0: None}}  # no clipping, as in transformers


def test_every_numeric_field_declares_a_number_rule():
    assert len(CASES) > 50  # the type inspection found the fields
    for cls, name in CASES:
        assert isinstance(number_rule(cls, name), Number), (cls.__name__, name)


@pytest.mark.parametrize("cls, name", CASES, ids=IDS)
def test_values_outside_the_rule_are_refused_naming_field_and_value(cls, name):
    @FAST
    @given(value=outside(number_rule(cls, name)))
    def check(value):
        with pytest.raises((ConfigError, UsageError)) as info:
            parse(cls, name, value)
        message = str(info.value)
        assert f"{name}=" in message and str(value) in message, message
        assert "must be" in message

    check()


@pytest.mark.parametrize("cls, name", CASES, ids=IDS)
def test_values_inside_the_rule_are_accepted(cls, name):
    @FAST
    @given(value=inside(number_rule(cls, name)))
    def check(value):
        companion = COMPANIONS.get((cls, name), lambda v: [])(value)
        assume(companion is not None)
        config = parse(cls, name, value, *companion)
        expected = NORMALISED.get(name, {}).get(value, value)
        parsed = getattr(config, name)
        assert parsed == ([expected] if isinstance(parsed, list) else expected)

    check()
