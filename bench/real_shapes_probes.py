"""The isolated reproductions behind bench/README.md's "What holds rlhfkit's extra memory" (real vocabulary, CPU).

    .venv/bin/python bench/real_shapes_probes.py sampler-heap --tokens 512     # RSS left by rlhfkit's decoding loop
    .venv/bin/python bench/real_shapes_probes.py logprobs-backward --tokens 256 # backward peak of the log-probs
    .venv/bin/python bench/real_shapes_probes.py temperature-copy --tokens 64  # what autograd saves at T != 1

Each prints what it measured; the phase peaks come from the kernel's high-water mark, reset before each phase
(bench/runners/phase_memory.py). ``sampler-heap`` needs the Qwen2.5-0.5B shape's assets (bench/real_shapes.py builds
them). ``--rlhfkit-src`` is not needed: put the checkout to measure first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR / "runners"))
sys.path.insert(0, str(BENCH_DIR))

from phase_memory import hwm_mb, reset_hwm, rss_mb  # noqa: E402

V = 151936


def gb(mib: float) -> float:
    return mib * 2**20 / 1e9


def phase(name: str, fn):
    base = rss_mb()
    reset_hwm()
    out = fn()
    peak = hwm_mb()
    print(
        f"{name:44s} RSS {gb(base):.2f} -> peak {gb(peak):.2f} GB (+{gb(peak - base):.2f}), after {gb(rss_mb()):.2f}"
    )
    return out


def sampler_heap(tokens: int) -> None:
    """RSS after rlhfkit's decoding loop samples 8 x `tokens` from one prompt, then after malloc_trim(0): what stays
    is freed heap the allocator kept, not tensors. Compare with MALLOC_MMAP_THRESHOLD_=1048576 in the environment."""
    import torch
    from real_shapes_assets import build
    from transformers import AutoModelForCausalLM

    from rlhfkit.sampling import sampling_config
    from rlhfkit.sampling.completions import generate

    model = AutoModelForCausalLM.from_pretrained(build("qwen2.5-0.5b", 1)["paths"]["policy"], dtype=torch.float32)
    for p in model.parameters():
        p.data.sum()  # read the mapped weights now, so that they do not count as the loop's
    model.eval()
    config = sampling_config(tokens, 1.0, V + 1, [V], 1.0, 0)
    ids = torch.randint(0, V, (1, 16)).repeat(8, 1)
    before = rss_mb()
    out = phase(f"rlhfkit sampling 8 x {tokens}", lambda: generate(model, ids, torch.ones_like(ids).bool(), config))
    assert out.tokens.shape == (8, tokens)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(f"RSS left by the loop: {gb(rss_mb() - before):+.2f} GB after malloc_trim(0)")


def logprobs_backward(tokens: int) -> None:
    """Backward peak of ops.logprobs_from_logits on a (8, tokens, V) leaf, against one gather - logsumexp."""
    import torch

    from rlhfkit import ops

    logits = torch.randn(8, tokens, V, requires_grad=True)
    targets = torch.randint(0, V, (8, tokens))
    print(f"(8, {tokens}, V) float32 = {logits.numel() * 4 / 1e9:.2f} GB")

    def whole():
        return logits.gather(-1, targets[..., None])[..., 0] - logits.logsumexp(-1)

    for name, fn in (("rlhfkit ops.logprobs_from_logits", lambda: ops.logprobs_from_logits(logits, targets)),
                     ("gather - logsumexp, whole tensor", whole)):  # fmt: skip
        out = phase(f"{name}: forward", fn)
        phase(f"{name}: backward", out.sum().backward)
        logits.grad = None
        del out


def temperature_copy(tokens: int) -> None:
    """What autograd saves for ops.logprobs_from_logits at temperature 1.0 and 0.7, beyond the logits themselves."""
    import torch

    from rlhfkit import ops

    logits = torch.randn(8, tokens, V, requires_grad=True)
    targets = torch.randint(0, V, (8, tokens))
    own = logits.untyped_storage().data_ptr()
    for temperature in (1.0, 0.7):
        saved: dict = {}

        def pack(t, saved=saved):
            s = t.untyped_storage()
            saved[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ops.logprobs_from_logits(logits, targets, temperature)
        extra = sum(n for ptr, n in saved.items() if ptr != own and n > 2**20)
        print(f"temperature {temperature}: saved beyond the logits {extra / 1e9:.3f} GB "
              f"(the logits: {logits.numel() * 4 / 1e9:.3f} GB)")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["sampler-heap", "logprobs-backward", "temperature-copy"])
    p.add_argument("--tokens", type=int, default=None, help="completion length (defaults: 512, 256, 64)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    default = {"sampler-heap": 512, "logprobs-backward": 256, "temperature-copy": 64}[args.probe]
    fn = {"sampler-heap": sampler_heap, "logprobs-backward": logprobs_backward, "temperature-copy": temperature_copy}
    fn[args.probe](args.tokens or default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
