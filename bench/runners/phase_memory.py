"""Peak resident memory per phase of a training step, exactly, from the kernel (Linux; standard library and torch).

Phases are marked by wrapping the trainer's functions (``PhaseMemory.wrap``); they nest. At every boundary (a phase
entered or left) the process's high-water mark (``VmHWM`` of /proc/self/status) is read and credited to the phase
that was innermost since the last boundary, then reset to the current RSS (``echo 5 > /proc/self/clear_refs``). So
every byte of every transient peak lands in exactly one innermost phase, with no sampling thread to miss a
short-lived tensor; a phase's peak is the largest of its own segments and its children's peaks.

Resetting the high-water mark also resets what the kernel reports as the process's ``ru_maxrss``: a profiled run
reports its peak itself (``PhaseMemory.peak_mb``), and its total peak is comparable to an unprofiled run's.

``saved_tensors(label)`` additionally records what autograd saves for backward inside a block: every distinct
storage of at least ``min_mb`` MB, with its shape and dtype (a (B, T, V) logits tensor is recognisable by its shape).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable

_STATUS = "/proc/self/status"


def _status_kb(field: str) -> int:
    with open(_STATUS) as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024


def hwm_mb() -> float:
    return _status_kb("VmHWM") / 1024


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PhaseMemory:
    def __init__(self) -> None:
        self.stack: list[dict] = []
        self.records: list[dict] = []  # one per phase call, in order of entry: label, depth, rss at entry/exit, peak
        self.peak_mb = 0.0  # the whole profiled span's peak
        self.enabled = False
        self.saved: dict[str, dict] = {}

    # -- boundaries -------------------------------------------------------------------------------------------
    def _boundary(self) -> float:
        peak = hwm_mb()
        self.peak_mb = max(self.peak_mb, peak)
        if self.stack:
            self.stack[-1]["peak_mb"] = max(self.stack[-1]["peak_mb"], peak)
        reset_hwm()
        return rss_mb()

    def start(self) -> None:
        reset_hwm()
        self.enabled = True

    def stop(self) -> None:
        self._boundary()
        self.enabled = False

    def enter(self, label: str) -> None:
        rss = self._boundary()
        record = {"label": label, "depth": len(self.stack), "rss_in_mb": rss, "peak_mb": rss}
        record["path"] = "/".join([r["label"] for r in self.stack] + [label])
        self.stack.append(record)
        self.records.append(record)

    def exit(self) -> None:
        rss = self._boundary()
        record = self.stack.pop()
        record["rss_out_mb"] = rss
        if self.stack:
            self.stack[-1]["peak_mb"] = max(self.stack[-1]["peak_mb"], record["peak_mb"])

    @contextlib.contextmanager
    def phase(self, label: str):
        if not self.enabled:
            yield
            return
        self.enter(label)
        try:
            yield
        finally:
            self.exit()

    def current(self) -> list[str]:
        return [r["label"] for r in self.stack]

    def wrap(self, fn: Callable, label: str | Callable[..., str | None]) -> Callable:
        """fn inside a phase; `label` may be a function of the call's arguments (None: no phase for this call)."""
        memory = self

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            name = label(*args, **kwargs) if callable(label) else label
            if not memory.enabled or name is None:
                return fn(*args, **kwargs)
            with memory.phase(name):
                return fn(*args, **kwargs)

        wrapped.__wrapped_by_phase_memory__ = fn
        return wrapped

    def patch(self, owner, name: str, label) -> None:
        setattr(owner, name, self.wrap(getattr(owner, name), label))

    # -- what autograd keeps ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def saved_tensors(self, label: str, min_mb: float = 16.0):
        """Record the distinct storages autograd saves for backward inside the block (>= min_mb each, and the total
        of all), under `label`."""
        import torch

        entry = self.saved.setdefault(label, {"storages": {}, "total_mb": 0.0})
        seen = entry["storages"]

        def pack(t):
            try:
                storage = t.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
            except (RuntimeError, NotImplementedError):
                return t
            if key not in seen:
                mb = storage.nbytes() / 2**20
                seen[key] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "mb": mb}
                entry["total_mb"] += mb
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def saved_summary(self, min_mb: float = 16.0) -> dict:
        out = {}
        for label, entry in self.saved.items():
            big = sorted((s for s in entry["storages"].values() if s["mb"] >= min_mb), key=lambda s: -s["mb"])
            out[label] = {"total_mb": round(entry["total_mb"], 1), "largest": big[:12]}
        return out

    # -- report -----------------------------------------------------------------------------------------------
    def summary(self) -> list[dict]:
        """Per phase path (calls merged): calls, the largest peak, RSS at the first entry and at the last exit."""
        merged: dict[str, dict] = {}
        for r in self.records:
            m = merged.setdefault(
                r["path"],
                {"path": r["path"], "label": r["label"], "depth": r["depth"], "calls": 0, "peak_mb": 0.0,
                 "rss_in_mb": r["rss_in_mb"]},
            )  # fmt: skip
            m["calls"] += 1
            m["peak_mb"] = max(m["peak_mb"], r["peak_mb"])
            m["rss_out_mb"] = r.get("rss_out_mb", float("nan"))
        return [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in m.items()} for m in merged.values()]
