"""Every library's RNG state as plain data, which ``torch.load(weights_only=True)`` reads back: a resumed run samples
exactly what the uninterrupted run would have."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


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
