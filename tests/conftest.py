"""Shared fixtures: an offline environment and the built-in task's assets built once per session (test preset)."""

import os

import pytest

# Nothing in the tests may reach the network or the user's real tracker stores.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The perf/ metrics a run logs depend on these; the tests that want them set them (monkeypatch).
os.environ.pop("RLHFKIT_PEAK_TFLOPS", None)
os.environ.pop("RLHFKIT_PHASE_MEMORY", None)


@pytest.fixture(scope="session", autouse=True)
def _isolated_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    os.environ["TRACKIO_DIR"] = str(root / "trackio")
    os.environ["RLHFKIT_CACHE"] = str(root / "rlhfkit-cache")
    yield


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """Tokenizer, SFT model, reward model, prompts and task.json of the built-in task (fast 'test' preset)."""
    from rlhfkit.tasks import build_tiny

    out = tmp_path_factory.mktemp("assets") / "tiny"
    build_tiny(str(out), seed=0, preset="test", log=lambda *a, **k: None)
    return out


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache in tmp_path, offline: huggingface_hub's constants (and the variables) point at it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache
