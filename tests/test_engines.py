"""rlhfkit.engines without a launch: which engine the environment names, what rlhfkit refuses under it, how eval
rows are shared out in lockstep. Training under each engine is tested end to end in
tests/trainers/test_accelerate_configs.py."""

import pytest

from rlhfkit.engines import Engine, check_supported, process_share
from rlhfkit.errors import ConfigError


@pytest.mark.parametrize(
    "env, engine, name, sharded, lockstep",
    [
        ({}, Engine(), "DDP", False, False),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}, Engine("deepspeed", 1),
         "DeepSpeed ZeRO stage 1", True, False),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, Engine("deepspeed", 3),
         "DeepSpeed ZeRO stage 3", True, True),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, Engine("fsdp", fsdp_version=2), "FSDP (version 2)",
         True, True),
        ({"ACCELERATE_USE_FSDP": "true"}, Engine("fsdp", fsdp_version=1), "FSDP (version 1)", True, True),
    ],
)  # fmt: skip
def test_the_engine_is_read_from_what_accelerate_launch_sets(monkeypatch, env, engine, name, sharded, lockstep):
    for key in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_USE_FSDP", "FSDP_VERSION"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    found = Engine.from_env()
    assert found == engine and str(found) == name
    assert (found.sharded, found.lockstep) == (sharded, lockstep)


def _args(**overrides):
    fields = dict(
        ds3_gather_for_generation=True, sync_ref_model=False, merge_adapter=False, load_in_4bit=False,
        load_in_8bit=False, cache_implementation=None,
    )  # fmt: skip
    return {**fields, **overrides}


ZERO3, FSDP2 = Engine("deepspeed", 3), Engine("fsdp", fsdp_version=2)


@pytest.mark.parametrize(
    "engine, overrides, message",
    [
        (Engine("fsdp", fsdp_version=1), {}, "accelerate to-fsdp2 --config_file"),
        (ZERO3, {"ds3_gather_for_generation": False}, "--ds3_gather_for_generation false under DeepSpeed ZeRO"),
        (FSDP2, {"ds3_gather_for_generation": False}, "does not sample sharded"),
        (ZERO3, {"sync_ref_model": True}, "--sync_ref_model under DeepSpeed ZeRO stage 3"),
        (FSDP2, {"merge_adapter": True}, "PeftModel.from_pretrained(base_model, OUTPUT_DIR)"),
        (ZERO3, {"load_in_4bit": True}, "quantised weights are not sharded"),
        (FSDP2, {"cache_implementation": "static"}, "--cache_implementation static under FSDP (version 2)"),
    ],
)
def test_what_rlhfkit_does_not_do_under_an_engine_is_refused_with_the_fix(engine, overrides, message):
    with pytest.raises(ConfigError, match=None) as e:
        check_supported(engine, **_args(**overrides))
    assert message in str(e.value)


@pytest.mark.parametrize("engine", [Engine(), Engine("deepspeed", 2)])
def test_without_sharded_weights_the_same_settings_are_fine(engine):
    check_supported(
        engine,
        **_args(
            ds3_gather_for_generation=False, sync_ref_model=True, merge_adapter=True, cache_implementation="static"
        ),
    )


@pytest.mark.parametrize("size, processes", [(31, 2), (32, 2), (7, 3), (1, 2), (2, 4), (0, 2)])
def test_process_shares_cover_every_row_once_and_have_one_length_in_lockstep(size, processes):
    shares = [process_share(size, p, processes, lockstep=True) for p in range(processes)]
    own_rows = sorted(i for rows, own in shares for i in rows[:own])
    assert own_rows == list(range(size))  # every row once, as the process's own
    assert len({len(rows) for rows, _ in shares}) == 1  # the same number of forwards on every process
    for p, (rows, own) in enumerate(shares):
        assert rows[:own] == list(range(p, size, processes))
        assert all(0 <= i < size for i in rows)


def test_process_shares_are_unpadded_without_lockstep():
    assert process_share(31, 1, 2, lockstep=False) == (list(range(1, 31, 2)), 15)
    assert process_share(31, 1, 2, lockstep=True) == ([*range(1, 31, 2), 1], 15)
