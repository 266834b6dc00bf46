"""TRL 1.16 GRPOConfig fields rlhfkit takes and honours: off_policy_mask_threshold,
multi_objective_aggregation, cast_lm_head_to_fp32, pad_to_multiple_of and generation_kwargs, with TRL's names,
defaults and values, from Python, the command line and YAML."""

import unittest

import pytest

from rlhfkit.config import GRPOConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import ConfigError


def test_trls_defaults_are_taken_and_mean_off():
    trl = pytest.importorskip("trl")
    defaults = {
        "off_policy_mask_threshold": None,
        "multi_objective_aggregation": "sum_then_normalize",
        "cast_lm_head_to_fp32": False,
        "pad_to_multiple_of": "auto",
        "generation_kwargs": None,
    }
    theirs = trl.GRPOConfig.__dataclass_fields__
    for name, value in defaults.items():
        assert theirs[name].default == value == GRPOConfig.__dataclass_fields__[name].default, name
    args = GRPOConfig(**defaults)  # spelt out, as a YAML of TRL's defaults does
    assert args.off_policy_mask_threshold is None and args.multi_objective_aggregation == "sum_then_normalize"
    assert args.cast_lm_head_to_fp32 is False and args.generation_kwargs is None
    # TRL resolves "auto" as its config is built: 128 on AWS Neuron, else None; rlhfkit runs on CPUs and GPUs
    trls = trl.GRPOConfig(output_dir="x", report_to="none", bf16=False)
    assert args.pad_to_multiple_of is None and trls.pad_to_multiple_of is None


@pytest.mark.parametrize(
    ("given", "taken"), [("auto", None), (None, None), ("none", None), ("null", None), ("64", 64), (8, 8), (1, 1)]
)
def test_pad_to_multiple_of_takes_trls_values(given, taken):
    assert GRPOConfig(pad_to_multiple_of=given).pad_to_multiple_of == taken


@pytest.mark.parametrize("bad", [0, -8, "eight", 2.5, True])
def test_pad_to_multiple_of_refuses_other_values(bad):
    with pytest.raises(ConfigError, match=rf"pad_to_multiple_of={bad!r}: must be an integer >= 1, auto, or unset"):
        GRPOConfig(pad_to_multiple_of=bad)


def test_multi_objective_aggregation_names_the_field_the_value_and_the_valid_ones():
    assert GRPOConfig(multi_objective_aggregation="normalize_then_sum").multi_objective_aggregation == (
        "normalize_then_sum"
    )
    with pytest.raises(ConfigError) as info:
        GRPOConfig(multi_objective_aggregation="normalise_then_sum")
    assert str(info.value).startswith(
        "multi_objective_aggregation='normalise_then_sum': must be one of sum_then_normalize, normalize_then_sum."
    )


def test_scale_rewards_has_no_effect_with_normalize_then_sum_and_says_so(capsys):
    GRPOConfig(multi_objective_aggregation="normalize_then_sum", scale_rewards="batch")
    assert "scale_rewards=batch has no effect with multi_objective_aggregation=normalize_then_sum" in (
        capsys.readouterr().err
    )
    GRPOConfig(multi_objective_aggregation="normalize_then_sum")  # the default "group": nothing to say
    assert capsys.readouterr().err == ""


def test_off_policy_mask_threshold():
    assert GRPOConfig(off_policy_mask_threshold=0.5).off_policy_mask_threshold == 0.5
    assert GRPOConfig(off_policy_mask_threshold=0).off_policy_mask_threshold == 0  # every drifted negative dropped
    for bad in (-0.1, float("nan"), "high"):
        with pytest.raises(ConfigError, match=r"off_policy_mask_threshold=.*: must be a finite number >= 0"):
            GRPOConfig(off_policy_mask_threshold=bad)


def test_cast_lm_head_to_fp32_refuses_a_lora_adapter_on_the_head():
    assert GRPOConfig(cast_lm_head_to_fp32=True, use_peft=True, lora_target_modules=["q_proj"]).cast_lm_head_to_fp32
    with pytest.raises(ConfigError, match="cast_lm_head_to_fp32 with lm_head in lora_target_modules"):
        GRPOConfig(cast_lm_head_to_fp32=True, use_peft=True, lora_target_modules=["q_proj", "lm_head"])


def test_the_command_line_and_yaml_take_them(tmp_path):
    argv = ["--off_policy_mask_threshold", "0.5", "--multi_objective_aggregation", "normalize_then_sum"]
    argv += ["--cast_lm_head_to_fp32", "--pad_to_multiple_of", "16", "--generation_kwargs", '{"top_k": 5}']
    args, explicit = parse_config(GRPOConfig, argv, "rlhfkit grpo")
    assert (args.off_policy_mask_threshold, args.multi_objective_aggregation) == (0.5, "normalize_then_sum")
    assert (args.cast_lm_head_to_fp32, args.pad_to_multiple_of, args.generation_kwargs) == (True, 16, {"top_k": 5})
    assert {"off_policy_mask_threshold", "pad_to_multiple_of", "cast_lm_head_to_fp32"} <= explicit
    assert parse_config(GRPOConfig, ["--pad_to_multiple_of", "none"], "x")[0].pad_to_multiple_of is None
    path = tmp_path / "run.yaml"
    path.write_text(
        "off_policy_mask_threshold: null\nmulti_objective_aggregation: sum_then_normalize\n"
        "cast_lm_head_to_fp32: false\npad_to_multiple_of: auto\ngeneration_kwargs: null\n"
    )  # TRL's defaults, spelt out
    args, _ = parse_config(GRPOConfig, ["--config", str(path)], "x")
    assert args.pad_to_multiple_of is None and args.multi_objective_aggregation == "sum_then_normalize"


# ---- generation_kwargs ----


@pytest.mark.parametrize(
    "kwargs",
    [
        {"do_sample": True},  # what GRPO does anyway
        {"temperature": 0.7, "max_new_tokens": 16},  # the flags' own values (below)
        {"top_k": 5, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1},  # as the flags of the same name
        {"min_p": None},
        {"num_beams": 2, "suppress_tokens": [3], "no_repeat_ngram_size": 2},  # model.generate samples them
        {"eos_token_id": [2, 3], "use_cache": True},
    ],
)
def test_generation_kwargs_the_loss_can_follow_are_taken(kwargs):
    args = GRPOConfig(temperature=0.7, max_completion_length=16, generation_kwargs=kwargs)
    assert args.generation_kwargs == kwargs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"do_sample": False}, "generation_kwargs do_sample=False: GRPO compares num_generations sampled completions"),
        ({"temperature": 0.5}, "generation_kwargs temperature=0.5 differs from --temperature 0.7: the loss's log-probs "
         r"are softmax\(logits / --temperature\), so the sampler must use the same value. Pass --temperature 0.5"),
        ({"max_new_tokens": 32}, "generation_kwargs max_new_tokens=32 differs from --max_completion_length 16: the "
         "completion mask"),
        ({"top_p": 0.0}, r"generation_kwargs top_p=0.0: must be a number in \(0, 1\] \(the rule of --top_p\)"),
        ({"top_k": -1}, r"generation_kwargs top_k=-1: must be an integer >= 0"),
        ({"repetition_penalty": 0}, r"generation_kwargs repetition_penalty=0: must be a finite number > 0"),
        ({"min_p": 2.0}, r"generation_kwargs min_p=2.0: must be a number in \[0, 1\] \(the rule of --min_p\)"),
        ({"num_return_sequences": 4}, "num_return_sequences=4: rlhfkit samples one completion per prompt row"),
        ({"stop_strings": ["\n"]}, "stop_strings: completions end at token ids"),
        ({"tokp": 5}, "generation_kwargs: 'tokp' is not a field of transformers' GenerationConfig"),
    ],
)  # fmt: skip
def test_generation_kwargs_the_loss_cannot_follow_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(temperature=0.7, max_completion_length=16, generation_kwargs=kwargs)


@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo"])
def test_a_sequence_level_ratio_with_a_token_summed_loss_gets_trls_advice(loss_type, capsys):
    GRPOConfig(importance_sampling_level="sequence", loss_type=loss_type)
    assert f"importance_sampling_level=sequence with loss_type={loss_type}" in capsys.readouterr().err
    GRPOConfig(importance_sampling_level="sequence", loss_type="grpo")  # GSPO as published: nothing to say
    assert capsys.readouterr().err == ""
    # through Python's logging, on the rlhfkit logger, where a caller's log capture sees it
    with unittest.TestCase().assertLogs("rlhfkit", "WARNING") as logs:
        GRPOConfig(importance_sampling_level="sequence", loss_type=loss_type)
    assert logs.output[0].startswith(
        f"WARNING:rlhfkit:note: importance_sampling_level=sequence with loss_type={loss_type}"
    )
