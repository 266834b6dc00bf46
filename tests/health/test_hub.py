"""hub.py: ``rlhfkit doctor ORG/NAME`` reads a Hub repo's trainer_state.json from a hub cache in tmp_path, offline
(tests/hub_cache.py's layout): at the repo's root or in its newest checkpoint-*/, at a revision, from a dataset repo;
the one-line errors for a repo not cached while offline and for a cached repo without a trainer_state.json; the real
TRL runs of ../shared/wild-runs/trl as Hub repos, with a NaN put into them.

huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE into its constants when imported: in-process tests point the
constants at the cache; one test runs the CLI in a subprocess with the environment variables themselves."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.health import CRITICAL, cmd_doctor, doctor
from rlhfkit.health.hub import looks_like_repo_id
from rlhfkit.health.sources import read_source
from tests.health.test_trainer_state import WILD_FILES, grpo_entry, wild_state, with_nan, write_json
from tests.hub_cache import REVISION, cache_model, offline_env

ROOT = Path(__file__).resolve().parents[2]


def push(hub: Path, repo_id: str, files: dict[str, object], scratch: Path, revision: str = REVISION) -> None:
    """Put `files` (path in the repo -> JSON value) into the hub cache as model repo `repo_id` at `revision`."""
    saved = scratch / f"saved-{repo_id.replace('/', '--')}-{revision[:6]}"
    for name, value in files.items():
        write_json(saved / name, value)
    cache_model(hub, repo_id, saved, revision)


def state(*steps, **changes) -> dict:
    return {"log_history": [grpo_entry(step, **changes) for step in steps]}


def error_line(capsys, argv) -> str:
    assert cmd_doctor(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlhfkit doctor: error: "), err
    return err


def test_repo_ids_look_like_org_slash_name():
    for text in ("user/run", "Org-1/grpo_run.v2", "a/b"):
        assert looks_like_repo_id(text), text
    for text in ("run", "a/b/c", "/abs/path", "./run", "user/-run", "user/run--x", "user/run..x", "a/b.", "a b/c"):
        assert not looks_like_repo_id(text), text


def test_the_root_trainer_state_of_a_cached_repo(hub, tmp_path):
    push(
        hub,
        "me/grpo",
        {"trainer_state.json": state(1, 2, 3), "checkpoint-2/trainer_state.json": state(1, 2)},
        tmp_path,
    )
    source = read_source("me/grpo")
    assert [row["step"] for row in source.rows] == [1, 2, 3] and source.reader == "trainer_state"
    assert source.description == f"Hub model repo me/grpo (commit {REVISION[:12]}): trainer_state.json"


def test_the_newest_checkpoint_of_a_cached_repo_is_named(hub, tmp_path, capsys):
    files = {f"checkpoint-{n}/trainer_state.json": state(*range(1, n + 1)) for n in (5, 20, 10)}
    push(hub, "me/grpo", {**files, "config.json": {"model_type": "qwen2"}}, tmp_path)
    assert cmd_doctor(["me/grpo", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out.splitlines()[0])["summary"]
    assert facts["source"] == f"Hub model repo me/grpo (commit {REVISION[:12]}): checkpoint-20/trainer_state.json"
    assert facts["notes"] == ["newest of 3 checkpoint(s): checkpoint-20"] and facts["steps"]["last"] == 20


def test_a_revision_reads_that_commit(hub, tmp_path):
    other = "fedcba9876543210fedcba9876543210fedcba98"
    push(hub, "me/grpo", {"trainer_state.json": state(1, 2)}, tmp_path)
    push(hub, "me/grpo", {"trainer_state.json": state(1, 2, 3, 4)}, tmp_path, revision=other)  # refs/main -> other
    assert len(read_source("me/grpo").rows) == 4
    assert len(read_source("me/grpo", revision=REVISION).rows) == 2
    assert read_source("me/grpo", revision=REVISION).description.startswith(
        f"Hub model repo me/grpo (revision {REVISION}"
    )


def test_a_dataset_repo_is_read_when_there_is_no_model_repo(hub, tmp_path):
    snapshot = hub / "datasets--me--logs" / "snapshots" / REVISION
    write_json(snapshot / "checkpoint-3" / "trainer_state.json", state(1, 2, 3))
    (hub / "datasets--me--logs" / "refs").mkdir()
    (hub / "datasets--me--logs" / "refs" / "main").write_text(REVISION)
    assert read_source("me/logs").description.startswith("Hub dataset repo me/logs")


def test_a_repo_not_cached_while_offline_exits_2_saying_so(hub, capsys):
    err = error_line(capsys, ["someone/grpo-run"])
    assert "'someone/grpo-run' is no local path, and as a Hub repo id it is not in the local cache" in err
    assert f"({hub}) while HF_HUB_OFFLINE is set: run once online (HF_HUB_OFFLINE unset)" in err
    assert "or pass the local path of the run" in err
    err = error_line(capsys, ["someone/grpo-run", "--revision", "v2"])
    assert "as a Hub repo id at revision 'v2' it is not in the local cache" in err


def test_a_cached_repo_without_a_trainer_state_exits_2_saying_so(hub, tmp_path, capsys):
    push(hub, "me/model-only", {"config.json": {"model_type": "qwen2"}}, tmp_path)
    err = error_line(capsys, ["me/model-only"])
    assert "Hub repo 'me/model-only' holds no trainer_state.json at its root or in a checkpoint-*/" in err
    assert "HF_HUB_OFFLINE is set: go online once to fetch it" in err


def test_a_missing_path_that_is_no_repo_id_and_a_revision_with_a_local_path_exit_2(hub, tmp_path, capsys):
    assert (
        error_line(capsys, [str(tmp_path / "nope")])
        == f"rlhfkit doctor: error: {str(tmp_path / 'nope')!r} does not exist\n"
    )
    write_json(tmp_path / "trainer_state.json", state(1))
    err = error_line(capsys, [str(tmp_path), "--revision", "main"])
    assert f"--revision main is for a Hub repo id, and {str(tmp_path)!r} is a local path" in err


def test_an_existing_local_path_wins_over_a_repo_id(hub, tmp_path, monkeypatch):
    push(hub, "me/grpo", {"trainer_state.json": state(1, 2, 3)}, tmp_path)
    write_json(tmp_path / "me" / "grpo" / "trainer_state.json", state(7))
    monkeypatch.chdir(tmp_path)
    assert [row["step"] for row in read_source("me/grpo").rows] == [7]


# ------------------------------------------------------------------------------------------------ real runs


@pytest.mark.parametrize("name", WILD_FILES)
def test_a_real_run_opens_as_a_hub_repo(name, hub, tmp_path, capsys):
    repo_id = "wild/" + name.split("__")[0].lower()
    push(hub, repo_id, {"checkpoint-250/trainer_state.json": wild_state(name)}, tmp_path)
    assert cmd_doctor([repo_id]) in (0, 1)
    out = capsys.readouterr().out
    assert f"(Hub model repo {repo_id} (commit {REVISION[:12]}): checkpoint-250/trainer_state.json)" in out


@pytest.mark.parametrize("nth", range(len(WILD_FILES)))
def test_a_nan_in_a_real_run_on_the_hub_is_critical_at_its_step(nth, hub, tmp_path):
    bad, step, metric = with_nan(wild_state(WILD_FILES[nth]), nth + 3)
    push(hub, "wild/nan", {"trainer_state.json": bad}, tmp_path)
    nonfinite = [(f.step, f.severity, f.metrics) for f in doctor("wild/nan").findings if f.rule == "nonfinite_metric"]
    assert len(nonfinite) == 1 and nonfinite[0][:2] == (step, CRITICAL) and math.isnan(nonfinite[0][2][metric])


@pytest.mark.slow
def test_the_cli_reads_a_cached_repo_with_the_offline_environment(tmp_path):
    hub = tmp_path / "hub"
    push(hub, "me/grpo", {"checkpoint-12/trainer_state.json": state(*range(1, 13))}, tmp_path)
    env = offline_env(hub, tmp_path / "datasets", PYTHONPATH=str(ROOT))
    run = [sys.executable, "-m", "rlhfkit", "doctor"]
    result = subprocess.run([*run, "me/grpo", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["summary"]["steps"] == {"first": 1, "last": 12, "count": 12}
    result = subprocess.run([*run, "me/other"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "not in the local cache" in result.stderr and "HF_HUB_OFFLINE is set" in result.stderr
