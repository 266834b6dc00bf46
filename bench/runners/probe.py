"""Phase timing by instrumentation, identical for every library (imports torch and transformers only).

Installed by each runner before the trainer is built, and enabled only around ``trainer.train()``:

* generation   wall time inside the outermost ``GenerationMixin.generate`` call, or inside the library's own
               generation function where it has one that bypasses ``generate`` (rlhfkit: ``rlhfkit.sampling.generate``,
               wrapped by its runner); all decoding forwards included. Generated tokens = rows x new positions of
               every call (the compute, padding after an early stop included).
* scoring      outermost ``PreTrainedModel`` forwards run with gradients disabled, outside ``generate``: rollout
               log-probs, reference, value and reward-model forwards (evaluation is off on both sides).
* optimisation outermost ``PreTrainedModel`` forwards with gradients enabled, ``torch.autograd.backward``,
               ``torch.nn.utils.clip_grad_norm_`` and ``Optimizer.step`` (global step hooks).
* other        train wall time minus the three above: loss and advantage math, reward functions, decoding,
               metrics and logging, data loading, the trainer's own bookkeeping.

"Outermost" means a model call made while no other timed model call or ``generate`` is running, so nested
modules (LlamaForCausalLM -> LlamaModel) are counted once. The wrappers add a few microseconds per call, the same
on both sides. On CUDA every boundary synchronises the device so that wall times are attributed to the right phase.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict

PHASES = ("generation", "scoring", "optimization")


class Probe:
    def __init__(self) -> None:
        self.enabled = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu_seconds: dict[str, float] = defaultdict(float)  # process CPU time (all threads), same phases
        self.calls: dict[str, int] = defaultdict(int)
        self.generated_tokens = 0
        self.generated_sequences = 0
        self._busy = 0  # > 0 while inside a timed call (generate or an outermost model forward)
        self._sync = None

    # -- timing helpers ---------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def _timed(self, phase: str, fn, *args, _part: str | None = None, **kwargs):
        """Run fn, adding its wall time to `phase` (and to `phase/part`, a breakdown that does not change totals)."""
        self._busy += 1
        t0, c0 = self._now(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = self._now() - t0
            self.seconds[phase] += dt
            self.cpu_seconds[phase] += time.process_time() - c0
            key = f"{phase}/{_part}" if _part else phase
            if _part:
                self.seconds[key] += dt
            self.calls[key] += 1
            self._busy -= 1

    # -- installation -----------------------------------------------------------------------------------------
    def install(self) -> Probe:
        import torch
        from transformers import PreTrainedModel
        from transformers.generation.utils import GenerationMixin

        if torch.cuda.is_available():
            self._sync = torch.cuda.synchronize
        probe = self

        original_generate = GenerationMixin.generate

        @functools.wraps(original_generate)
        def generate(model, *args, **kwargs):
            if not probe.enabled or probe._busy:
                return original_generate(model, *args, **kwargs)
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            out = probe._timed("generation", original_generate, model, *args, **kwargs)
            sequences = out if torch.is_tensor(out) else out.sequences
            prompt_width = input_ids.shape[1] if input_ids is not None else 0
            probe.generated_sequences += sequences.shape[0]
            probe.generated_tokens += sequences.shape[0] * (sequences.shape[1] - prompt_width)
            return out

        GenerationMixin.generate = generate

        original_call = torch.nn.Module.__call__

        def call(module, *args, **kwargs):
            if not probe.enabled or probe._busy:
                return original_call(module, *args, **kwargs)
            if torch.is_grad_enabled():
                return probe._timed("optimization", original_call, module, *args, _part="forward", **kwargs)
            return probe._timed("scoring", original_call, module, *args, **kwargs)

        PreTrainedModel.__call__ = call

        original_backward = torch.autograd.backward

        @functools.wraps(original_backward)
        def backward(*args, **kwargs):
            if not probe.enabled or probe._busy:
                return original_backward(*args, **kwargs)
            return probe._timed("optimization", original_backward, *args, _part="backward", **kwargs)

        torch.autograd.backward = backward

        original_clip = torch.nn.utils.clip_grad_norm_

        @functools.wraps(original_clip)
        def clip_grad_norm_(*args, **kwargs):
            if not probe.enabled or probe._busy:
                return original_clip(*args, **kwargs)
            return probe._timed("optimization", original_clip, *args, _part="clip_grad_norm", **kwargs)

        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_

        step_start: list[float] = []

        def pre_hook(optimizer, args, kwargs):
            if probe.enabled and not probe._busy:
                probe._busy += 1
                step_start.append((probe._now(), time.process_time()))

        def post_hook(optimizer, args, kwargs):
            if step_start:
                t0, c0 = step_start.pop()
                dt = probe._now() - t0
                probe.seconds["optimization"] += dt
                probe.cpu_seconds["optimization"] += time.process_time() - c0
                probe.seconds["optimization/optimizer_step"] += dt
                probe.calls["optimization/optimizer_step"] += 1
                probe._busy -= 1

        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(pre_hook)
        register_optimizer_step_post_hook(post_hook)
        return self

    def wrap_generation(self, fn, count_tokens):
        """``fn`` timed as generation (for a library's own decoding loop that bypasses ``generate``);
        ``count_tokens(output) -> (rows, new tokens per row)``."""
        probe = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not probe.enabled or probe._busy:
                return fn(*args, **kwargs)
            out = probe._timed("generation", fn, *args, **kwargs)
            rows, new = count_tokens(out)
            probe.generated_sequences += rows
            probe.generated_tokens += rows * new
            return out

        return wrapper

    # -- results ----------------------------------------------------------------------------------------------
    def summary(self, train_seconds: float, train_cpu_seconds: float | None = None) -> dict:
        phases = {p: round(self.seconds.get(p, 0.0), 4) for p in PHASES}
        phases["other"] = round(train_seconds - sum(phases.values()), 4)
        cpu = {p: round(self.cpu_seconds.get(p, 0.0), 4) for p in PHASES}
        if train_cpu_seconds is not None:
            cpu["other"] = round(train_cpu_seconds - sum(cpu.values()), 4)
        parts = {k: round(v, 4) for k, v in self.seconds.items() if "/" in k}
        return {
            "phases": phases,
            "phase_parts": parts,
            "cpu_phases": cpu,
            "calls": dict(self.calls),
            "generated_tokens": int(self.generated_tokens),
            "generated_sequences": int(self.generated_sequences),
        }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB: VmHWM of /proc/self/status on Linux, else ru_maxrss.

    Not ru_maxrss on Linux: the kernel carries the parent's peak over fork and exec into it, so a runner started by
    a harness that had grown to 850 MB (building the assets in-process) reported 848 MB whatever it used. VmHWM is
    the peak of this program's own address space."""
    import resource
    import sys

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024
