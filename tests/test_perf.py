"""perf: FLOPs per token counted by hand from tiny configs, the peak table and its override, mfu's edge cases."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlhfkit import perf

H, FF, V, HEADS, KV = 32, 64, 100, 4, 2  # hidden, intermediate, vocabulary, heads, key/value heads
D = H // HEADS  # head_dim


def tiny(config_cls, model_cls, layers=1, tied=False, **extra):
    config = config_cls(
        hidden_size=H,
        intermediate_size=FF,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        vocab_size=V,
        tie_word_embeddings=tied,
        **extra,
    )
    torch.manual_seed(0)
    return model_cls(config)


def llama_weights(layers=1):
    """By hand: per layer q, k, v, o, gate, up, down; then the LM head (embedding lookups are not counted)."""
    q, k, v, o = H * HEADS * D, H * KV * D, H * KV * D, HEADS * D * H
    gate, up, down = H * FF, H * FF, FF * H
    return layers * (q + k + v + o + gate + up + down) + H * V


@pytest.mark.parametrize("config_cls,model_cls", [(LlamaConfig, LlamaForCausalLM), (Qwen2Config, Qwen2ForCausalLM)])
@pytest.mark.parametrize("layers", [1, 2])
def test_flops_by_hand(config_cls, model_cls, layers):
    model = tiny(config_cls, model_cls, layers=layers)
    assert llama_weights(1) == 4 * 1024 + 3 * 2048 + 3200 - 2 * 512  # the arithmetic itself: q,o 1024; k,v 512
    for context in (0.0, 1.0, 7.5):
        expected = 2 * llama_weights(layers) + 4 * layers * HEADS * D * context
        assert perf.forward_flops_per_token(model, context) == expected


def test_explicit_head_dim():
    """A config whose head_dim is not hidden_size // heads (Qwen3, Gemma): q/o and the attention term use it."""
    model = tiny(LlamaConfig, LlamaForCausalLM, head_dim=16)
    q, k, v, o = H * HEADS * 16, H * KV * 16, H * KV * 16, HEADS * 16 * H
    weights = q + k + v + o + 3 * H * FF + H * V
    assert perf.forward_flops_per_token(model, 3.0) == 2 * weights + 4 * 1 * HEADS * 16 * 3.0


def test_tied_head_counts_like_untied():
    """Tying shares the LM head's weight with the embedding; the head's matmul still runs once per token."""
    tied, untied = tiny(LlamaConfig, LlamaForCausalLM, tied=True), tiny(LlamaConfig, LlamaForCausalLM)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in untied.parameters()) - H * V
    assert perf.forward_flops_per_token(tied, 2.0) == perf.forward_flops_per_token(untied, 2.0)
    assert perf.forward_flops_per_token(tied, 0.0) == 2 * llama_weights()


def test_gpt2_conv1d():
    """GPT-2's projections are transformers' Conv1D (weight [nx, nf]); its LM head is tied."""
    config = GPT2Config(n_embd=H, n_layer=2, n_head=HEADS, vocab_size=V, n_positions=64)
    model = GPT2LMHeadModel(config)
    per_layer = H * 3 * H + H * H + H * 4 * H + 4 * H * H  # c_attn, attn c_proj, c_fc, mlp c_proj
    assert perf.forward_flops_per_token(model, 5.0) == 2 * (2 * per_layer + H * V) + 4 * 2 * HEADS * D * 5.0


def test_peft_lora_and_wrappers():
    """Through a peft LoRA model (adapters A: r x in, B: out x r count as the matmuls they are) and module wrappers."""
    peft = pytest.importorskip("peft")
    base = tiny(LlamaConfig, LlamaForCausalLM)
    plain = perf.forward_flops_per_token(base, 4.0)
    r = 4
    lora = peft.get_peft_model(base, peft.LoraConfig(r=r, target_modules=["q_proj", "v_proj"], lora_alpha=8))
    adapters = (H * r + r * HEADS * D) + (H * r + r * KV * D)
    assert perf.forward_flops_per_token(lora, 4.0) == plain + 2 * adapters

    class Wrapper(torch.nn.Module):  # what DDP and DeepSpeed's engine look like: the model under .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert perf.forward_flops_per_token(Wrapper(Wrapper(lora)), 4.0) == plain + 2 * adapters


def test_sharded_weights_count_in_full():
    """ZeRO-3 leaves a Linear's weight as an empty placeholder; the module's declared shape still counts in full."""
    model = tiny(LlamaConfig, LlamaForCausalLM)
    expected = perf.forward_flops_per_token(model, 1.0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(torch.empty(0))
    assert perf.forward_flops_per_token(model, 1.0) == expected


def test_no_config_no_attention_term():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 10))
    assert perf.forward_flops_per_token(model, 100.0) == 2 * (4 * 3 + 3 * 10)


@pytest.fixture
def gpu(monkeypatch):
    """Pretend a CUDA device of the given name is there."""
    monkeypatch.delenv(perf.PEAK_TFLOPS_ENV, raising=False)

    def named(name):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return torch.device("cuda", 0)

    return named


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA B200", 2.25e15),
        ("NVIDIA L40", None),  # not an L4
        ("NVIDIA GH200 480GB", None),  # not an H200
        ("Tesla T4", None),
    ],
)
def test_peak_table(gpu, name, peak):
    device = gpu(name)
    assert perf.device_peak_flops(device, torch.bfloat16) == peak
    assert perf.device_peak_flops(device, torch.float16) == peak
    assert perf.device_peak_flops(device, torch.float32) is None  # the tensor-core peak does not apply


def test_peak_cpu_and_override(monkeypatch):
    monkeypatch.delenv(perf.PEAK_TFLOPS_ENV, raising=False)
    cpu = torch.device("cpu")
    assert perf.device_peak_flops(cpu, torch.bfloat16) is None
    assert perf.device_peak_flops(cpu, torch.float32) is None
    monkeypatch.setenv(perf.PEAK_TFLOPS_ENV, "1.5")
    assert perf.device_peak_flops(cpu, torch.float32) == 1.5e12
    assert perf.device_peak_flops(torch.device("cuda", 0), torch.bfloat16) == 1.5e12
    for bad in ("fast", "0", "-3", "inf", "nan"):
        monkeypatch.setenv(perf.PEAK_TFLOPS_ENV, bad)
        with pytest.raises(ValueError, match=perf.PEAK_TFLOPS_ENV):
            perf.device_peak_flops(cpu, torch.bfloat16)


def test_mfu():
    assert perf.mfu(6e12, 2.0, 1e13) == pytest.approx(0.3)
    assert perf.mfu(6e12, 2.0, None) is None
    assert perf.mfu(6e12, 0.0, 1e13) is None
    assert perf.mfu(6e12, -1.0, 1e13) is None


def test_a_module_holding_two_models_counts_both():
    """PPO's policy and value model behind one forward: both models' matmuls and attention (each config once, though
    a CausalLM's inner model shares it)."""
    policy = tiny(LlamaConfig, LlamaForCausalLM, layers=2)
    value = tiny(LlamaConfig, LlamaForCausalLM, layers=1)
    both = torch.nn.ModuleDict({"policy": policy, "value_model": value})
    both.config = policy.config  # as PolicyAndValue borrows the policy's (DeepSpeed reads it)
    for context in (0.0, 6.0):
        expected = perf.forward_flops_per_token(policy, context) + perf.forward_flops_per_token(value, context)
        assert perf.forward_flops_per_token(both, context) == expected
    assert perf.forward_flops_per_token(both, 1.0) - perf.forward_flops_per_token(both, 0.0) == 4 * 3 * HEADS * D


def test_phase_memory_settings(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv(perf.PHASE_MEMORY_ENV, raising=False)
    assert perf.phase_memory_enabled(cuda) and not perf.phase_memory_enabled(cpu)  # a CPU's peak RSS is left alone
    monkeypatch.setenv(perf.PHASE_MEMORY_ENV, "0")
    assert not perf.phase_memory_enabled(cuda) and not perf.phase_memory_enabled(cpu)
    monkeypatch.setenv(perf.PHASE_MEMORY_ENV, "1")
    assert perf.phase_memory_enabled(cuda)
    assert perf.phase_memory_enabled(cpu) == os.path.exists("/proc/self/clear_refs")
    assert not perf.phase_memory_enabled(torch.device("meta"))
    monkeypatch.setenv(perf.PHASE_MEMORY_ENV, "yes")
    with pytest.raises(ValueError, match=perf.PHASE_MEMORY_ENV):
        perf.phase_memory_enabled(cpu)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux's per-process peak RSS")
def test_cpu_peak_memory_is_the_phase_peak():
    """After a reset the peak is about the current RSS; a 200 MB tensor allocated and freed in the phase raises it by
    about 200 MB, and the next reset forgets it."""
    cpu = torch.device("cpu")
    assert perf.reset_peak_memory(cpu)
    before = perf.peak_memory_bytes(cpu)
    x = torch.ones(50_000_000)  # 200 MB, written so that its pages are resident
    del x
    during = perf.peak_memory_bytes(cpu)
    assert during - before > 150e6
    assert perf.reset_peak_memory(cpu)
    assert perf.peak_memory_bytes(cpu) < during - 150e6


def test_large_blocks_are_mapped_once_per_process_unless_the_user_set_the_threshold(monkeypatch):
    """perf.map_large_blocks: mallopt(M_MMAP_THRESHOLD, 1 MB) under glibc, once; not over the user's own setting."""
    import ctypes

    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    perf.map_large_blocks.cache_clear()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert perf.map_large_blocks() is False and calls == []
    perf.map_large_blocks.cache_clear()
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert perf.map_large_blocks() is True and perf.map_large_blocks() is True
    assert calls == [(-3, 1 << 20)]
    perf.map_large_blocks.cache_clear()


def test_trim_cpu_heap_defaults_on_from_a_large_vocabulary_and_a_setting_wins():
    # None: on where the logits rows of a decoding step would pile up in the heap (32,768 tokens or more)
    assert not perf.wants_lean_heap(None, 49) and not perf.wants_lean_heap(None, 32_767)
    assert perf.wants_lean_heap(None, 32_768) and perf.wants_lean_heap(None, 151_936)
    assert perf.wants_lean_heap(True, 49) and not perf.wants_lean_heap(False, 151_936)
