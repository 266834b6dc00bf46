"""Pool metric values over micro-batches, PPO epochs, steps and processes, exactly.

A trainer adds raw sums and counts while it works and calls :meth:`MetricAccumulator.reduce` once per
logged row. Every mean is formed once, from global sums and global counts, so splitting a batch into
micro-batches or across processes cannot change a logged number (averaging per-micro-batch means
would weight a micro-batch with 3 tokens like one with 300).

    acc = MetricAccumulator()
    acc.add_tensor(M.VAL_RATIO, ratio, mask)        # pooled token mean
    acc.add_tensor(M.VAL_RATIO_VAR, ratio, mask)    # pooled token variance
    acc.add(M.VAL_NUM_EOS_TOKENS, has_eos.sum())    # summed over processes
    reduced = acc.reduce(accelerator)               # collective: every process must call it
    logger.log({**reduced.scalars, M.LR.name: lr}, step)

Metrics with the "last" reduction (the learning rate, say) are not pooled: the trainer puts the main
process's value at the logged step into the row itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from rlhfkit.metrics.registry import REGISTRY, Metric, is_template

_METHOD_FOR = {
    "mean": "add",
    "sum": "add",
    "var": "add_moments",
    "std": "add_moments",
    "min": "add_extreme",
    "max": "add_extreme",
    "histogram": "add_values",
}


class Reduced(NamedTuple):
    """Result of :meth:`MetricAccumulator.reduce`.

    scalars: metric name -> value, in registry order, for every scalar metric added since the last reduce.
    histograms: metric name -> 1-D float64 array of the raw values from all processes.
    """

    scalars: dict[str, float]
    histograms: dict[str, np.ndarray]


def _as_sum(x: Any) -> float | torch.Tensor:
    """Sum of `x` as a float64 scalar; tensors stay on their device (no host sync per add)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).sum()
    if isinstance(x, np.ndarray):
        return float(x.astype(np.float64).sum())
    return float(x)


def _finalize(reduction: str, total: float, count: float, total_sq: float) -> float:
    """Turn pooled sums into the logged value; empty pools give 0 (never NaN)."""
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / count if count > 0 else 0.0
    # Unbiased pooled variance; n < 2 has no spread to report.
    if count < 2:
        var = 0.0
    else:
        var = max((total_sq - total * total / count) / (count - 1), 0.0)  # clamp rounding below 0
    return var if reduction == "var" else math.sqrt(var)


class MetricAccumulator:
    """Collects registered metrics for one update and reduces them exactly across processes.

    Each method accepts only the reductions it can pool (``add`` for "mean"/"sum", ``add_moments``
    for "var"/"std", ``add_extreme`` for "min"/"max", ``add_values`` for "histogram");
    :meth:`add_tensor` picks the right one from the metric's declared reduction. "last" metrics are
    not pooled at all (see the module docstring).
    Values may be Python numbers, NumPy arrays or tensors of any shape (summed).
    """

    def __init__(self, extra_metrics: Sequence[Metric] = ()) -> None:
        """extra_metrics: concrete metrics outside the registry, i.e. template expansions such as
        ``expand(REWARDS_FUNC_MEAN, "correctness")``; every process must pass the same list."""
        known = [m for m in REGISTRY.values() if not is_template(m)] + list(extra_metrics)
        self._known: dict[str, Metric] = {m.name: m for m in known}
        if len(self._known) != len(known):
            raise ValueError("extra_metrics repeat a name already known to the accumulator")
        # Fixed layouts, identical on every process because they come from the registry's declaration order
        # (plus the same extra metrics). Collectives then exchange one vector per kind of statistic, with no
        # per-metric handshakes and no assumption that every process added the same metrics.
        self._layout_pooled = [m.name for m in known if m.reduction in ("mean", "sum", "var", "std")]
        self._layout_extreme = [m.name for m in known if m.reduction in ("min", "max")]
        self._layout_histogram = [m.name for m in known if m.reduction == "histogram"]
        self._pooled: dict[str, list] = {}  # name -> [total, count, total_sq]
        self._extreme: dict[str, float | None] = {}  # None: added, but only empty selections (the value is 0)
        self._values: dict[str, list[torch.Tensor]] = {}

    # ------------------------------------------------------------------------------------------
    # Adding values
    # ------------------------------------------------------------------------------------------

    def _check(self, metric: Metric, allowed: tuple[str, ...], method: str) -> str:
        if not isinstance(metric, Metric):
            raise TypeError(f"expected a registered Metric constant (rlhfkit.metrics.registry), got {metric!r}")
        if self._known.get(metric.name) != metric:
            raise KeyError(
                f"metric {metric.name!r} is not in rlhfkit.metrics.registry.REGISTRY (nor an expanded template "
                "given as extra_metrics); declare it there first"
            )
        if metric.reduction not in allowed:
            fix = (
                f"use {_METHOD_FOR[metric.reduction]}()"
                if metric.reduction in _METHOD_FOR
                else "put its value into the logged row instead (a 'last' metric is not pooled)"
            )
            raise ValueError(
                f"{metric.name} has reduction {metric.reduction!r}, which {method}() does not handle; {fix}"
            )
        return metric.name

    def _pool(self, name: str, total: Any, count: Any, total_sq: Any) -> None:
        slot = self._pooled.setdefault(name, [0.0, 0.0, 0.0])
        slot[0] = slot[0] + _as_sum(total)
        slot[1] = slot[1] + _as_sum(count)
        slot[2] = slot[2] + _as_sum(total_sq)

    def add(self, metric: Metric, total: Any, count: Any = 1) -> None:
        """Pool `total` (a sum of values) and `count` (how many values) for a "mean" or "sum" metric.

        "mean" logs sum(total) / sum(count) over all adds and processes; "sum" logs sum(total).
        """
        name = self._check(metric, ("mean", "sum"), "add")
        self._pool(name, total, count, 0.0)

    def add_moments(self, metric: Metric, total: Any, total_sq: Any, count: Any) -> None:
        """Pool sum, sum of squares and count for a "var" or "std" metric.

        Pass float64 sums for large counts: the pooled variance subtracts two large numbers.
        """
        name = self._check(metric, ("var", "std"), "add_moments")
        self._pool(name, total, count, total_sq)

    def add_extreme(self, metric: Metric, value: Any) -> None:
        """Fold `value` (a number or a tensor/array of any shape) into a "min" or "max" metric.

        An empty tensor/array still counts as added: if nothing else is added before the reduce, the metric is
        logged as 0, like an empty mean (e.g. the shortest terminated completion when none terminated)."""
        name = self._check(metric, ("min", "max"), "add_extreme")
        pick = min if metric.reduction == "min" else max
        if isinstance(value, (torch.Tensor, np.ndarray)):
            if np.size(value) == 0 if isinstance(value, np.ndarray) else value.numel() == 0:
                self._extreme.setdefault(name, None)
                return
            value = value.min() if metric.reduction == "min" else value.max()
        value = float(value)
        current = self._extreme.get(name)
        self._extreme[name] = value if current is None else pick(current, value)

    def add_values(self, metric: Metric, values: Any) -> None:
        """Collect raw values (any shape, flattened) for a "histogram" metric."""
        name = self._check(metric, ("histogram",), "add_values")
        tensor = torch.as_tensor(values).detach().reshape(-1).to(torch.float64)
        self._values.setdefault(name, []).append(tensor)

    def add_tensor(self, metric: Metric, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add the entries of `x` where `mask` is True, pooled as the metric's reduction says.

        x: any shape (e.g. (B, T) per-token values or (B,) per-sequence values).
        mask: bool, same shape as x, True = counts; None counts every entry.
        "mean" -> pooled mean of the entries, "sum" -> their sum, "var"/"std" -> pooled moments
        (computed in float64), "min"/"max" -> extreme entry, "histogram" -> the entries themselves.
        """
        self._check(metric, ("mean", "sum", "var", "std", "min", "max", "histogram"), "add_tensor")
        reduction = metric.reduction
        x = x.detach()
        if reduction in ("min", "max", "histogram"):
            selected = x[mask] if mask is not None else x
            if reduction == "histogram":
                self.add_values(metric, selected)
            else:
                self.add_extreme(metric, selected)
            return
        # torch.where instead of x[mask]: no host sync, and NaN at masked-out positions cannot leak in.
        x64 = x.to(torch.float64)
        if mask is None:
            count = x.numel()
        else:
            x64 = torch.where(mask, x64, torch.zeros((), dtype=torch.float64, device=x.device))
            count = mask.sum()
        if reduction == "mean":
            self.add(metric, x64.sum(), count)
        elif reduction == "sum":
            self.add(metric, x64.sum())
        else:
            self.add_moments(metric, x64.sum(), (x64 * x64).sum(), count)

    # ------------------------------------------------------------------------------------------
    # Reducing
    # ------------------------------------------------------------------------------------------

    def reduce(self, accelerator: Any = None) -> Reduced:
        """Reduce everything added since the last call, then clear.

        With an accelerator running more than one process this is a collective (every process must
        call it): one all-reduce(sum) of all pooled sums, counts and histogram sizes, one all-reduce(max)
        if any min/max metric was added anywhere, and one all-gather if any histogram has values. Every
        process gets the same scalars and histograms.
        """
        num_processes = getattr(accelerator, "num_processes", 1) if accelerator is not None else 1
        if num_processes > 1:
            scalars, histograms = self._reduce_distributed(accelerator, num_processes)
        else:
            scalars, histograms = self._reduce_local()
        scalars = {name: scalars[name] for name in self._known if name in scalars}  # registry order
        self.clear()
        return Reduced(scalars, histograms)

    def state_dict(self) -> dict[str, Any]:
        """What has been added since the last reduce, as plain numbers and tensors (for checkpoints: a logging
        window may span a checkpoint)."""
        return {
            "pooled": {name: [float(v) for v in slot] for name, slot in self._pooled.items()},
            "extreme": dict(self._extreme),
            "values": {name: torch.cat([p.cpu() for p in parts]) for name, parts in self._values.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clear()
        self._pooled.update({name: list(slot) for name, slot in state["pooled"].items()})
        self._extreme.update(state["extreme"])
        self._values.update({name: [values] for name, values in state["values"].items()})

    def clear(self) -> None:
        """Drop everything added since the last reduce (reduce() calls this itself)."""
        self._pooled.clear()
        self._extreme.clear()
        self._values.clear()

    def _reduce_local(self) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        scalars = {}
        for name, (total, count, total_sq) in self._pooled.items():
            scalars[name] = _finalize(self._known[name].reduction, float(total), float(count), float(total_sq))
        scalars.update({name: 0.0 if value is None else value for name, value in self._extreme.items()})
        histograms = {
            name: torch.cat([p.cpu() for p in self._values[name]]).numpy()
            for name in self._layout_histogram
            if name in self._values
        }
        return scalars, histograms

    def _reduce_distributed(self, accelerator: Any, num_processes: int) -> tuple[dict, dict]:
        device = accelerator.device
        rank = accelerator.process_index
        f64 = dict(dtype=torch.float64, device=device)

        # 1. One vector of sums: per pooled metric [present, total, count, total_sq]; per extreme metric
        #    [present, has a value]; per histogram metric one length slot per process (only ours is filled).
        n_pooled, n_extreme = 4 * len(self._layout_pooled), 2 * len(self._layout_extreme)
        sums = torch.zeros(n_pooled + n_extreme + len(self._layout_histogram) * num_processes, **f64)
        for i, name in enumerate(self._layout_pooled):
            if name in self._pooled:
                total, count, total_sq = self._pooled[name]
                sums[4 * i] = 1.0
                sums[4 * i + 1] = torch.as_tensor(total, **f64)
                sums[4 * i + 2] = torch.as_tensor(count, **f64)
                sums[4 * i + 3] = torch.as_tensor(total_sq, **f64)
        for i, name in enumerate(self._layout_extreme):
            sums[n_pooled + 2 * i] = float(name in self._extreme)
            sums[n_pooled + 2 * i + 1] = float(self._extreme.get(name) is not None)
        local_values = [
            torch.cat([p.to(device) for p in self._values[name]]) if name in self._values else None
            for name in self._layout_histogram
        ]
        for i, values in enumerate(local_values):
            sums[n_pooled + n_extreme + i * num_processes + rank] = 0 if values is None else values.numel()
        sums = accelerator.reduce(sums, "sum").cpu()

        scalars: dict[str, float] = {}
        for i, name in enumerate(self._layout_pooled):
            present, total, count, total_sq = sums[4 * i : 4 * i + 4].tolist()
            if present:
                scalars[name] = _finalize(self._known[name].reduction, total, count, total_sq)

        # 2. Extremes in one all-reduce(max); a min is the max of the negated values.
        flags = sums[n_pooled : n_pooled + n_extreme].view(-1, 2).tolist()  # [present, has a value] per metric
        if any(present for present, _ in flags):
            signs = [1.0 if self._known[name].reduction == "max" else -1.0 for name in self._layout_extreme]
            local = [self._extreme.get(name) for name in self._layout_extreme]
            local = torch.tensor([-math.inf if v is None else sign * v for sign, v in zip(signs, local)], **f64)
            best = accelerator.reduce(local, "max").cpu().tolist()
            for sign, name, value, (present, valued) in zip(signs, self._layout_extreme, best, flags):
                if present:
                    scalars[name] = sign * value if valued else 0.0

        # 3. Histogram values in one all-gather: each process sends its values of all histogram metrics
        #    back to back, padded to the longest process's length; the exchanged lengths unpack them.
        lengths = sums[n_pooled + n_extreme :].view(len(self._layout_histogram), num_processes).long()  # (H, P)
        histograms: dict[str, np.ndarray] = {}
        if lengths.sum() > 0:
            width = int(lengths.sum(dim=0).max())
            flat = torch.cat([v for v in local_values if v is not None] + [torch.zeros(0, **f64)])
            padded = torch.cat([flat, torch.zeros(width - flat.numel(), **f64)])
            gathered = accelerator.gather(padded).cpu().view(num_processes, width)
            offsets = [0] * num_processes
            for i, name in enumerate(self._layout_histogram):
                if lengths[i].sum() == 0:
                    continue
                parts = []
                for r in range(num_processes):
                    n = int(lengths[i, r])
                    parts.append(gathered[r, offsets[r] : offsets[r] + n])
                    offsets[r] += n
                histograms[name] = torch.cat(parts).numpy()
        return scalars, histograms
