"""A resume continues the run its checkpoint belongs to: a setting that shapes the saved state or the run is refused
with each difference listed, unless --allow_config_change; logging and other safe settings may change; every part of
the run is recorded in run_config_history.jsonl, and run_config.json holds the latest."""

import json

from rlhfkit.cli import main
from rlhfkit.config import GRPOArguments, PPOArguments
from rlhfkit.config.train import config_field_names
from rlhfkit.trainers.resume import SAFE_TO_CHANGE, config_changes
from tests.helpers import asset_flags

BASE = {
    "report_to": "none", "total_episodes": "16", "per_device_train_batch_size": "8",
    "local_rollout_forward_batch_size": "8", "response_length": "4", "num_ppo_epochs": "1",
    "num_sample_generations": "0", "save_steps": "1", "learning_rate": "3e-4", "logging_steps": "1",
}  # fmt: skip  # 2 updates of 8 episodes, a checkpoint after each


def ppo(assets, out, *extra, **changed) -> int:
    values = {**BASE, **changed}
    flags = [f for name, value in values.items() for f in (f"--{name}", value)]
    return main(["ppo", *asset_flags(assets), "--output_dir", str(out), *flags, *extra])


def history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "run_config_history.jsonl").read_text().splitlines()]


def test_changed_settings_on_resume_are_refused_listed_allowed_and_recorded(tiny_assets, tmp_path, capsys):
    out = tmp_path / "run"
    assert ppo(tiny_assets, out) == 0
    first_config = (out / "run_config.json").read_text()

    # A changed learning rate and number of PPO epochs: refused, each difference listed, nothing written.
    assert ppo(tiny_assets, out, "--resume_from_checkpoint", "latest", learning_rate="1e-3", num_ppo_epochs="2") == 2
    err = capsys.readouterr().err
    assert "learning_rate: 0.0003 -> 0.001" in err and "num_ppo_epochs: 1 -> 2" in err
    assert "--allow_config_change" in err and "logging_steps" not in err
    assert (out / "run_config.json").read_text() == first_config and len(history(out)) == 1
    assert not (out / ".rlhfkit.lock").exists()

    # A checkpoint whose trainer_state.json holds no config (written before it did, without a manifest) is compared
    # with the run's run_config.json.
    state_file = out / "checkpoint-1" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state.pop("config")["learning_rate"] == 3e-4
    del state["manifest_version"]  # which says a manifest was written: without one, the checkpoint would fail
    state_file.write_text(json.dumps(state))
    (out / "checkpoint-1" / "manifest.json").unlink(missing_ok=True)
    resume_1 = ("--resume_from_checkpoint", str(out / "checkpoint-1"))
    assert ppo(tiny_assets, out, *resume_1, learning_rate="1e-3") == 2
    assert "learning_rate: 0.0003 -> 0.001" in capsys.readouterr().err

    # A changed logging interval is allowed (the run trains step 2 again), said and recorded.
    assert ppo(tiny_assets, out, *resume_1, logging_steps="2") == 0
    assert "logging_steps: 1 -> 2" in capsys.readouterr().err
    assert json.loads((out / "run_config.json").read_text())["logging_steps"] == 2

    # --allow_config_change lets the new learning rate through; the checkpoint it resumes was written by the part
    # above, so logging_steps 2 is no change.
    assert ppo(tiny_assets, out, "--resume_from_checkpoint", "latest", "--allow_config_change", learning_rate="1e-3",
               logging_steps="2") == 0  # fmt: skip
    assert json.loads((out / "run_config.json").read_text())["learning_rate"] == 1e-3

    parts = history(out)
    assert [(p["part"], p["start_step"]) for p in parts] == [(1, 0), (2, 1), (3, 2)]
    assert [p["resumed_from"] for p in parts] == [None, str(out / "checkpoint-1"), str(out / "checkpoint-2")]
    assert [p["changed"] for p in parts] == [
        {},
        {"logging_steps": {"from": 1, "to": 2}},
        {"learning_rate": {"from": 3e-4, "to": 1e-3}},
    ]
    assert [p["allowed_by_flag"] for p in parts] == [[], [], ["learning_rate"]]
    assert [p["config"]["learning_rate"] for p in parts] == [3e-4, 3e-4, 1e-3]  # each part's settings kept
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "episode" in row] == [1, 2]  # the updates' rows (not train()'s summaries)


def test_safe_fields_are_a_short_explicit_list_and_any_other_field_is_checked():
    names = set(config_field_names(PPOArguments)) | set(config_field_names(GRPOArguments))  # every flag of a run
    assert SAFE_TO_CHANGE <= names  # no misspelt name that would let nothing through
    for checked in ("learning_rate", "per_device_train_batch_size", "seed", "model_name_or_path", "dataset_name",
                    "total_episodes", "max_steps", "kl_coef", "num_generations", "loss_type", "gamma", "lam",
                    "cliprange"):  # fmt: skip
        assert checked in names and checked not in SAFE_TO_CHANGE
    saved = {"learning_rate": 1e-3, "a_future_field": 1, "report_to": ["none"]}
    new = {"learning_rate": 1e-3, "a_future_field": 2, "report_to": ["trackio"], "a_field_the_checkpoint_lacks": 3}
    changes = config_changes(saved, new)
    assert changes == {"a_future_field": (1, 2), "report_to": (["none"], ["trackio"])}
    assert "a_future_field" not in SAFE_TO_CHANGE  # a new field is checked unless listed as safe
    # How a part started is not a change of the run's settings.
    assert config_changes({"resume_from_checkpoint": None, "allow_config_change": False},
                          {"resume_from_checkpoint": "latest", "allow_config_change": True}) == {}  # fmt: skip
