"""A run pushed to the Hugging Face Hub, read by its repo id: ``rlhfkit doctor ORG/NAME [--revision R]``.

Only the run's ``trainer_state.json`` files are fetched (``snapshot_download`` with allow_patterns: the one at the
repo's root and those in ``checkpoint-*/``), into the usual hub cache; the root one is read, else the newest
checkpoint's (trainer_state.py). A model repo is tried first, then a dataset repo of the same id. With
HF_HUB_OFFLINE set, only what the cache holds already is read (``local_files_only``): nothing is downloaded.

huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE when it is imported, into ``huggingface_hub.constants``;
they are read from there at each call, so a test may point them elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlhfkit.health.rows import Source
from rlhfkit.health.trainer_state import STATE_FILE, find_state_file, read_state_file

PATTERNS = [STATE_FILE, f"checkpoint-*/{STATE_FILE}"]
REPO_TYPES = ("model", "dataset")
# ORG/NAME as the Hub spells ids: letters, digits, "-", "_", "."; no "--" or ".." (huggingface_hub's validate_repo_id).
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def looks_like_repo_id(text: str) -> bool:
    """Whether `text` reads as a Hub repo id ORG/NAME (the caller has checked it is no local path)."""
    return bool(REPO_ID.fullmatch(text)) and "--" not in text and ".." not in text and not text.endswith(".")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def hub_snapshot(repo_id: str, revision: str | None = None) -> tuple[Path, str]:
    """The local snapshot folder of `repo_id` at `revision` holding its trainer_state.json files (downloaded unless
    HF_HUB_OFFLINE is set), and the repo type it was found as. ValueError with one line saying why there is none
    and what to do."""
    from huggingface_hub import constants, snapshot_download

    offline = constants.HF_HUB_OFFLINE
    reasons, cached_without_state = [], []
    for repo_type in REPO_TYPES:
        try:
            folder = snapshot_download(
                repo_id, repo_type=repo_type, revision=revision, allow_patterns=PATTERNS, local_files_only=offline
            )
        except (OSError, ValueError) as e:  # huggingface_hub's errors: not cached, not found, gated, no network
            reasons.append(f"{repo_type}: {_first_line(e)}")
            continue
        if find_state_file(Path(folder)) is not None:
            return Path(folder), repo_type
        cached_without_state.append(f"{repo_type} repo at {folder}")
    at = f" at revision {revision!r}" if revision else ""
    if cached_without_state:
        fetch = " (HF_HUB_OFFLINE is set: go online once to fetch it)" if offline else ""
        raise ValueError(
            f"Hub repo {repo_id!r}{at} holds no {STATE_FILE} at its root or in a checkpoint-*/ "
            f"({'; '.join(cached_without_state)}){fetch}: pass a repo or local path with a transformers checkpoint"
        )
    if offline:
        raise ValueError(
            f"{repo_id!r} is no local path, and as a Hub repo id{at} it is not in the local cache "
            f"({constants.HF_HUB_CACHE}) while HF_HUB_OFFLINE is set: run once online (HF_HUB_OFFLINE unset) to "
            f"download its {STATE_FILE}, or pass the local path of the run"
        )
    raise ValueError(
        f"{repo_id!r} is no local path, and no Hub repo of that id{at} could be read ({'; '.join(reasons)}): check "
        "the path or the repo id (a private repo needs `hf auth login`)"
    )


def read_hub(repo_id: str, revision: str | None = None) -> Source:
    """The rows of the trainer_state.json of Hub repo `repo_id` at `revision` (module docstring)."""
    folder, repo_type = hub_snapshot(repo_id, revision)
    state_file, note = find_state_file(folder)
    inside = state_file.relative_to(folder).as_posix()
    at = f"revision {revision}, " if revision else ""
    description = f"Hub {repo_type} repo {repo_id} ({at}commit {folder.name[:12]}): {inside}"
    return read_state_file(state_file, description, [note] if note else [])
