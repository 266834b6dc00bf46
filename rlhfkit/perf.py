"""Model FLOPs utilisation (MFU): the FLOPs a model's forward costs per token, the device's peak, and their ratio.

MFU is the share of the device's peak FLOP/s that the model's own arithmetic uses (PaLM, Chowdhery et al. 2022,
appendix B): the FLOPs a forward and backward need by the model's shapes, divided by the seconds they took and the
peak. Work the implementation adds on top (activation recomputation under gradient checkpointing, the chunked LM
head's second pass in backward) is not counted, so MFU compares implementations on the same model honestly; a
hardware-FLOPs utilisation would count it.

Per token of a dense decoder (N = weights of the matrix multiplies, L layers, H heads of width d, c keys attended):

    forward  = 2 N + 4 L H d c        (one multiply-add per weight; QK^T and AV each 2 H d c per layer)
    backward = 2 x forward            (gradients of the inputs and of the weights)

Peak memory per phase (the last functions): torch's CUDA allocator peak, or on Linux CPUs the process's peak resident
set size, each reset at a phase's start.

Torch only.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys

import torch
from torch import nn

PEAK_TFLOPS_ENV = "RLHFKIT_PEAK_TFLOPS"
PHASE_MEMORY_ENV = "RLHFKIT_PHASE_MEMORY"

# Dense (no 2:4 sparsity) bf16/fp16 tensor-core peak, FLOP/s, from NVIDIA's datasheets (the datasheets print the
# sparse figure with a footnote; these are half of it): H100/H200 "Tensor Core GPU" datasheets (SXM 1,979 / PCIe
# 1,513 / NVL 1,671 TFLOPS sparse), A100 datasheet (312 dense), L40S datasheet (733 sparse), L4 datasheet (242
# sparse), DGX/HGX B200 datasheet (4.5 PFLOPS sparse per GPU). First match wins, so the more specific names come first;
# word boundaries keep "L4" from matching an L40 and "H200" from matching a GH200.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH200\b", 989e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b.*\bPCIe\b", 756e12),
    (r"\bH100\b", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bA100\b", 312e12),  # SXM and PCIe alike
    (r"\bL40S\b", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bB200\b", 2.25e15),
)
HALF_DTYPES = (torch.bfloat16, torch.float16)


def forward_flops_per_token(model: nn.Module, context: float) -> float:
    """FLOPs of one token's forward through `model` when it attends to `context` keys.

    = 2 x (weights of every matrix multiply: each nn.Linear and transformers' Conv1D, the LM head included even when
    its weight is the input embedding's; an embedding lookup is not a multiply; LoRA's A and B are Linears and count)
    + 4 x layers x heads x head_dim x context (QK^T and AV). For a causal sequence of T tokens, the mean context is
    (T + 1) / 2. Layers, heads and head_dim come from the ``config`` of each transformers model inside `model` (its
    text config; head_dim defaults to hidden_size // num_attention_heads), so a module holding two models (PPO's
    policy and value model) counts both; a model without one gets no attention term. Sliding windows and mixtures
    of experts (expert weights kept as batched parameters, of which a token uses top-k) are not modelled.

    Looks through peft, DDP, DeepSpeed, FSDP and torch.compile wrappers (they hold the model as a submodule). A
    weight is counted by its module's declared shape (in_features x out_features; Conv1D's nx x nf), which DeepSpeed
    ZeRO-3 and FSDP2 sharding and bitsandbytes packing leave intact, so the count is the full model's on every
    process, before or after sharding.
    """
    conv1d = getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)
    weights = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weights += module.in_features * module.out_features
        elif conv1d is not None and isinstance(module, conv1d):
            weights += module.nx * module.nf
    attention = sum(_attention_width(config) for config in _configs(model))
    return 2.0 * weights + 4.0 * attention * context


def _attention_width(config) -> int:
    """layers x heads x head_dim of a transformers config (0 when it names no attention)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return 0
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers * heads * head_dim


def _configs(module: nn.Module) -> list:
    """The configs of the outermost transformers models in `module` (each model once: a CausalLM's inner base
    model shares its config), or `module`'s own config when it holds none (a custom module)."""
    pretrained = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    found: list = []

    def visit(m: nn.Module) -> None:
        if pretrained is not None and isinstance(m, pretrained):
            found.append(m.config)
            return
        for child in m.children():
            visit(child)

    visit(module)
    if not found and getattr(module, "config", None) is not None:
        found.append(module.config)
    return found


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's dense peak FLOP/s for matrix multiplies in `dtype`, or None when unknown.

    Known: NVIDIA GPUs of PEAK_FLOPS (by torch.cuda.get_device_name) computing in bfloat16 or float16. None on CPUs,
    on other cards and for a float32 compute dtype: float32 runs on TF32 tensor cores or plain CUDA cores depending
    on torch's matmul precision setting, each with another peak, and dividing by the half-precision tensor-core peak
    would understate the utilisation by a factor of 2 to 30. The environment variable RLHFKIT_PEAK_TFLOPS (TFLOP/s,
    e.g. 989) overrides all of it, for any device and dtype: set it for another card or your own convention.
    """
    override = os.environ.get(PEAK_TFLOPS_ENV, "").strip()
    if override:
        try:
            tflops = float(override)
        except ValueError:
            tflops = float("nan")
        if not tflops > 0 or tflops == float("inf"):
            raise ValueError(f"{PEAK_TFLOPS_ENV}={override!r}: give the device's peak as a positive number of TFLOP/s")
        return tflops * 1e12
    device = torch.device(device)
    if device.type != "cuda" or dtype not in HALF_DTYPES or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for pattern, peak in PEAK_FLOPS:
        if re.search(pattern, name, re.IGNORECASE):
            return peak
    return None


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: flops / (seconds x peak), or None when the peak is unknown or no time passed.

    peak: the FLOP/s of all the devices that did the work (one device's peak x their number)."""
    if peak is None or seconds <= 0:
        return None
    return flops / (seconds * peak)


# ----------------------------------------------------------------------------------------------------------------
# Peak memory per phase
# ----------------------------------------------------------------------------------------------------------------


def phase_memory_enabled(device: torch.device) -> bool:
    """Whether each phase's peak memory is measured on `device` (RLHFKIT_PHASE_MEMORY: unset, 0 or 1).

    Measuring resets a peak counter at every phase's start, so afterwards that counter holds only the last phase's
    peak. On CUDA that is torch's allocator counter, read by torch.cuda.max_memory_allocated: measured unless
    RLHFKIT_PHASE_MEMORY=0 (a run's overall peak is then the largest logged phase peak). On a CPU it is the kernel's
    peak resident set size of the process, which is also what ``/usr/bin/time``, ``getrusage`` and a parent's
    ``wait4`` report as the process's maximum RSS: resetting it would make every such external measurement show the
    last phase's peak only, so on CPUs it is measured only with RLHFKIT_PHASE_MEMORY=1 (and only on Linux, where
    /proc/self/clear_refs resets it). Other devices: never.
    """
    setting = os.environ.get(PHASE_MEMORY_ENV, "").strip()
    if setting not in ("", "0", "1"):
        raise ValueError(
            f"{PHASE_MEMORY_ENV}={setting!r}: 1 (measure each phase's peak memory, CPUs too) or 0 (never)"
        )
    device = torch.device(device)
    if setting == "0":
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and setting == "1" and os.path.exists(_CLEAR_REFS)


_CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak on `device` (CUDA: torch.cuda.reset_peak_memory_stats; CPU: writes 5 to
    /proc/self/clear_refs, which sets the process's VmHWM to its current RSS). False when it cannot be reset
    (no permission, not Linux): then peak_memory_bytes would not be this phase's."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_memory_bytes(device: torch.device) -> int | None:
    """The peak since the last reset_peak_memory, in bytes: on CUDA the tensors torch allocated
    (torch.cuda.max_memory_allocated; the allocator's cache and the CUDA context are not in it), on a CPU the
    process's peak resident set size (VmHWM of /proc/self/status: every allocation, Python's and the libraries'
    too). None when it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


_LEAN_HEAP = False  # --trim_cpu_heap, set for the process by lean_heap()
LARGE_VOCABULARY = 32_768  # --trim_cpu_heap's default turns on from this many tokens


def wants_lean_heap(setting: bool | None, vocabulary: int) -> bool:
    """--trim_cpu_heap's value for a policy of `vocabulary` tokens: the setting when given, else whether the
    vocabulary is large (LARGE_VOCABULARY), where the decoding loop's logits rows ([batch, vocabulary] floats, 4.9
    MB at 8 x 151,936) pile up in glibc's heap: a GRPO step at 8 x 512 peaks at 4.20 GB without the setting against
    3.58 GB with it. Below, the setting buys nothing and costs 15-30% of a run's time (bench/README.md)."""
    return setting if setting is not None else vocabulary >= LARGE_VOCABULARY


def lean_heap() -> None:
    """--trim_cpu_heap on a CPU, for this process: large blocks mapped on their own (map_large_blocks) and the freed
    heap given back after sampling and before each optimizer step (return_freed_heap, a no-op until this is called)."""
    global _LEAN_HEAP
    _LEAN_HEAP = True
    map_large_blocks()


def heap_is_lean() -> bool:
    """Whether lean_heap() was called in this process (the generation worker of async_generation follows its
    trainer)."""
    return _LEAN_HEAP


def return_freed_heap() -> None:
    """Give the C heap's freed memory back to the system (glibc's malloc_trim; nothing elsewhere), with
    --trim_cpu_heap (lean_heap). Called on CPUs after sampling and before each optimizer step.

    glibc serves allocations below its mmap threshold from its heap and keeps what they free for the process; the
    threshold rises (up to 32 MB) each time a larger mmap'd block is freed, so a step's many mid-sized tensors (the
    decoding loop's logits rows and growing caches, the backward's activation gradients) end up there. At Qwen's
    151,936 tokens and 8 completions of 512 tokens, sampling left ~0.9 GB resident and the backward ~0.75 GB, which
    the next phase's large (mmap'd) tensors could not reuse and which counted in the step's peak (bench/README.md,
    "Real shapes (CPU)")."""
    if not _LEAN_HEAP:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _glibc(name: str):
    """A glibc function from the symbols the process has loaded, or None (another C library)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def _malloc_trim():
    return _glibc("malloc_trim")


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
LARGE_BLOCK_BYTES = 1 << 20


@functools.cache
def map_large_blocks() -> bool:
    """Have glibc serve every allocation of 1 MB or more with its own mmap, given back when freed (mallopt's
    M_MMAP_THRESHOLD, which also stops the threshold's dynamic rise); once per process, on CPUs, when a trainer is
    built with --trim_cpu_heap (lean_heap). Returns whether it was set: not under another C library, nor when the
    user set MALLOC_MMAP_THRESHOLD_.

    Without it the decoding loop's per-step tensors (an [8, 151,936] logits row is 4.9 MB) come from the heap once
    the threshold has risen past them, and the heap grows with every step: +1.26 GB while sampling 8 x 512 tokens
    at Qwen's vocabulary, +2.5 GB at 8 x 1024, a peak that grows with the completion length (bench/README.md, "Real
    shapes (CPU)"). Mapping a block costs its page faults every time it is allocated: every activation and gradient
    of 1 MB or more becomes a fresh mapping each step, which is what makes the setting cost 15-30% of a run."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
