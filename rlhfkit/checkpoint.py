"""Checkpoints that resume a run exactly, written atomically.

A checkpoint directory ``checkpoint-N`` (N = the step it was taken after) holds:

    model.safetensors, config.json, tokenizer files   the policy, loadable on its own by any transformers tool
                                                      (--use_peft: adapter_config.json and adapter_model.safetensors,
                                                      the LoRA adapter, which peft loads onto the base model)
    value_model/                                      PPO's value model (safetensors; --use_peft: its adapter)
    ref_model/                                        GRPO's reference with --sync_ref_model (it changes then)
    optimizer.pt                                      optimizer state (tensors and numbers only)
    engine/                                           instead of optimizer.pt under DeepSpeed or FSDP: the engine's
                                                      own sharded model and optimizer state (accelerate.save_state;
                                                      DeepSpeed's files are its own format, pickles included)
    extra_state.pt                                    the trainer's own tensors (PPO's KL controller, a GRPO batch still
                                                      in use) and the metric sums of an unfinished logging window
    rng_state_<rank>.pt                               every library's RNG state, one file per process
    trainer_state.json                                counters (steps, episodes, data position, skipped steps) and the run's config
    manifest.json                                     every other file's relative path, size and sha256; written last

Everything is written into ``checkpoint-N.tmp`` and renamed once complete, so a crash during a save leaves the
previous checkpoints intact and never a directory that looks complete but is not (trainer_state.json is the
completeness mark). ``.pt`` files are loaded with ``torch.load(weights_only=True)``: no pickle code runs. Every
file follows the process's umask (0644 under the usual 022), whatever mode the library that wrote it chose.

Integrity: resuming verifies the checkpoint against its manifest (:func:`verify_checkpoint`): a missing file, a
size that differs (a truncated file) or a sha256 that differs (bytes overwritten) fails, naming the file. "latest"
then falls back to the newest checkpoint that verifies; an explicit path raises StorageError. A checkpoint written
before manifests existed (no manifest.json) is accepted unverified, as before.

Storage errors: a failed write (no space left, no permission, an I/O error; torch's and safetensors' own errors of
a failed write included) raises StorageError naming the path and the cause, after removing the half-written
``.tmp`` directory, so the previous checkpoint stays intact and the run resumes from it. Before writing, the free
space is compared with the size of the previous checkpoint (or the optimizer's parameters times three) and a save
that cannot fit fails at once with the same message.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfkit.errors import CheckpointError, StorageError

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra_state.pt"
ENGINE_DIR = "engine"
VALUE_MODEL_DIR = "value_model"
REF_MODEL_DIR = "ref_model"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# 2: extra_state.pt holds {"trainer": the trainer's own state, "window": the unfinished logging window} and
# trainer_state.json the skipped-step counters ("nonfinite"), the same for PPO and GRPO.
FORMAT_VERSION = 2
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> str:
    """Where the checkpoint taken after `step` lives."""
    return os.path.join(output_dir, f"checkpoint-{step}")


def rng_state() -> dict[str, Any]:
    """The RNG states of Python, NumPy and torch (CPU and every CUDA device) of this process, as plain data."""
    np_state = np.random.get_state()
    state = {
        "python": _listify(random.getstate()),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "rest": [np_state[0], *np_state[2:]]},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    kind, *rest = state["numpy"]["rest"]
    np.random.set_state((kind, state["numpy"]["key"].numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _listify(value):
    return [_listify(v) for v in value] if isinstance(value, tuple) else value


def _tuplify(value):
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def save_checkpoint(
    accelerator,
    path: str | os.PathLike,
    write_models: Callable[[str], None],
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    extra: dict[str, Any] | None = None,
    save_total_limit: int | None = None,
    save_engine: Callable[[str], None] | None = None,
) -> None:
    """Write a checkpoint to `path` atomically (a collective: every process must call it), then keep only the
    newest `save_total_limit` checkpoints beside it (all when None or 0).

    write_models(dir): saves the models (main process). state: JSON-able counters. extra: tensors / plain data.
    save_engine(dir): under DeepSpeed or FSDP, writes the engine's sharded state into dir (every process), in place
    of optimizer.pt (optimizer None).

    A failed write on any process (no space left, an I/O error) raises StorageError on every process, with the
    ``.tmp`` directory removed and the previous checkpoints untouched; so does too little free space for a
    checkpoint the size of the previous one, before anything is written.
    """
    path = str(path).rstrip("/")
    tmp = path + ".tmp"
    output_dir = os.path.dirname(path) or "."
    main = accelerator.is_main_process
    target = f"the checkpoint {path}"

    def prepare() -> None:
        _check_space(output_dir, _checkpoint_estimate(output_dir, optimizer), target, path)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)

    def write() -> None:
        torch.save(rng_state(), os.path.join(tmp, f"rng_state_{accelerator.process_index}.pt"))
        if save_engine is not None:
            save_engine(os.path.join(tmp, ENGINE_DIR))
        if main:
            write_models(tmp)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), os.path.join(tmp, OPTIMIZER_FILE))
            torch.save(extra or {}, os.path.join(tmp, EXTRA_FILE))
            record = {"format_version": FORMAT_VERSION, "num_processes": accelerator.num_processes, **state}
            Path(tmp, STATE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def finish() -> None:  # every process's files are written: the manifest, then the rename
        follow_umask(tmp)
        write_manifest(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)

    accelerator.wait_for_everyone()
    _together(accelerator, prepare if main else None, target, tmp, path)
    _together(accelerator, write, target, tmp, path)
    _together(accelerator, finish if main else None, target, tmp, path)
    if main:
        prune_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run directory, oldest first: (step, path)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def prune_checkpoints(output_dir: str | os.PathLike, limit: int | None) -> None:
    """Delete all but the newest `limit` complete checkpoints of `output_dir` (none when limit is None or 0)."""
    if not limit:
        return
    found = checkpoints(output_dir)
    for _, path in found[: max(0, len(found) - limit)]:
        shutil.rmtree(path, ignore_errors=True)


def resolve_checkpoint(spec: str, output_dir: str | os.PathLike | None) -> Path:
    """The checkpoint directory `spec` names, verified against its manifest (verify_checkpoint): a path, or "latest".

    "latest": the newest complete checkpoint of output_dir that verifies. When newer ones fail, one line on stderr
    says which checkpoint is taken and why the newer ones were not; when none verifies, StorageError. A path that
    fails verification: StorageError naming the file, the reason and the previous checkpoint that verifies.
    A checkpoint without manifest.json (written before manifests) is taken unverified, as before.
    """
    if spec == "latest":
        if output_dir is None:
            raise CheckpointError(
                "--resume_from_checkpoint latest needs --output_dir: the run directory whose newest checkpoint to use."
            )
        found = checkpoints(output_dir)
        if not found:
            raise CheckpointError(
                f"--resume_from_checkpoint latest: {output_dir} holds no complete checkpoint-N directory. Pass "
                "the path of a checkpoint, or start the run without --resume_from_checkpoint."
            )
        failed: list[Verdict] = []
        for _, path in reversed(found):
            verdict = verify_checkpoint(path)
            if verdict.ok:
                if failed:
                    _announce(path, failed)
                return path
            failed.append(verdict)
        reasons = "; ".join(f"{v.path.name}: {v.reason()}" for v in failed)
        raise StorageError(
            f"--resume_from_checkpoint latest: no checkpoint of {output_dir} is intact ({reasons}). Start the run "
            "afresh (--overwrite_output_dir, or another --output_dir)."
        )
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {spec!r} is not a directory.")
    verdict = verify_checkpoint(path)
    if not verdict.ok:
        previous = _previous_good(path)
        advice = (
            f"The previous intact checkpoint is {previous}: resume from it (or from 'latest', which skips damaged ones)."
            if previous is not None
            else "No earlier checkpoint beside it is intact: start the run afresh."
        )
        raise StorageError(f"--resume_from_checkpoint {spec}: the checkpoint is damaged: {verdict.reason()}. {advice}")
    return path


_ANNOUNCED: set = set()


def _announce(taken: Path, failed: list[Verdict]) -> None:
    """Say once, on the main process, which checkpoint 'latest' took and why the newer ones failed."""
    key = (str(taken), tuple((v.path.name, v.failures) for v in failed))
    if key in _ANNOUNCED or os.environ.get("RANK", "0") != "0":
        return
    _ANNOUNCED.add(key)
    why = "; ".join(f"{v.path.name} failed verification ({v.reason()})" for v in failed)
    print(f"[rlhfkit] resuming from {taken.name}, the newest intact checkpoint: {why}.", file=sys.stderr, flush=True)


def _previous_good(path: Path) -> Path | None:
    """The newest checkpoint beside `path`, older than it, that verifies (or has no manifest)."""
    match = _CHECKPOINT_DIR.match(path.name)
    step = int(match.group(1)) if match else None
    for number, other in reversed(checkpoints(path.parent)):
        if (step is None or number < step) and other.resolve() != path.resolve() and verify_checkpoint(other).ok:
            return other
    return None


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """trainer_state.json of a checkpoint, with a clear CheckpointError when it is missing or unreadable."""
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {STATE_FILE}; a save was probably interrupted). Resume from "
            "an earlier checkpoint-N, or from 'latest', which skips incomplete ones."
        )
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{state_file} is corrupt ({e}). Resume from an earlier checkpoint.") from e
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{state_file} is not an rlhfkit checkpoint (no format_version).")
    if state["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{state_file} has checkpoint format {state['format_version']}; this rlhfkit reads format "
            f"{FORMAT_VERSION}. Resume it with the rlhfkit version that wrote it, or start the run afresh."
        )
    return state


def load_process_state(
    path: str | os.PathLike, state: dict, process_index: int, num_processes: int, engine: str = "DDP"
) -> tuple:
    """(extra, rng) of a checkpoint for this process; a clear CheckpointError when anything is missing or the run
    is launched under another engine (`engine`, as engines.Engine prints it) than the one that wrote it."""
    path = Path(path)
    if state["num_processes"] != num_processes:
        raise CheckpointError(
            f"{path} was written by {state['num_processes']} processes, this run has {num_processes}: resume with "
            f"the same number of processes (each process's data position and random state are in it)."
        )
    written_by = state.get("engine", "DDP")
    if written_by != engine:
        raise CheckpointError(
            f"{path} was written under {written_by}, this run is launched under {engine}: the optimizer state is "
            "kept as the engine sharded it. Resume with the same accelerate config as the checkpointed run."
        )
    state_file = ENGINE_DIR if engine != "DDP" else OPTIMIZER_FILE
    for name in (state_file, EXTRA_FILE, f"rng_state_{process_index}.pt"):
        if not (path / name).exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing. Resume from an earlier checkpoint.")
    try:
        extra = torch.load(path / EXTRA_FILE, weights_only=True)
        rng = torch.load(path / f"rng_state_{process_index}.pt", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        raise CheckpointError(f"{path}: cannot read its state files ({type(e).__name__}: {e}).") from e
    return extra, rng


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    try:
        optimizer.load_state_dict(torch.load(Path(path) / OPTIMIZER_FILE, weights_only=True))
    except Exception as e:
        raise CheckpointError(f"{path}: cannot restore the optimizer ({type(e).__name__}: {e}).") from e


def load_weights(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Copy the weights of a save_pretrained directory into `model` (same architecture; strict).

    Loading through the model class lets transformers handle tied and sharded weights as it wrote them. A peft
    model (--use_peft) loads its adapter's weights only (load_adapter_weights).
    """
    from rlhfkit.models import is_peft_model

    if is_peft_model(model):
        return load_adapter_weights(model, directory)
    dtype = next(model.parameters()).dtype
    try:
        saved = type(model).from_pretrained(str(directory), dtype=dtype)
        model.load_state_dict(saved.state_dict())
    except Exception as e:
        _raise_if_damaged(e, directory)
        raise CheckpointError(
            f"{directory}: cannot load its weights into the model ({type(e).__name__}: {e}). Resume with the same "
            "model as the checkpointed run, from an intact checkpoint."
        ) from e


def _raise_if_damaged(error: Exception, directory: str | os.PathLike) -> None:
    """A weight file safetensors cannot parse is damaged (truncated, overwritten), not another model: say so,
    naming the file (a checkpoint without manifest.json is not verified before it is loaded)."""
    if type(error).__name__ != "SafetensorError":
        return
    files = sorted(Path(directory).glob("*.safetensors"))
    name = files[0] if len(files) == 1 else Path(directory)
    raise StorageError(
        f"{name} is damaged: safetensors cannot read it ({error}); it was probably truncated or overwritten. Resume "
        "from an earlier checkpoint-N (`rlhfkit checkpoints RUN_DIR` lists them and their state)."
    ) from error


def load_adapter_weights(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Copy the adapter a peft model's save_pretrained wrote in `directory` (adapter_model.safetensors: LoRA
    matrices and modules_to_save) into the peft model `model`, whose base weights are untouched. Strict: the file
    must hold exactly the tensors the model's adapter has."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    try:
        saved = load_file(path)
        expected = set(get_peft_model_state_dict(model))
        if set(saved) != expected:
            missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
            raise ValueError(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        set_peft_model_state_dict(model, saved)
    except Exception as e:
        _raise_if_damaged(e, directory)
        raise CheckpointError(
            f"{directory}: cannot load its LoRA adapter into the model ({type(e).__name__}: {e}). Resume with the "
            "same model and LoRA flags (--lora_r, --lora_target_modules, ...) as the checkpointed run."
        ) from e


def save_into(accelerator, path: str, write: Callable[[str], None]) -> None:
    """Write files into the directory `path` (the run directory, which already holds logs): `write(tmp_dir)` on the
    main process, then each written file or folder is moved into `path`, replacing one of the same name. A crash
    mid-write leaves only `path`.tmp behind, never a half-written model in `path`. A failed write (no space left,
    an I/O error) raises StorageError, as save_checkpoint does, with `path`.tmp removed."""
    tmp = path.rstrip("/") + ".tmp"
    target = f"the final model into {path}"

    def save() -> None:
        _check_space(os.path.dirname(os.path.abspath(path)), _model_estimate(path), target, path)
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        follow_umask(tmp)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(tmp):
            target_path = os.path.join(path, name)
            if os.path.isdir(target_path):
                shutil.rmtree(target_path)
            os.replace(os.path.join(tmp, name), target_path)
        os.rmdir(tmp)

    accelerator.wait_for_everyone()
    _together(accelerator, save if accelerator.is_main_process else None, target, tmp, path)
    accelerator.wait_for_everyone()


# ---------------------------------------------------------------------------------------------------------------------
# File modes, manifests and verification
# ---------------------------------------------------------------------------------------------------------------------


def _umask() -> int:
    """This process's umask, read without changing it where Linux tells it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(directory: str | os.PathLike) -> None:
    """Give every file under `directory` the mode a plain open() would (0666 less the umask: 0644 under 022).

    safetensors writes a temporary file (mode 0600) and renames it, so the weights came out 0600 beside 0644 files.
    """
    mode = 0o666 & ~_umask()
    for file in _files(Path(directory)):
        if file.stat().st_mode & 0o777 != mode:
            os.chmod(file, mode)


def _files(root: Path) -> Iterator[Path]:
    """Every file under root, in a fixed order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath, name)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: str | os.PathLike) -> None:
    """Write `directory`/manifest.json: the relative path, size and sha256 of every other file in it.

    Cost: sha256 reads about 1 GB/s on one core (measured on a 2-core CPU box: 256 MiB in 0.27 s); a tiny test
    checkpoint (176 kB, 11 files) takes ~4 ms to write its manifest and ~0.5 ms to verify. A 1B-parameter model in
    fp32 with AdamW writes ~12 GB a checkpoint (4 GB weights, 8 GB optimizer moments), which hashes in ~12 s (bf16
    weights: less): small beside writing those 12 GB and the minutes between checkpoints. Resuming reads the same
    bytes once more to verify them (~12 s, every process of the launch).
    """
    root = Path(directory)
    files = {}
    for file in _files(root):
        name = file.relative_to(root).as_posix()
        if name != MANIFEST_FILE:
            files[name] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    record = {"manifest_version": MANIFEST_VERSION, "algorithm": "sha256", "files": files}
    (root / MANIFEST_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.chmod(root / MANIFEST_FILE, 0o666 & ~_umask())


@dataclass(frozen=True)
class Verdict:
    """What verify_checkpoint found in one checkpoint: `failures`, (file, reason) pairs, empty when every file is
    as the manifest says; `has_manifest` False for a checkpoint written before manifests (accepted unverified)."""

    path: Path
    failures: tuple[tuple[str, str], ...] = ()
    has_manifest: bool = True

    @property
    def ok(self) -> bool:
        return not self.failures

    def reason(self) -> str:
        """The failures as one phrase ("model.safetensors: 512 bytes, ...; optimizer.pt: missing")."""
        shown = [f"{name}: {why}" for name, why in self.failures[:3]]
        more = len(self.failures) - len(shown)
        return "; ".join(shown) + (f"; and {more} more file(s)" if more > 0 else "")

    def __str__(self) -> str:
        if self.failures:
            return f"failed: {self.reason()}"
        return "ok" if self.has_manifest else "no manifest (written before manifests; accepted unverified)"


_VERIFIED: dict[tuple, Verdict] = {}  # verdicts by path and every file's (name, size, mtime): hash a checkpoint once


def verify_checkpoint(path: str | os.PathLike) -> Verdict:
    """Check a checkpoint directory against its manifest.json: every file listed must exist, have its size and its
    sha256. A missing file, a size that differs (truncated, or grown) and a checksum that differs (bytes
    overwritten) each fail, naming the file. Sizes are checked before anything is hashed.

    A checkpoint without manifest.json was written before rlhfkit wrote manifests (or by hand): it is accepted as
    before, unverified (Verdict.has_manifest False); a damaged file in it shows only when it is loaded.
    """
    root = Path(path)
    try:
        key = (str(root.resolve()), tuple((f.as_posix(), *_stamp(f)) for f in _files(root)))
    except OSError:
        key = None
    if key is not None and key in _VERIFIED:
        return _VERIFIED[key]
    verdict = _verify(root)
    if key is not None:
        _VERIFIED[key] = verdict
    return verdict


def _stamp(file: Path) -> tuple[int, int]:
    stat = file.stat()
    return stat.st_size, stat.st_mtime_ns


def _verify(root: Path) -> Verdict:
    manifest = root / MANIFEST_FILE
    if not manifest.is_file():
        return Verdict(root, has_manifest=False)
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        entries = [(str(name), int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return Verdict(root, ((MANIFEST_FILE, f"unreadable ({type(e).__name__}: {e})"),))
    failures, to_hash = [], []
    for name, size, digest in entries:
        file = root / name
        if not file.is_file():
            failures.append((name, "missing"))
            continue
        actual = file.stat().st_size
        if actual < size:
            failures.append((name, f"truncated: {actual} bytes where the manifest says {size}"))
        elif actual > size:
            failures.append((name, f"{actual} bytes where the manifest says {size} (written to after the save)"))
        else:
            to_hash.append((name, file, digest))
    for name, file, digest in to_hash:
        if _sha256(file) != digest:
            failures.append((name, "sha256 differs from the manifest (bytes overwritten or corrupted)"))
    return Verdict(root, tuple(failures))


def checkpoint_table(output_dir: str | os.PathLike) -> list[tuple[str, int | None, str]]:
    """(name, step, state) of every checkpoint-N directory of a run directory, oldest first, for `rlhfkit
    checkpoints`: state is "ok", "failed: FILE: REASON", "no manifest (...)" or "incomplete (...)"."""
    root = Path(output_dir)
    rows = []
    found = sorted((int(m.group(1)), child) for child in root.iterdir() if (m := _CHECKPOINT_DIR.match(child.name)))
    for number, child in found:
        if not (child / STATE_FILE).is_file():
            rows.append((child.name, None, f"incomplete (no {STATE_FILE}: its save did not finish)"))
            continue
        verdict = verify_checkpoint(child)
        try:
            step = int(json.loads((child / STATE_FILE).read_text(encoding="utf-8"))["progress"]["step"])
        except (OSError, ValueError, KeyError, TypeError):
            step = number
        rows.append((child.name, step, str(verdict)))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Storage errors: free space, failed writes
# ---------------------------------------------------------------------------------------------------------------------

_WRITE_FAILURE_MARKS = (
    "inline_container",
    "PytorchStreamWriter",
    "unexpected pos",
    "file write failed",
    "iostream error",  # torch.save's end of file on a full disk: "basic_ios::clear: iostream error"
    "os error",
)
_NO_SPACE_MARKS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
_FULL_BELOW = 64 * 2**20  # after a write failed, this little free space means the disk filled up


def _together(accelerator, step: Callable[[], None] | None, target: str, tmp: str, path: str) -> None:
    """Run `step` (on the processes given one), then let every process learn whether a write failed anywhere: if
    one did, the main process removes `tmp` and every process raises the same StorageError. Errors that are not a
    failed write (a bug) propagate as they are."""
    failure = None
    if step is not None:
        try:
            step()
        except StorageError as e:  # too little space, found before writing
            failure = str(e)
        except Exception as e:
            if not _is_write_failure(e, os.path.dirname(os.path.abspath(path))):
                raise
            failure = _storage_message(target, path, e)
    failures = [failure]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        failures = gather_object([failure])
    failures = [f for f in failures if f]
    if failures:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise StorageError(failures[0])


def _is_write_failure(e: BaseException, directory: str) -> bool:
    """Whether `e` is a write that failed: an OSError, safetensors' SafetensorError, or torch's RuntimeError from
    its zip writer (on a full disk ``[enforce fail at inline_container.cc:672] . unexpected pos ...`` or
    ``basic_ios::clear: iostream error``), or any RuntimeError once the disk is full."""
    if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
        return True
    if not isinstance(e, RuntimeError):
        return False
    if any(mark in str(e) for mark in _WRITE_FAILURE_MARKS):
        return True
    free = _free_bytes(directory)
    return free is not None and free < _FULL_BELOW


def _free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged process may still write on the filesystem of `directory`; None when unknown."""
    try:
        stat = os.statvfs(_existing(directory))
    except (OSError, AttributeError):
        return None
    if stat.f_blocks == 0:  # some network and FUSE filesystems report no sizes at all
        return None
    return stat.f_bavail * stat.f_frsize


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _filesystem(directory: str) -> str:
    """ "/dev/sda1 mounted at /data, 1.2 GB free": where `directory` is stored, as far as it is cheap to tell."""
    mount = os.path.realpath(_existing(directory))
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    device = None
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 1 and fields[1] == mount:
                device = fields[0]  # the last mount on a point is the one in use
    except OSError:
        pass
    free = _free_bytes(directory)
    where = f"{device} mounted at {mount}" if device else f"the filesystem mounted at {mount}"
    return where + (f", {_size(free)} free" if free is not None else "")


def _size(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _checkpoint_estimate(output_dir: str, optimizer: torch.optim.Optimizer | None) -> int:
    """The bytes a new checkpoint will take: the previous checkpoint's, else three times the optimizer's parameters
    (weights and two moments; a lower bound when other models are saved too), else 0 (not checked)."""
    found = checkpoints(output_dir)
    if found:
        return _tree_size(found[-1][1])
    if optimizer is None:
        return 0
    return 3 * sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"])


def _disk_size(file: Path) -> int:
    stat = file.stat()
    return max(stat.st_size, getattr(stat, "st_blocks", 0) * 512)


_STATE_ONLY = (OPTIMIZER_FILE, EXTRA_FILE, STATE_FILE, MANIFEST_FILE, ENGINE_DIR)


def _model_estimate(path: str) -> int:
    """The bytes the final models will take: those of the newest checkpoint in `path`, without its training state."""
    found = checkpoints(path)
    if not found:
        return 0
    directory = found[-1][1]
    return sum(
        _tree_size(child) if child.is_dir() else _disk_size(child)
        for child in directory.iterdir()
        if child.name not in _STATE_ONLY and not child.name.startswith("rng_state_")
    )


def _tree_size(directory: Path) -> int:
    """Bytes the files under `directory` take on disk (whole blocks, where the filesystem says)."""
    try:
        return sum(_disk_size(file) for file in _files(directory))
    except OSError:
        return 0


def _check_space(directory: str, needed: int, target: str, path: str) -> None:
    free = _free_bytes(directory)
    if needed and free is not None and free < needed:
        raise StorageError(_storage_message(target, path, None, needed=needed))


def _storage_message(target: str, path: str, error: BaseException | None, needed: int | None = None) -> str:
    """Why `target` could not be written, and how to go on. error None: too little space, found before writing."""
    directory = os.path.dirname(os.path.abspath(path))
    if error is None:
        no_space = True
    else:
        no_space = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            mark in str(error) for mark in _NO_SPACE_MARKS
        )
        if not no_space and not isinstance(error, OSError):  # torch's zip writer does not say why it failed
            free = _free_bytes(directory)
            no_space = free is not None and free < _FULL_BELOW
    file = getattr(error, "filename", None) or path
    if no_space:
        need = f"; it needs about {_size(needed)}" if needed else ""
        raised = f"; the write raised {type(error).__name__}: {error}" if error is not None else ""
        cause = f"no space left on device ({file} is on {_filesystem(directory)}{need}{raised})"
    else:
        cause = f"{type(error).__name__}: {error}"
        if getattr(error, "filename", None):
            cause = f"{file}: {cause}"
    if error is None:
        head = f"Not writing {target}: {cause}."
    else:
        head = f"Could not write {target}: {cause}."
    output_dir = directory if target.startswith("the checkpoint") else os.path.abspath(path)
    previous = [p for _, p in checkpoints(output_dir) if os.path.abspath(p) != os.path.abspath(path)]
    fix = "free some space" if no_space else "fix the cause"
    if previous:
        kept = f"The previous checkpoint {previous[-1]} is intact; {fix}, then continue"
        if target.startswith("the final model"):
            kept = f"The final checkpoint {previous[-1]} holds the trained state; {fix}, then write the model"
        return f"{head} {kept} with the same command plus --output_dir {output_dir} --resume_from_checkpoint latest."
    return f"{head} No checkpoint of this run is complete yet; {fix}, then start the run again."
