"""Checkpoints that resume a run exactly, written atomically.

``layout`` names every file of a checkpoint directory and finds a run's checkpoints; ``save`` writes a checkpoint
(and the final model) atomically and prunes old ones; ``load`` picks the checkpoint to resume and reads it back;
``integrity`` gives every file the umask's mode and writes and verifies the manifest of sizes and sha256s;
``storage`` checks free space before a write and turns a failed write into one StorageError; ``rng`` carries every
library's RNG state. Import from the package: it re-exports what the rest of rlhfkit uses.
"""

from rlhfkit.checkpoint.integrity import (
    MANIFEST_VERSION,
    Verdict,
    checkpoint_table,
    follow_umask,
    verify_checkpoint,
    write_manifest,
)
from rlhfkit.checkpoint.layout import (
    ENGINE_DIR,
    EXTRA_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    OPTIMIZER_FILE,
    REF_MODEL_DIR,
    STATE_FILE,
    VALUE_MODEL_DIR,
    checkpoint_path,
    checkpoints,
)
from rlhfkit.checkpoint.load import (
    load_adapter_weights,
    load_optimizer,
    load_process_state,
    load_weights,
    read_state,
    resolve_checkpoint,
)
from rlhfkit.checkpoint.rng import rng_state, set_rng_state
from rlhfkit.checkpoint.save import prune_checkpoints, save_checkpoint, save_into

__all__ = [
    "ENGINE_DIR",
    "EXTRA_FILE",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MANIFEST_VERSION",
    "OPTIMIZER_FILE",
    "REF_MODEL_DIR",
    "STATE_FILE",
    "VALUE_MODEL_DIR",
    "Verdict",
    "checkpoint_path",
    "checkpoint_table",
    "checkpoints",
    "follow_umask",
    "load_adapter_weights",
    "load_optimizer",
    "load_process_state",
    "load_weights",
    "prune_checkpoints",
    "read_state",
    "resolve_checkpoint",
    "rng_state",
    "save_checkpoint",
    "save_into",
    "set_rng_state",
    "verify_checkpoint",
    "write_manifest",
]
