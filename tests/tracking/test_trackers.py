"""report_to resolution, W&B offline decision, config flattening and per-run tracker settings."""

import enum
from pathlib import Path

import pytest
from accelerate.tracking import TensorBoardTracker, TrackioTracker, WandBTracker

from rlhfkit.tracking import trackers
from rlhfkit.tracking.trackers import (
    flatten_config,
    make_trackers,
    resolve_report_to,
    wandb_has_credentials,
    wandb_init_kwargs,
)


@pytest.mark.parametrize("value", [None, "none", "None", [], ["none"], ""])
def test_no_tracker(value):
    assert resolve_report_to(value) == []


def test_names_are_normalised_split_and_deduplicated():
    assert resolve_report_to(" WandB ,tensorboard,wandb") == ["wandb", "tensorboard"]
    assert resolve_report_to(["trackio", "TensorBoard"]) == ["trackio", "tensorboard"]


def test_all_means_every_installed_tracker(monkeypatch):
    monkeypatch.setattr(trackers, "installed_trackers", lambda: ["trackio", "tensorboard"])
    assert resolve_report_to("all") == ["trackio", "tensorboard"]
    assert resolve_report_to(["tensorboard", "all"]) == ["tensorboard", "trackio"]


def test_unknown_tracker_names_the_value_and_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        resolve_report_to(["wandb", "mlfow"])
    message = str(err.value)
    assert "mlfow" in message
    for allowed in ("trackio", "wandb", "tensorboard", "all", "none"):
        assert allowed in message


def test_none_cannot_be_combined():
    with pytest.raises(ValueError, match="none"):
        resolve_report_to("none,wandb")


def test_requested_but_missing_tracker_says_how_to_install(monkeypatch):
    monkeypatch.setattr(trackers, "installed_trackers", lambda: ["trackio"])
    with pytest.raises(ImportError, match="pip install"):
        resolve_report_to("wandb")


@pytest.fixture
def no_wandb_env(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_wandb_is_offline_without_credentials_or_mode(no_wandb_env, tmp_path):
    assert not wandb_has_credentials()
    assert wandb_init_kwargs("r1", tmp_path) == {"name": "r1", "dir": str(tmp_path), "mode": "offline"}


def test_wandb_uses_its_default_mode_with_an_api_key_or_netrc_entry(no_wandb_env, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert "mode" not in wandb_init_kwargs("r1", tmp_path)
    monkeypatch.delenv("WANDB_API_KEY")
    no_wandb_env.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    assert wandb_has_credentials()
    assert "mode" not in wandb_init_kwargs("r1", tmp_path)


def test_explicit_wandb_mode_is_respected(no_wandb_env, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert "mode" not in wandb_init_kwargs("r1", tmp_path)  # wandb reads WANDB_MODE itself


class Color(enum.Enum):
    RED = "red"


def test_flatten_config_keeps_scalars_and_serialises_the_rest():
    config = {
        "lr": 1e-3,
        "steps": 3,
        "bf16": False,
        "name": "x",
        "report_to": ["wandb", "tensorboard"],
        "stop_token_id": None,
        "path": Path("/tmp/out"),
        "color": Color.RED,
        "nested": {"a": 1, "b": {"c": "d"}},
        "empty": {},
    }
    assert flatten_config(config) == {
        "lr": 1e-3,
        "steps": 3,
        "bf16": False,
        "name": "x",
        "report_to": '["wandb", "tensorboard"]',
        "stop_token_id": "None",
        "path": "/tmp/out",
        "color": "red",
        "nested/a": 1,
        "nested/b/c": "d",
        "empty": "{}",
    }


def test_make_trackers_gives_each_tracker_the_run_name_and_its_directory(tmp_path, no_wandb_env):
    made = make_trackers(
        ["tensorboard", "wandb", "trackio"], project="proj", run_name="run-7", output_dir=tmp_path / "out"
    )
    tb, wb, ti = made
    assert isinstance(tb, TensorBoardTracker) and isinstance(wb, WandBTracker) and isinstance(ti, TrackioTracker)
    # accelerate joins these at start(): TensorBoard writes to <root>/<run_name>.
    assert (Path(tb.logging_dir_param), tb.run_name) == (tmp_path / "out" / "runs", "run-7")
    assert wb.run_name == "proj" and wb.init_kwargs == {
        "name": "run-7",
        "dir": str(tmp_path / "out"),
        "mode": "offline",
    }
    assert ti.run_name == "proj" and ti.init_kwargs == {"name": "run-7"}

    (tb,) = make_trackers("tensorboard", project="p", run_name="r", output_dir=tmp_path, logging_dir=tmp_path / "tb")
    assert Path(tb.logging_dir_param) == tmp_path / "tb"
    assert make_trackers("none", project="p", run_name="r", output_dir=tmp_path) == []


def test_every_other_accelerate_tracker_gets_trls_keys(tiny_assets, tmp_path, monkeypatch):
    """--report_to mlflow (or comet_ml, aim, clearml, dvclive, swanlab) goes through accelerate's tracker of that
    name: here a recording stand-in, as mlflow is not installed."""
    import accelerate.utils
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

    from rlhfkit.trainers.build import build_ppo_trainer
    from tests.trainers.test_ppo import small_config

    logged = []

    class RecordingMLflow(GeneralTracker):
        name, requires_logging_directory = "mlflow", False

        def __init__(self, project):
            super().__init__()
            logged.append(("project", project))

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            logged.append(("config", values))

        def log(self, values, step=None, **kwargs):
            logged.append((step, dict(values)))

    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "mlflow", RecordingMLflow)
    monkeypatch.setattr(accelerate.utils, "is_mlflow_available", lambda: True)
    args = small_config(tiny_assets, tmp_path, report_to=["mlflow"], project="exp", num_sample_generations=0)
    build_ppo_trainer(args).train()
    assert logged[0] == ("project", "exp") and logged[1][0] == "config"
    rows = [values for step, values in logged[2:]]
    assert [row["train/global_step"] for row in rows] == [1, 2, 3, 3]  # the updates, then train()'s summary row
    assert all({"train/objective/kl", "train/episode", "train/lr"} <= set(row) for row in rows[:-1])
    assert {"train/train_runtime", "train/train_loss", "train/total_flos"} <= set(rows[-1])  # as transformers sends


def test_a_tracker_that_is_not_installed_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(trackers, "installed_trackers", lambda: ["trackio"])
    with pytest.raises(ImportError, match="pip install mlflow"):
        resolve_report_to("mlflow")
