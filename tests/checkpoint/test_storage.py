"""Storage errors while writing a checkpoint or the final model: a StorageError naming the path and the cause (no
space left), the half-written .tmp removed, the previous checkpoint intact and resumable; too little free space is
found before writing; every written file follows the umask."""

import errno
import json
import os
import stat

import pytest
import torch
import transformers.modeling_utils
from accelerate import Accelerator
from safetensors import SafetensorError
from safetensors.torch import save_file

from rlhfkit.checkpoint import save_checkpoint, save_into, storage, verify_checkpoint
from rlhfkit.cli import main
from rlhfkit.errors import StorageError
from tests.checkpoint.test_integrity import grpo_flags
from tests.checkpoint.test_save_load import fake_checkpoint


def failing_safetensors(monkeypatch, fails):
    """Make transformers' safetensors writes raise safetensors' own ENOSPC error when fails(filename) is true."""
    real = transformers.modeling_utils.safe_save_file

    def save(tensors, filename, *args, **kwargs):
        if fails(str(filename)):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save)


def test_no_space_while_writing_a_checkpoint_keeps_the_previous_and_the_run_resumes(
    tiny_assets, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    failing_safetensors(monkeypatch, lambda name: "checkpoint-2.tmp" in name)
    assert main(grpo_flags(tiny_assets, out)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"Could not write the checkpoint {out / 'checkpoint-2'}: no space left on device" in err
    assert "mounted at" in err and "free" in err  # the filesystem and its free space
    assert f"previous checkpoint {out / 'checkpoint-1'} is intact" in err
    assert f"--output_dir {out} --resume_from_checkpoint latest" in err
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint")) == ["checkpoint-1"]  # no .tmp left
    assert verify_checkpoint(out / "checkpoint-1").ok

    monkeypatch.undo()
    assert main(grpo_flags(tiny_assets, out, "--resume_from_checkpoint", "latest")) == 0
    assert all(verify_checkpoint(out / f"checkpoint-{n}").ok for n in (1, 2, 3))
    # Every file of the run follows the umask (safetensors writes 0600 temporary files and renames them).
    mask = os.umask(0)
    os.umask(mask)
    modes = {
        p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert "model.safetensors" in modes and "checkpoint-3/model.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_no_space_while_writing_the_final_model(tiny_assets, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    failing_safetensors(monkeypatch, lambda name: "run.tmp" in name)
    assert main(grpo_flags(tiny_assets, out)) == 2
    err = capsys.readouterr().err
    assert f"Could not write the final model into {out}: no space left on device" in err and "Traceback" not in err
    assert f"final checkpoint {out / 'checkpoint-3'} holds the trained state" in err
    assert not (out / "model.safetensors").exists() and not (tmp_path / "run.tmp").exists()
    monkeypatch.undo()
    assert main(grpo_flags(tiny_assets, out, "--resume_from_checkpoint", "latest")) == 0  # writes the final model
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "torch_error",
    [
        "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598",
        "basic_ios::clear: iostream error",
        "a text not seen yet",  # any RuntimeError while writing, once the disk is full
    ],
)
def test_torch_zip_writer_failure_on_a_full_disk(tmp_path, monkeypatch, torch_error):
    """torch.save on a full disk raises a RuntimeError (either text, as seen on a full tmpfs) that does not say
    why: the free space left tells."""
    accelerator = Accelerator(cpu=True)
    fake_checkpoint(accelerator, tmp_path / "checkpoint-1", 1)
    full = []
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "checkpoint-2.tmp" in str(f) and str(f).endswith("optimizer.pt"):
            full.append(True)
            raise RuntimeError(torch_error)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(storage, "_free_bytes", lambda directory: 0 if full else 10**12)
    with pytest.raises(StorageError) as info:
        fake_checkpoint(accelerator, tmp_path / "checkpoint-2", 2)
    message = str(info.value)
    assert "no space left on device" in message and f"the write raised RuntimeError: {torch_error}" in message
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "weights-written"]
    assert verify_checkpoint(tmp_path / "checkpoint-1").ok

    # Another I/O error is named as it is, with the file.
    full.clear()
    monkeypatch.setattr(torch, "save", real_save)

    def denied(tmp):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(tmp, "model.safetensors"))

    with pytest.raises(
        StorageError, match=r"checkpoint-3.tmp/model.safetensors: PermissionError: .*Permission denied"
    ):
        save_checkpoint(accelerator, tmp_path / "checkpoint-3", denied, None, {"progress": {"step": 3}})
    assert not (tmp_path / "checkpoint-3.tmp").exists()

    # A bug in a writer is not a storage error: it propagates as it is.
    def bug(tmp):
        raise KeyError("oops")

    with pytest.raises(KeyError):
        save_checkpoint(accelerator, tmp_path / "checkpoint-4", bug, None, {"progress": {"step": 4}})


def test_too_little_free_space_fails_before_writing(tmp_path, monkeypatch):
    accelerator = Accelerator(cpu=True)
    fake_checkpoint(accelerator, tmp_path / "checkpoint-1", 1)
    size = sum(p.stat().st_size for p in (tmp_path / "checkpoint-1").rglob("*") if p.is_file())
    monkeypatch.setattr(storage, "_free_bytes", lambda directory: size // 2)
    writes = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: writes.append(a))
    with pytest.raises(StorageError) as info:
        fake_checkpoint(accelerator, tmp_path / "checkpoint-2", 2)
    assert str(info.value).startswith(f"Not writing the checkpoint {tmp_path / 'checkpoint-2'}: no space left")
    assert "it needs about" in str(info.value) and not writes
    assert not (tmp_path / "checkpoint-2.tmp").exists()


def test_written_files_follow_the_umask(tmp_path):
    accelerator = Accelerator(cpu=True)
    old = os.umask(0o027)
    try:

        def write(directory):
            os.makedirs(directory, exist_ok=True)
            save_file({"w": torch.zeros(2)}, os.path.join(directory, "model.safetensors"))  # a 0600 temporary file

        save_into(accelerator, str(tmp_path / "final"), write)
        fake_checkpoint(accelerator, tmp_path / "checkpoint-1", 1)
        save_checkpoint(accelerator, tmp_path / "checkpoint-2", write, None, {"progress": {"step": 2}})
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "weights-written"]
    assert len(files) > 8
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o640}


def test_no_space_while_logging_a_row_names_the_file_and_the_run_resumes(tiny_assets, tmp_path, monkeypatch, capsys):
    from rlhfkit.tracking import rundir

    out = tmp_path / "run"
    real = rundir.RunDirectory._append

    def append(self, name, records):
        if name == rundir.METRICS_FILE and any(record.get("step") == 3 for record in records):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path / name))
        return real(self, name, records)

    monkeypatch.setattr(rundir.RunDirectory, "_append", append)
    assert main(grpo_flags(tiny_assets, out)) == 2
    err = capsys.readouterr().err
    assert f"Could not write {out / 'metrics.jsonl'}: no space left on device" in err, err
    assert "--resume_from_checkpoint latest" in err and "Traceback" not in err
    monkeypatch.setattr(rundir.RunDirectory, "_append", real)
    assert main([*grpo_flags(tiny_assets, out), "--resume_from_checkpoint", "latest"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "episode" in row] == [1, 2, 3]  # the steps' rows (not train()'s summary)
