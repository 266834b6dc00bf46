"""Metric definitions (the registry) and their exact pooling across micro-batches and processes.

Names are resolved on first use: `rlhfkit.metrics.registry` is stdlib-only and stays importable without loading torch
for the accumulator. docs.py renders the registry into docs/metrics.md.
"""

import importlib

_EXPORTS = {
    "ALIASES": "registry",
    "REGISTRY": "registry",
    "Metric": "registry",
    "metrics_for": "registry",
    "render_markdown": "docs",
    "older_names": "registry",
    "MetricAccumulator": "accumulate",
    "Reduced": "accumulate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlhfkit.metrics.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlhfkit.metrics' has no attribute {name!r}")
