"""Checkpoint integrity: every checkpoint carries manifest.json (size and sha256 of each file); resuming verifies it,
'latest' falls back to the newest intact checkpoint, an explicit damaged one is refused naming the file, and
`rlhfkit checkpoints` lists each checkpoint's state."""

import json
import shutil

import pytest
from accelerate import Accelerator

from rlhfkit.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    read_state,
    resolve_checkpoint,
    verify_checkpoint,
    write_manifest,
)
from rlhfkit.cli import main
from rlhfkit.errors import StorageError
from tests.checkpoint.test_save_load import fake_checkpoint


def flip_byte(path, offset=None):
    """Overwrite one byte in place (the size stays): what a bad disk or a stray write does."""
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


def as_written_before_manifests(ckpt):
    """What a checkpoint written before manifests existed looks like: no manifest.json, and no manifest_version in
    trainer_state.json (which every checkpoint since holds)."""
    (ckpt / MANIFEST_FILE).unlink()
    state = json.loads((ckpt / STATE_FILE).read_text())
    del state["manifest_version"]
    (ckpt / STATE_FILE).write_text(json.dumps(state))


@pytest.fixture
def three_checkpoints(tmp_path):
    accelerator = Accelerator(cpu=True)
    for step in (1, 2, 3):
        fake_checkpoint(accelerator, tmp_path / f"checkpoint-{step}", step)
    return tmp_path


def test_the_manifest_lists_every_file_and_each_kind_of_damage_is_named(three_checkpoints):
    ckpt = three_checkpoints / "checkpoint-3"
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    on_disk = {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in ckpt.rglob("*") if p.is_file()}
    del on_disk[MANIFEST_FILE]
    assert {name: entry["size"] for name, entry in manifest["files"].items()} == on_disk
    assert {STATE_FILE, "optimizer.pt", "extra_state.pt", "rng_state_0.pt"} <= set(on_disk)
    assert verify_checkpoint(ckpt).ok and str(verify_checkpoint(ckpt)) == "ok"

    flip_byte(ckpt / "optimizer.pt")
    verdict = verify_checkpoint(ckpt)
    assert verdict.failures == (("optimizer.pt", verdict.failures[0][1]),) and "sha256 differs" in verdict.reason()
    truncate(ckpt / "optimizer.pt")
    assert "optimizer.pt: truncated: 100 bytes where the manifest says" in verify_checkpoint(ckpt).reason()
    (ckpt / "rng_state_0.pt").unlink()
    assert "rng_state_0.pt: missing" in verify_checkpoint(ckpt).reason()
    (ckpt / MANIFEST_FILE).write_text("{")
    assert verify_checkpoint(ckpt).reason().startswith("manifest.json: unreadable")


def test_a_checkpoint_without_manifest_is_accepted_unverified(three_checkpoints):
    ckpt = three_checkpoints / "checkpoint-3"
    (ckpt / MANIFEST_FILE).unlink()  # deleted (a deletion cut short, say): not taken for an old checkpoint
    assert verify_checkpoint(ckpt).reason() == f"{MANIFEST_FILE}: missing, though {STATE_FILE} says one was written"
    assert resolve_checkpoint("latest", three_checkpoints) == three_checkpoints / "checkpoint-2"
    write_manifest(ckpt)
    as_written_before_manifests(ckpt)
    flip_byte(ckpt / "optimizer.pt")  # unnoticed without a manifest, as before manifests existed
    verdict = verify_checkpoint(ckpt)
    assert verdict.ok and not verdict.has_manifest and str(verdict).startswith("no manifest")
    assert resolve_checkpoint("latest", three_checkpoints) == ckpt
    assert resolve_checkpoint(str(ckpt), three_checkpoints) == ckpt


def test_latest_falls_back_and_an_explicit_damaged_path_is_refused(three_checkpoints, capsys):
    run = three_checkpoints
    flip_byte(run / "checkpoint-3" / "extra_state.pt")
    truncate(run / "checkpoint-2" / "optimizer.pt")
    assert resolve_checkpoint("latest", run) == run / "checkpoint-1"
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("[rlhfkit] resuming from checkpoint-1")
    assert "checkpoint-3 failed verification (extra_state.pt: sha256 differs" in line
    assert "checkpoint-2 failed verification (optimizer.pt: truncated" in line
    assert read_state(run / "checkpoint-1")["progress"] == {"step": 1}

    with pytest.raises(StorageError) as info:
        resolve_checkpoint(str(run / "checkpoint-3"), run)
    message = str(info.value)
    assert (
        "extra_state.pt: sha256 differs" in message
        and f"previous intact checkpoint is {run / 'checkpoint-1'}" in message
    )

    shutil.rmtree(run / "checkpoint-1")
    with pytest.raises(StorageError, match="no checkpoint of .* is intact"):
        resolve_checkpoint("latest", run)
    with pytest.raises(StorageError, match="No earlier checkpoint beside it is intact"):
        resolve_checkpoint(str(run / "checkpoint-2"), run)


def test_rlhfkit_checkpoints_lists_each_state(three_checkpoints, capsys):
    run = three_checkpoints
    truncate(run / "checkpoint-3" / "optimizer.pt")
    as_written_before_manifests(run / "checkpoint-1")
    (run / "checkpoint-4").mkdir()  # a save that did not finish
    assert main(["checkpoints", str(run)]) == 1  # one failed
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("checkpoint-1") and "step      1  no manifest" in lines[0]
    assert "step      2  ok" in lines[1] and lines[1].endswith("<- --resume_from_checkpoint latest")
    assert "step      3  failed: optimizer.pt: truncated" in lines[2]
    assert lines[3].startswith("checkpoint-4") and "incomplete" in lines[3]
    shutil.rmtree(run / "checkpoint-3")
    assert main(["checkpoints", str(run)]) == 0
    assert main(["checkpoints", str(run / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


GRPO = "--num_generations 4 --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --max_completion_length 8"


def grpo_flags(assets, out, *extra):
    return [
        "grpo", "--model_name_or_path", str(assets / "sft"), "--dataset_name", str(assets / "prompts"),
        "--task", str(assets), "--output_dir", str(out), "--report_to", "none", "--num_sample_generations", "0",
        "--max_steps", "3", "--save_steps", "1", "--logging_steps", "1", *GRPO.split(), *extra,
    ]  # fmt: skip


def test_a_run_resumes_past_a_damaged_weight_file(tiny_assets, tmp_path, capsys):
    """The real trainer: the newest checkpoint's model.safetensors has flipped bytes (same size), the one before a
    truncated one. Before manifests the first went unnoticed and the second exited 2 without naming the file."""
    out = tmp_path / "run"
    assert main(grpo_flags(tiny_assets, out)) == 0
    assert all(verify_checkpoint(out / f"checkpoint-{n}").ok for n in (1, 2, 3))
    flip_byte(out / "checkpoint-3" / "model.safetensors")
    truncate(out / "checkpoint-2" / "model.safetensors", keep=1000)
    capsys.readouterr()

    assert main(grpo_flags(tiny_assets, out, "--resume_from_checkpoint", str(out / "checkpoint-3"))) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: sha256 differs" in err and "checkpoint-3" in err
    assert f"previous intact checkpoint is {out / 'checkpoint-1'}" in err and "Traceback" not in err
    assert main(grpo_flags(tiny_assets, out, "--resume_from_checkpoint", str(out / "checkpoint-2"))) == 2
    assert "model.safetensors: truncated: 1000 bytes where the manifest says" in capsys.readouterr().err

    assert main(grpo_flags(tiny_assets, out, "--resume_from_checkpoint", "latest")) == 0
    err = capsys.readouterr().err
    assert "[rlhfkit] resuming from checkpoint-1" in err
    assert "checkpoint-3 failed verification (model.safetensors: sha256 differs" in err
    assert "checkpoint-2 failed verification (model.safetensors: truncated" in err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "episode" in row]  # the steps' rows (not train()'s summary row)
    assert steps == [1, 2, 3]  # steps 2 and 3 trained again, each logged once
    assert all(verify_checkpoint(out / f"checkpoint-{n}").ok for n in (1, 2, 3))  # rewritten intact
    assert (out / "model.safetensors").is_file()


def test_a_damaged_weight_file_without_manifest_is_named_when_loaded(tiny_assets, tmp_path):
    """A checkpoint from before manifests is not verified; its truncated weights fail as they load, naming the
    file (not "resume with the same model", the advice for another architecture)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.checkpoint import load_weights

    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft")
    model.save_pretrained(tmp_path / "checkpoint-1")
    load_weights(model, tmp_path / "checkpoint-1")  # intact: loads
    truncate(tmp_path / "checkpoint-1" / "model.safetensors", keep=1000)
    with pytest.raises(StorageError, match=r"checkpoint-1/model.safetensors is damaged: safetensors cannot read it"):
        load_weights(model, tmp_path / "checkpoint-1")
