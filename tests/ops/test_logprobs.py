import math

import pytest
import torch
from torch.testing import assert_close

from rlhfkit import ops


def reference_logprob(logits_row, token, temperature):
    """log softmax(z / temperature)[token] for one position, in Python floats."""
    z = [v / temperature for v in logits_row]
    top = max(z)
    return z[token] - (top + math.log(math.fsum(math.exp(v - top) for v in z)))


def reference_entropy(logits_row, temperature):
    """-sum p log p for one position, in Python floats."""
    z = [v / temperature for v in logits_row]
    top = max(z)
    log_norm = top + math.log(math.fsum(math.exp(v - top) for v in z))
    return -math.fsum(math.exp(v - log_norm) * (v - log_norm) for v in z)


def random_logits(B=3, T=4, V=11, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    return logits, tokens


# ---- hand-computed cases ----


def test_logprobs_hand_computed():
    # logits [0, ln 3]: softmax = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=torch.float64)
    tokens = torch.tensor([[1, 0]])
    assert_close(ops.logprobs_from_logits(logits, tokens), torch.tensor([[math.log(0.75), math.log(0.25)]]).double())
    # temperature 2: z = [0, ln 3 / 2] = [0, ln sqrt3]: softmax = [1, sqrt3] / (1 + sqrt3)
    s3 = math.sqrt(3.0)
    expected = torch.tensor([[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]], dtype=torch.float64)
    assert_close(ops.logprobs_from_logits(logits, tokens, temperature=2.0), expected)


def test_entropy_hand_computed():
    # uniform over V = 5: entropy ln 5; [0, ln 3]: -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - (3/4) ln 3
    logits = torch.tensor([[[0.7] * 5, [0.0, math.log(3.0), -math.inf, -math.inf, -math.inf]]], dtype=torch.float64)
    expected = torch.tensor([[math.log(5.0), math.log(4.0) - 0.75 * math.log(3.0)]], dtype=torch.float64)
    assert_close(ops.entropy_from_logits(logits), expected)
    # a one-hot distribution has entropy exactly 0
    one_hot = torch.tensor([[[1e4, -1e4, -1e4]]])
    assert ops.entropy_from_logits(one_hot).item() == 0.0


# ---- against float64 loop references ----


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_logprobs_match_reference_loop(temperature):
    logits, tokens = random_logits(seed=1)
    expected = torch.tensor(
        [
            [reference_logprob(logits[b, t].tolist(), tokens[b, t].item(), temperature) for t in range(4)]
            for b in range(3)
        ],
        dtype=torch.float64,
    )
    assert_close(ops.logprobs_from_logits(logits, tokens, temperature), expected)
    # float32 input stays float32 and agrees to float32 precision
    out32 = ops.logprobs_from_logits(logits.float(), tokens, temperature)
    assert out32.dtype == torch.float32
    assert_close(out32, expected.float())


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_entropy_matches_reference_loop(temperature):
    logits, _ = random_logits(seed=2)
    expected = torch.tensor(
        [[reference_entropy(logits[b, t].tolist(), temperature) for t in range(4)] for b in range(3)],
        dtype=torch.float64,
    )
    assert_close(ops.entropy_from_logits(logits, temperature), expected)
    assert_close(ops.entropy_from_logits(logits.float(), temperature), expected.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_give_float32_logprobs(dtype):
    logits, tokens = random_logits(seed=3)
    half = logits.to(dtype)
    # reference from the same (rounded) half-precision numbers, computed in float64
    rounded = half.double()
    expected = torch.tensor(
        [[reference_logprob(rounded[b, t].tolist(), tokens[b, t].item(), 1.0) for t in range(4)] for b in range(3)],
        dtype=torch.float64,
    )
    out = ops.logprobs_from_logits(half, tokens)
    assert out.dtype == torch.float32
    assert_close(out, expected.float())
    entropy = ops.entropy_from_logits(half)
    assert entropy.dtype == torch.float32
    assert_close(entropy, ops.entropy_from_logits(rounded).float())


def test_logprobs_gradient_matches_finite_differences():
    logits, tokens = random_logits(B=2, T=3, V=5, seed=4)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: ops.logprobs_from_logits(z, tokens, temperature=0.8), (logits,))
    assert torch.autograd.gradcheck(lambda z: ops.entropy_from_logits(z, temperature=0.8), (logits,))


# ---- invariances ----


def test_logprobs_normalise_over_vocabulary():
    # exp(log p) summed over every token of the vocabulary is 1 at every position
    logits, _ = random_logits(B=2, T=3, V=7, seed=5, scale=10.0)
    every_token = [ops.logprobs_from_logits(logits, torch.full((2, 3), v), temperature=0.9) for v in range(7)]
    assert_close(torch.stack(every_token).exp().sum(0), torch.ones(2, 3, dtype=torch.float64))


def test_shift_invariance_and_temperature_is_division():
    logits, tokens = random_logits(seed=6)
    shift = 1e3 * torch.randn(3, 4, 1, dtype=torch.float64)
    assert_close(ops.logprobs_from_logits(logits + shift, tokens), ops.logprobs_from_logits(logits, tokens))
    assert_close(ops.entropy_from_logits(logits + shift), ops.entropy_from_logits(logits))
    assert_close(ops.logprobs_from_logits(logits, tokens, 0.5), ops.logprobs_from_logits(2.0 * logits, tokens))
    assert_close(ops.entropy_from_logits(logits, 0.5), ops.entropy_from_logits(2.0 * logits))


def test_banned_tokens_with_minus_inf_logits():
    logits, tokens = random_logits(B=2, T=3, V=6, seed=7)
    banned = logits.clone()
    banned[..., 4:] = -math.inf
    tokens = tokens % 4
    # same as a vocabulary without the banned tokens
    assert_close(ops.entropy_from_logits(banned), ops.entropy_from_logits(logits[..., :4]))
    assert_close(ops.logprobs_from_logits(banned, tokens), ops.logprobs_from_logits(logits[..., :4], tokens))


def test_rejects_non_positive_temperature():
    logits, tokens = random_logits()
    with pytest.raises(ValueError, match="temperature"):
        ops.logprobs_from_logits(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        ops.entropy_from_logits(logits, temperature=-1.0)


def test_row_chunking_does_not_change_results(monkeypatch):
    """One row per chunk (the large-vocabulary path) and the whole batch in one chunk give the same numbers."""
    from rlhfkit.ops import logprobs as module

    torch.manual_seed(0)
    logits = torch.randn(5, 4, 11, dtype=torch.float64)
    tokens = torch.randint(11, (5, 4))
    whole = (ops.logprobs_from_logits(logits, tokens, 0.7), ops.entropy_from_logits(logits, 0.7))
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 1)
    assert len(module._row_chunks(logits)) == 5
    row_by_row = (ops.logprobs_from_logits(logits, tokens, 0.7), ops.entropy_from_logits(logits, 0.7))
    for a, b in zip(whole, row_by_row):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ---- logprobs_from_hidden: the LM head in chunks of positions ----


def head_case(seed=0, B=3, T=5, H=6, V=13):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(H, V, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g, dtype=torch.float64))
        head.bias.copy_(torch.randn(V, generator=g, dtype=torch.float64))
    tokens = torch.randint(0, V, (B, T), generator=g)
    return hidden, head, tokens


def loop_reference(hidden, head, tokens, temperature):
    """Log-probs and entropies position by position: each position's logits from the head, then the Python-float
    references above."""
    logprobs, entropies = (
        torch.zeros(tokens.shape, dtype=torch.float64),
        torch.zeros(tokens.shape, dtype=torch.float64),
    )
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            row = head(hidden[b, t]).tolist()
            logprobs[b, t] = reference_logprob(row, int(tokens[b, t]), temperature)
            entropies[b, t] = reference_entropy(row, temperature)
    return logprobs, entropies


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 2, 1000], ids=["one position", "two positions", "one chunk"])
def test_logprobs_from_hidden_match_the_loop_reference(monkeypatch, temperature, chunk):
    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", chunk * 13)
    hidden, head, tokens = head_case()
    logprobs, entropy = ops.logprobs_from_hidden(hidden, head, tokens, temperature, entropy=True, vocab_size=13)
    expected_logprobs, expected_entropy = loop_reference(hidden.detach(), head, tokens, temperature)
    assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-12)
    assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    assert not entropy.requires_grad  # detached unless entropy_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_from_hidden_gradients_equal_the_full_logits_path(monkeypatch, temperature):
    """Gradients of a loss of log-probs and entropies with respect to the hidden states and the head's weight and
    bias, through the chunks' recomputation, equal those through the full (B, T, V) logits (float64)."""
    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", 2 * 13)  # 8 chunks for 15 positions
    hidden, head, tokens = head_case(seed=1)
    weights = torch.randn(tokens.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def grads(logprobs, entropy):
        loss = (weights * logprobs).sum() - 0.3 * entropy.sum()
        return torch.autograd.grad(loss, [hidden, head.weight, head.bias])

    chunked = grads(*ops.logprobs_from_hidden(hidden, head, tokens, temperature, True, True, vocab_size=13))
    logits = head(hidden)
    full = grads(ops.logprobs_from_logits(logits, tokens, temperature), ops.entropy_from_logits(logits, temperature))
    for a, b in zip(chunked, full):
        assert_close(a, b, rtol=0, atol=1e-12)


def test_logprobs_from_hidden_gradient_matches_finite_differences():
    hidden, head, tokens = head_case(seed=3, B=2, T=2, H=3, V=5)
    torch.autograd.gradcheck(
        lambda h: sum(ops.logprobs_from_hidden(h, head, tokens, 0.7, True, True, vocab_size=5)), (hidden,)
    )


def test_logprobs_from_hidden_keep_no_logits_for_the_backward(monkeypatch):
    """Autograd saves the chunks' inputs, never their logits: nothing it keeps for the backward is as large as one
    chunk's logits, let alone the batch's (which the full path keeps)."""
    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", 4 * 13)
    hidden, head, tokens = head_case(seed=4, B=4, T=8, H=6, V=13)
    saved = []

    def keep(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logprobs, entropy = ops.logprobs_from_hidden(hidden, head, tokens, 0.7, True, True, vocab_size=13)
    assert max(saved) < 4 * 13  # the hidden states (4 x 8 x 6 = 192) are saved as chunk views of 4 x 6
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        ops.logprobs_from_logits(head(hidden), tokens, 0.7)
    assert max(saved) >= 4 * 8 * 13  # the full path keeps the (B, T, V) logits


def test_logprobs_from_hidden_without_grad_and_empty():
    hidden, head, tokens = head_case(seed=5)
    with torch.no_grad():
        logprobs, entropy = ops.logprobs_from_hidden(hidden, head, tokens, 1.0, vocab_size=13)
    assert entropy is None and not logprobs.requires_grad
    assert_close(logprobs, ops.logprobs_from_logits(head(hidden), tokens).detach(), rtol=0, atol=1e-12)
    empty, none = ops.logprobs_from_hidden(hidden[:, :0], head, tokens[:, :0], entropy=True, vocab_size=13)
    assert empty.shape == none.shape == (3, 0)


# ---- logprobs_from_linear: a plain linear head, its gradients written by hand ----


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 2, 1000], ids=["one position", "two positions", "one chunk"])
def test_logprobs_from_linear_match_the_loop_reference_and_the_full_paths_gradients(monkeypatch, temperature, chunk):
    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", chunk * 13)
    hidden, head, tokens = head_case(seed=6)
    weights = torch.randn(tokens.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    got = ops.logprobs_from_linear(hidden, head.weight, head.bias, tokens, temperature, True, True)
    expected = loop_reference(hidden.detach(), head, tokens, temperature)
    assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    assert_close(got[1], expected[1], rtol=0, atol=1e-12)

    def grads(logprobs, entropy):
        loss = (weights * logprobs).sum() - 0.3 * entropy.sum()
        return torch.autograd.grad(loss, [hidden, head.weight, head.bias])

    logits = head(hidden)
    full = grads(ops.logprobs_from_logits(logits, tokens, temperature), ops.entropy_from_logits(logits, temperature))
    for a, b in zip(grads(*got), full):
        assert_close(a, b, rtol=0, atol=1e-12)


def test_logprobs_from_linear_gradient_matches_finite_differences():
    hidden, head, tokens = head_case(seed=8, B=2, T=2, H=3, V=5)
    torch.autograd.gradcheck(
        lambda h, w, b: sum(ops.logprobs_from_linear(h, w, b, tokens, 0.7, True, True)),
        (hidden, head.weight, head.bias),
    )


def test_logprobs_from_linear_without_entropy_grad_and_without_bias():
    hidden, head, tokens = head_case(seed=9)
    logprobs, entropy = ops.logprobs_from_linear(hidden, head.weight, None, tokens, 1.0, entropy=True)
    assert not entropy.requires_grad and logprobs.requires_grad
    expected = ops.logprobs_from_logits(torch.nn.functional.linear(hidden, head.weight), tokens)
    assert_close(logprobs, expected, rtol=0, atol=1e-12)
    (g,) = torch.autograd.grad(logprobs.sum(), hidden)
    (expected_g,) = torch.autograd.grad(expected.sum(), hidden)
    assert_close(g, expected_g, rtol=0, atol=1e-12)


def test_logprobs_from_linear_under_bf16_autocast_compute_as_the_head_does():
    """Under autocast the logits are bf16 products, as the model's own head computes them (forward and backward's
    recomputation); with float32_head (cast_lm_head_to_fp32) they are float32 products of the same inputs."""
    g = torch.Generator().manual_seed(10)
    hidden = torch.randn(2, 6, 16, generator=g, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, requires_grad=True)
    tokens = torch.randint(0, 40, (2, 6), generator=g)
    for float32_head in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, _ = ops.logprobs_from_linear(hidden, weight, None, tokens, 0.7, float32_head=float32_head)
            with torch.autocast("cpu", enabled=not float32_head):
                logits = hidden @ weight.T
        assert logits.dtype == (torch.float32 if float32_head else torch.bfloat16)
        expected = ops.logprobs_from_logits(logits, tokens, 0.7)
        assert_close(got, expected, rtol=0, atol=1e-5)
        grads = torch.autograd.grad(got.sum(), [hidden, weight])
        expected_grads = torch.autograd.grad(expected.sum(), [hidden, weight])
        for a, b in zip(grads, expected_grads):  # bf16 products on both sides; float32 accumulation here
            assert_close(a, b, rtol=0.02, atol=0.02 if not float32_head else 1e-5)


def test_logprobs_from_linear_allocate_one_weight_gradient_not_one_per_chunk(monkeypatch):
    """The point of the function: over 8 chunks, the backward creates the [V, H] weight gradient once; autograd
    through checkpointed chunks (logprobs_from_hidden) creates one per chunk."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlhfkit.ops import logprobs as module

    monkeypatch.setattr(module, "HIDDEN_CHUNK_ELEMENTS", 4 * 13)
    hidden, head, tokens = head_case(seed=11, B=4, T=8, H=6, V=13)
    weight_size = head.weight.numel()

    class CountWeightSized(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                new = isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs  # not a view
                if new and t.numel() == weight_size:  # nor an in-place update: a new [V, H] buffer
                    CountWeightSized.count += 1
            return out

    def weight_sized_in_backward(fn):
        loss = fn().sum()
        CountWeightSized.count = 0
        with CountWeightSized():
            loss.backward()
        return CountWeightSized.count

    linear = weight_sized_in_backward(lambda: ops.logprobs_from_linear(hidden, head.weight, head.bias, tokens, 0.7)[0])
    checkpointed = weight_sized_in_backward(
        lambda: ops.logprobs_from_hidden(hidden, head, tokens, 0.7, vocab_size=13)[0]
    )
    assert linear == 1  # the accumulator
    assert checkpointed >= 8  # one weight gradient per chunk (8 chunks of 4 positions)
