"""Hub ids without a hub: tiny stand-in models and datasets placed in the caches' own layouts, so that
`from_pretrained("ORG/NAME")` and `load_dataset("ORG/NAME")` load them under HF_HUB_OFFLINE=1 as they would load
the real ones after a first download (DESIGN.md section 8).

    models:   $HF_HUB_CACHE/models--ORG--NAME/snapshots/<revision>/{config.json, model.safetensors, ...}
              $HF_HUB_CACHE/models--ORG--NAME/refs/main        (the revision "main" points at)
    datasets: $HF_DATASETS_CACHE/ORG___name/default/0.0.0/<revision>/{dataset_info.json, name-<split>.arrow}
              (name: NAME in snake case, as datasets writes it: DeepMath-103K -> deep_math-103_k)

The cache paths are read when huggingface_hub and datasets are imported, so code that loads from such a cache runs
in a subprocess whose environment points at it (see `offline_env`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

# A chat template that the character-level tokenizer of the built-in task can spell.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
REVISION = "0123456789abcdef0123456789abcdef01234567"


def offline_env(hub_cache: Path, datasets_cache: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that sees only these caches and no network."""
    return dict(
        os.environ,
        HF_HUB_CACHE=str(hub_cache),
        HF_DATASETS_CACHE=str(datasets_cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        **extra,
    )


def cache_model(hub_cache: Path, repo_id: str, saved: Path, revision: str = REVISION) -> None:
    """Put a save_pretrained directory into the hub cache as `repo_id` at `revision` (the "main" branch)."""
    org, name = repo_id.split("/")
    repo = hub_cache / f"models--{org}--{name}"
    shutil.copytree(saved, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)


def cache_dataset(datasets_cache: Path, repo_id: str, splits: dict[str, list[dict]], scratch: Path) -> None:
    """Put rows into the datasets cache as the hub dataset `repo_id`: built once from JSON files by the json
    builder, then moved to where a first online load_dataset("ORG/NAME") leaves them."""
    from datasets import load_dataset
    from datasets.naming import camelcase_to_snakecase

    org, name = repo_id.split("/")
    name = camelcase_to_snakecase(name)  # as datasets names the cache: DeepMath-103K -> deep_math-103_k
    scratch = scratch / f"{org}___{name}"
    scratch.mkdir(parents=True)
    files = {}
    for split, rows in splits.items():
        files[split] = scratch / f"{name}-{split}.jsonl"
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    load_dataset("json", data_files={k: str(v) for k, v in files.items()}, cache_dir=str(scratch / "built"))
    (built,) = [p for p in (scratch / "built" / "json").glob("*/0.0.0/*") if p.is_dir()]
    target = datasets_cache / f"{org}___{name}" / "default" / "0.0.0" / REVISION
    target.mkdir(parents=True)
    shutil.copy(built / "dataset_info.json", target)
    for split in splits:
        shutil.copy(built / f"json-{split}.arrow", target / f"{name}-{split}.arrow")
